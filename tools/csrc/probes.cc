// Bandwidth probes for the benchmarks' ceilings (not part of the package's kernels): a parallel streaming read
// (a sum) and a 2-read-1-write add; the read is compiled for AVX-512, AVX2 and generic x86-64, chosen by name.
#include <omp.h>

#include <cstdint>
#include <string>

namespace {

typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

// Sum of x by a parallel streaming read, 8 streams per thread (enough to keep the hardware prefetchers busy:
// measured 25 GB/s here against 20 GB/s with one stream per thread).
template <typename vf>
double read_sum(const float *x, int64_t n) {
  constexpr int W = sizeof(vf) / sizeof(float), kStreams = 8;
  const int nt = omp_get_max_threads();
  const int64_t per = n / nt / kStreams / W * W;
  double total = 0.0;
#pragma omp parallel num_threads(nt) reduction(+ : total)
  {
    const float *base = x + omp_get_thread_num() * per * kStreams;
    vf acc[kStreams] = {};
    for (int64_t i = 0; i < per; i += W)
      for (int s = 0; s < kStreams; ++s) {
        vf v;
        __builtin_memcpy(&v, base + s * per + i, sizeof v);
        acc[s] += v;
      }
    for (const vf &a : acc)
      for (int j = 0; j < W; ++j) total += a[j];
  }
  for (int64_t i = per * kStreams * nt; i < n; ++i) total += x[i];
  return total;
}

__attribute__((target("avx512f"))) double read_avx512(const float *x, int64_t n) { return read_sum<v16>(x, n); }
__attribute__((target("avx2"))) double read_avx2(const float *x, int64_t n) { return read_sum<v8>(x, n); }
double read_generic(const float *x, int64_t n) { return read_sum<v4>(x, n); }

}  // namespace

extern "C" {

// -1.0 for an ISA this CPU lacks or an unknown name; "best" picks the best this CPU has.
double probe_read(const char *isa, const float *x, int64_t n) {
  __builtin_cpu_init();
  const std::string name(isa);
  const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
  if (name == "avx512" || (name == "best" && avx512)) return avx512 ? read_avx512(x, n) : -1.0;
  if (name == "avx2" || (name == "best" && avx2)) return avx2 ? read_avx2(x, n) : -1.0;
  if (name == "generic" || name == "best") return read_generic(x, n);
  return -1.0;
}

void probe_add(const float *a, const float *b, float *c, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
}

}  // extern "C"
