// The benchmarks' ceilings (not part of the package's kernels): a parallel streaming read (a sum) and a
// 2-read-1-write add, the read compiled for AVX-512, AVX2 and generic x86-64, chosen by name; and the physical
// compute peaks: float32 FMA (AVX-512) and bfloat16 AMX (TDPBF16PS), each from an in-register loop on every thread.
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
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

// float32 FLOP/s of AVX-512 FMAs on `threads` threads: 12 independent accumulators (latency 4 x 2 ports + slack).
__attribute__((target("avx512f"))) double probe_fma_peak(int threads, int64_t iterations) {
  if (!__builtin_cpu_supports("avx512f")) return -1.0;
  const auto t0 = std::chrono::steady_clock::now();
  float sink = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    __m512 acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int64_t it = 0; it < iterations; ++it)
      for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    for (int i = 0; i < 12; ++i) sink += _mm512_reduce_add_ps(acc[i]);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sink == 12345.0f ? 0.0 : double(threads) * iterations * 12 * 16 * 2 / s;
}

// bfloat16 FLOP/s of AMX TDPBF16PS on `threads` threads (6 accumulating tiles, 16x16 float32 each, fed by 16x32
// bfloat16 A and B tiles already in registers); -1 where the CPU or the kernel does not give AMX to this process.
__attribute__((target("amx-tile,amx-bf16"))) double probe_amx_peak(int threads, int64_t iterations) {
  if (!__builtin_cpu_supports("amx-bf16")) return -1.0;
  constexpr long kReqPerm = 0x1023, kXtileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA (Linux)
  int ok = 1;
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(min : ok)
  {
    if (syscall(SYS_arch_prctl, kReqPerm, kXtileData) != 0) {
      ok = 0;
    } else {
      alignas(64) unsigned char config[64] = {};
      config[0] = 1;  // palette 1: tiles 0-5 accumulate (16 rows x 64 bytes), 6-7 hold A and B
      for (int t = 0; t < 8; ++t) {
        config[16 + 2 * t] = 64;  // bytes per row
        config[48 + t] = 16;      // rows
      }
      _tile_loadconfig(config);
      alignas(64) uint16_t data[16 * 32];
      for (int i = 0; i < 16 * 32; ++i) data[i] = 0x3f80;  // 1.0
      _tile_loadd(6, data, 64);
      _tile_loadd(7, data, 64);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      _tile_zero(4);
      _tile_zero(5);
      for (int64_t it = 0; it < iterations; ++it) {
        _tile_dpbf16ps(0, 6, 7);
        _tile_dpbf16ps(1, 6, 7);
        _tile_dpbf16ps(2, 6, 7);
        _tile_dpbf16ps(3, 6, 7);
        _tile_dpbf16ps(4, 6, 7);
        _tile_dpbf16ps(5, 6, 7);
      }
      alignas(64) float out[16 * 16];
      _tile_stored(0, out, 64);
      _tile_release();
      ok = out[0] > 0.0f;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return ok ? double(threads) * iterations * 6 * (16 * 16 * 32 * 2) / s : -1.0;
}

void probe_add(const float *a, const float *b, float *c, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
}

}  // extern "C"
