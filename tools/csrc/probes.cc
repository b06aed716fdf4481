// The benchmarks' ceilings (not part of the package's kernels): a parallel streaming read (a sum) and a
// 2-read-1-write add, the read compiled for AVX-512, AVX2 and generic x86-64, chosen by name; and the physical
// compute peaks: float32 FMA (AVX-512, else AVX2), bfloat16 VDPBF16PS and AMX (TDPBF16PS), each from an in-register
// loop on every thread.
// Each call starts its threads and joins them before it returns: no thread of a probe outlives it (OpenMP's
// workers, which the probes used before, kept spinning after a parallel region and slowed the variant timed right
// after the read probe: int8 decode 17.8 ms after it against 13.9 ms after the bfloat16 MLP, interleaved).
// Each call also records whether its threads ran at the same time (probe_last_concurrency): a rate measured while a
// thread waited for a CPU is not the host's.
#include <immintrin.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

// The CPUs this process may run on.
int cpus() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
}

double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Of the calling thread's last on_threads call: the least, over its threads, of a thread's CPU time over the wall time
// from the call's start to that thread's end; below 1 where a thread waited for a CPU (another process, steal).
// To its own end, not the call's: a read's threads end their equal shares apart on a quiet host (the first done ran
// 0.84-0.98 of a 1 GiB read's call on the 2-CPU AMD EPYC host), which is not waiting.
thread_local double last_concurrency = 0.0;

// body(i) on threads i = 0 .. n - 1 (i = 0 on the calling thread), joined before it returns.
template <typename Body>
void on_threads(int n, const Body &body) {
  std::vector<double> ran(n, 0.0);
  const auto w0 = std::chrono::steady_clock::now();
  const auto timed = [&](int i) {
    const double t0 = thread_cpu_seconds();
    body(i);
    const double cpu = thread_cpu_seconds() - t0;
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    ran[i] = wall > 0.0 ? cpu / wall : 0.0;
  };
  std::vector<std::thread> others;
  for (int i = 1; i < n; ++i) others.emplace_back([&timed, i] { timed(i); });
  timed(0);
  for (std::thread &t : others) t.join();
  last_concurrency = *std::min_element(ran.begin(), ran.end());
}

typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

// One thread's share of the streaming read: 12 streams, each prefetched 512 bytes ahead into L1, as the 16-bit
// decode kernels read their rows (one thread on the 2-CPU EPYC: 31 GB/s, against 25 with 8 streams unprefetched
// and 20 with one; the kernels' reads ran above the 8-stream probe), inlined into each ISA's function below.
constexpr int kStreams = 12;
template <typename vf>
__attribute__((always_inline)) inline double read_streams(const float *base, int64_t per) {
  constexpr int W = sizeof(vf) / sizeof(float), kAhead = 512 / sizeof(float);
  vf acc[kStreams] = {};
  for (int64_t i = 0; i < per; i += W)
    for (int s = 0; s < kStreams; ++s) {
      vf v;
      if ((i * sizeof(float)) % 64 == 0) __builtin_prefetch(base + s * per + i + kAhead, 0, 3);
      __builtin_memcpy(&v, base + s * per + i, sizeof v);
      acc[s] += v;
    }
  double total = 0.0;
  for (const vf &a : acc)
    for (int j = 0; j < W; ++j) total += a[j];
  return total;
}

__attribute__((target("avx512f"))) double read_avx512(const float *x, int64_t per) {
  return read_streams<v16>(x, per);
}
__attribute__((target("avx2"))) double read_avx2(const float *x, int64_t per) { return read_streams<v8>(x, per); }
double read_generic(const float *x, int64_t per) { return read_streams<v4>(x, per); }

// Sum of x by a parallel streaming read, `part` on each of `nt` threads (each stream a multiple of the widest
// vector).
double read_sum(double (*part)(const float *, int64_t), const float *x, int64_t n, int nt) {
  constexpr int kWidest = 16;
  const int64_t per = n / nt / kStreams / kWidest * kWidest;
  std::vector<double> parts(nt, 0.0);
  on_threads(nt, [&](int id) { parts[id] = part(x + id * per * kStreams, per); });
  double total = 0.0;
  for (double p : parts) total += p;
  for (int64_t i = per * kStreams * nt; i < n; ++i) total += x[i];
  return total;
}

// One thread's float32 FMAs: 12 independent accumulators (latency 4 x 2 ports + slack), inlined into each ISA's
// function below (AVX-512, and AVX2 for a CPU without it).
template <typename vf>
__attribute__((always_inline)) inline float fma_lanes(int64_t iterations) {
  constexpr int W = sizeof(vf) / sizeof(float);
  vf acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = vf{} + float(i) * 1e-3f;
  const vf a = vf{} + 0.999999f, b = vf{} + 1e-7f;
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = acc[i] * a + b;  // contracted to one FMA
  float sink = 0.0f;
  for (const vf &v : acc)
    for (int j = 0; j < W; ++j) sink += v[j];
  return sink;
}

__attribute__((target("avx512f,fma"))) float fma_loop(int64_t iterations) { return fma_lanes<v16>(iterations); }
__attribute__((target("avx2,fma"))) float fma_loop_avx2(int64_t iterations) { return fma_lanes<v8>(iterations); }

// One thread's AVX512-BF16 dot products (VDPBF16PS: 16 lanes x 2 bfloat16 products, float32 sums), the bfloat16
// GEMM's limit where the CPU has no AMX: 12 independent accumulators, as fma_loop.
__attribute__((target("avx512f,avx512bf16"))) float dpbf16_loop(int64_t iterations) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);  // 1, 6e-8
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  float sink = 0.0f;
  for (int i = 0; i < 12; ++i) sink += _mm512_reduce_add_ps(acc[i]);
  return sink;
}

// The 4 KB of int8 weights the int8 loops read (in L1).
struct Q8Block {
  static constexpr int kBytes = 4096;
  alignas(64) int8_t q[kBytes];
  Q8Block() {
    for (int i = 0; i < kBytes; ++i) q[i] = int8_t(i * 37 + 11);
  }
};

// One thread's int8 weights at one token as the package's float kernel takes them (isa_linear.inc: skinny_tile):
// each 8 (AVX2) or 16 (AVX-512) weights sign-extended from memory to int32, converted to float32 and multiplied into
// an accumulator, 12 independent ones, from a 4 KB buffer (in L1). On the AMD EPYC AVX2 host the conversion issues
// once per cycle: the loop, and the kernel on weights in L1, run at 25 G weights/s per core.
__attribute__((target("avx512f,avx512bw,fma"))) float widen_loop(int64_t iterations) {
  const Q8Block b;
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512 x = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    const int8_t *q = b.q + it * 256 % Q8Block::kBytes;  // (the 192 bytes a step reads stay in bounds)
    for (int i = 0; i < 12; ++i) {
      const __m512i w = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(q + i * 16)));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(w), x, acc[i]);
    }
  }
  float sink = 0.0f;
  for (int i = 0; i < 12; ++i) sink += _mm512_reduce_add_ps(acc[i]);
  return sink;
}

// The sum of every lane of n AVX2 accumulators (the loops' result, so that they are not optimised away).
__attribute__((target("avx2"))) float sum_lanes(const __m256 *acc, int n) {
  float sink = 0.0f;
  alignas(32) float lanes[8];
  for (int i = 0; i < n; ++i) {
    _mm256_store_ps(lanes, acc[i]);
    for (float v : lanes) sink += v;
  }
  return sink;
}

__attribute__((target("avx2,fma"))) float widen_loop_avx2(int64_t iterations) {
  const Q8Block b;
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(float(i) * 1e-3f);
  const __m256 x = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    const int8_t *q = b.q + it * 256 % Q8Block::kBytes;
    for (int i = 0; i < 12; ++i) {
      const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(q + i * 8)));
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(w), x, acc[i]);
    }
  }
  return sum_lanes(acc, 12);
}

// One thread's int8 weights at one token as the package's AVX512-VNNI kernel takes them (skinny_q8_parts, for
// 16-bit x): each 32 weights sign-extended from memory to int16 and multiplied by VPDPWSSD into two int32 sums (x's
// two int16 parts), 6 rows of two sums, from a 4 KB buffer (in L1).
__attribute__((target("avx512f,avx512bw,avx512vnni"))) float vnni_loop(int64_t iterations) {
  const Q8Block b;
  __m512i hi[6], lo[6];
  for (int i = 0; i < 6; ++i) hi[i] = lo[i] = _mm512_set1_epi32(i);
  const __m512i h = _mm512_set1_epi16(3), l = _mm512_set1_epi16(-5);
  for (int64_t it = 0; it < iterations; ++it) {
    const int8_t *q = b.q + it * 256 % Q8Block::kBytes;
    for (int i = 0; i < 6; ++i) {
      const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + i * 32)));
      hi[i] = _mm512_dpwssd_epi32(hi[i], w, h);
      lo[i] = _mm512_dpwssd_epi32(lo[i], w, l);
    }
  }
  int64_t sink = 0;
  for (int i = 0; i < 6; ++i) sink += _mm512_reduce_add_epi32(_mm512_add_epi32(hi[i], lo[i]));
  return float(sink);
}

// One thread's int8 weights at one token as the package's AVX2 integer kernel takes them (skinny_q8_parts, 16-bit
// x): each 32 weights sign-extended from memory to int16 in two halves, VPMADDWD against x's int16 parts, the two
// int32 sums added, converted to float32 and multiplied into an accumulator (times the block's scale), 6 rows.
__attribute__((target("avx2,fma"))) float madd_loop(int64_t iterations) {
  const Q8Block b;
  __m256 acc[6];
  for (int i = 0; i < 6; ++i) acc[i] = _mm256_set1_ps(float(i) * 1e-3f);
  const __m256i lo = _mm256_set1_epi16(3), hi = _mm256_set1_epi16(-5);
  const __m256 scale = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    const int8_t *q = b.q + it * 256 % Q8Block::kBytes;
    for (int i = 0; i < 6; ++i) {
      const __m128i *p = reinterpret_cast<const __m128i *>(q + i * 32);
      const __m256i a = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(p)), lo);
      const __m256i c = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(p + 1)), hi);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(a, c)), scale, acc[i]);
    }
  }
  return sum_lanes(acc, 6);
}

// One thread's VPMADDWD as an int16 GEMM's inner loop issues it (int8 weights widened to int16 once per panel, x's
// int16 pairs broadcast; AVX2 has no VPDPWSSD, so a VPADDD adds each product pair's sums to its accumulator):
// 12 accumulators, operands in registers, 16 multiplies per VPMADDWD.
__attribute__((target("avx2"))) float madd_gemm_loop(int64_t iterations) {
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
  __m256i w0 = _mm256_set1_epi16(3), w1 = _mm256_set1_epi16(-5), x = _mm256_set1_epi16(7);
  for (int64_t it = 0; it < iterations; ++it) {
    __asm__("" : "+x"(w0), "+x"(w1), "+x"(x));  // (not loop invariants: the products are issued every time)
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(i % 2 ? w1 : w0, x));
  }
  int64_t sink = 0;
  for (int i = 0; i < 12; ++i) sink += _mm256_extract_epi32(acc[i], 0);
  return float(sink);
}

// AVX2's int8 dot without VNNI: VPMADDUBSW (32 u8 x s8 products summed in pairs to int16), VPMADDWD by ones (the
// pairs' sums to int32) and VPADDD, 12 accumulators, operands in registers.
__attribute__((target("avx2"))) float maddubs_gemm_loop(int64_t iterations) {
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
  __m256i w0 = _mm256_set1_epi8(3), w1 = _mm256_set1_epi8(-5), x = _mm256_set1_epi8(7);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t it = 0; it < iterations; ++it) {
    __asm__("" : "+x"(w0), "+x"(w1), "+x"(x));  // (not loop invariants: the products are issued every time)
    for (int i = 0; i < 12; ++i)
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(x, i % 2 ? w1 : w0), ones));
  }
  int64_t sink = 0;
  for (int i = 0; i < 12; ++i) sink += _mm256_extract_epi32(acc[i], 0);
  return float(sink);
}

// One thread's TDPBF16PS (int8: TDPBSSD): 6 accumulating tiles (16x16 float32 or int32 each) fed by A and B tiles
// (16 rows x 64 bytes: 32 bfloat16 or 64 int8 of k) already in registers; false where the kernel does not give AMX
// to this thread.
__attribute__((target("amx-tile,amx-bf16,amx-int8"))) bool amx_loop(int64_t iterations, bool int8) {
  constexpr long kReqPerm = 0x1023, kXtileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA (Linux)
  if (syscall(SYS_arch_prctl, kReqPerm, kXtileData) != 0) return false;
  alignas(64) unsigned char config[64] = {};
  config[0] = 1;  // palette 1: tiles 0-5 accumulate (16 rows x 64 bytes), 6-7 hold A and B
  for (int t = 0; t < 8; ++t) {
    config[16 + 2 * t] = 64;  // bytes per row
    config[48 + t] = 16;      // rows
  }
  _tile_loadconfig(config);
  alignas(64) uint16_t data[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) data[i] = int8 ? 0x0101 : 0x3f80;  // int8 1s or bfloat16 1.0
  _tile_loadd(6, data, 64);
  _tile_loadd(7, data, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  // (the tile numbers are literals to GCC's intrinsics: the six products are spelled out once, for either one)
#define MSW_SIX_PRODUCTS(dp)                                                                             \
  for (int64_t it = 0; it < iterations; ++it) {                                                          \
    dp(0, 6, 7);                                                                                         \
    dp(1, 6, 7);                                                                                         \
    dp(2, 6, 7);                                                                                         \
    dp(3, 6, 7);                                                                                         \
    dp(4, 6, 7);                                                                                         \
    dp(5, 6, 7);                                                                                         \
  }
  if (int8) {
    MSW_SIX_PRODUCTS(_tile_dpbssd)
  } else {
    MSW_SIX_PRODUCTS(_tile_dpbf16ps)
  }
#undef MSW_SIX_PRODUCTS
  alignas(64) int32_t out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0] != 0;
}

double amx_rate(int threads, int64_t iterations, bool int8) {
  std::vector<char> oks(threads, 0);
  const auto t0 = std::chrono::steady_clock::now();
  on_threads(threads, [&](int id) { oks[id] = amx_loop(iterations, int8); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (char ok : oks)
    if (!ok) return -1.0;
  return double(threads) * iterations * 6 * (16 * 16 * (int8 ? 64 : 32) * 2) / s;
}

}  // namespace

extern "C" {

// The sum of x read on `threads` threads (0: every CPU this process may use); -1.0 for an ISA this CPU lacks or an
// unknown name; "best" picks the best this CPU has.
double probe_read(const char *isa, const float *x, int64_t n, int threads) {
  __builtin_cpu_init();
  const std::string name(isa);
  const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
  const int nt = threads > 0 ? threads : cpus();
  if (name == "avx512" || (name == "best" && avx512)) return avx512 ? read_sum(read_avx512, x, n, nt) : -1.0;
  if (name == "avx2" || (name == "best" && avx2)) return avx2 ? read_sum(read_avx2, x, n, nt) : -1.0;
  if (name == "generic" || name == "best") return read_sum(read_generic, x, n, nt);
  return -1.0;
}

// The concurrency of the calling thread's last probe call (on_threads: last_concurrency).
double probe_last_concurrency() { return last_concurrency; }

// FLOP/s of `loop` (one thread's in-register loop, `flops` per iteration) on `threads` threads.
double loop_rate(int threads, int64_t iterations, float (*loop)(int64_t), double flops) {
  std::vector<float> sinks(threads, 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  on_threads(threads, [&](int id) { sinks[id] = loop(iterations); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sinks[0] == 12345.0f ? 0.0 : double(threads) * iterations * flops / s;
}

// float32 FLOP/s of FMAs on `threads` threads: AVX-512 (12 x 16 x 2 FLOP per iteration), else AVX2 (12 x 8 x 2);
// -1 where the CPU has neither.
double probe_fma_peak(int threads, int64_t iterations) {
  if (__builtin_cpu_supports("avx512f")) return loop_rate(threads, iterations, fma_loop, 12 * 16 * 2);
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return -1.0;
  return loop_rate(threads, iterations, fma_loop_avx2, 12 * 8 * 2);
}

// One thread's AVX512-VNNI int8 dot products (VPDPBUSD: 16 lanes x 4 u8 x s8 products, int32 sums), a W8A8
// GEMM's limit without AMX: 12 independent accumulators, as dpbf16_loop.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) float dpbusd_loop(int64_t iterations) {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(-1);
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  int32_t sink = 0;
  for (int i = 0; i < 12; ++i) {
    alignas(64) int32_t lanes[16];
    _mm512_store_si512(lanes, acc[i]);
    sink += lanes[0];
  }
  return float(sink);
}

// int8 OP/s (2 per multiply) of AVX512-VNNI VPDPBUSD on `threads` threads; -1 where the CPU lacks it.
double probe_dpbusd_peak(int threads, int64_t iterations) {
  if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vnni")) return -1.0;
  return loop_rate(threads, iterations, dpbusd_loop, 12 * 16 * 4 * 2);
}

// bfloat16 FLOP/s of AVX512-BF16 VDPBF16PS on `threads` threads; -1 where the CPU lacks it.
double probe_dpbf16_peak(int threads, int64_t iterations) {
  if (!__builtin_cpu_supports("avx512bf16")) return -1.0;
  return loop_rate(threads, iterations, dpbf16_loop, 12 * 16 * 2 * 2);
}

// bfloat16 FLOP/s of AMX TDPBF16PS on `threads` threads; -1 where the CPU or the kernel does not give AMX to
// this process.
double probe_amx_peak(int threads, int64_t iterations) {
  return __builtin_cpu_supports("amx-bf16") ? amx_rate(threads, iterations, false) : -1.0;
}

// The same on TDPBSSD (AMX-INT8: 64 int8 multiplies per tile row pair, 2 OP each), the ceiling of W8A8 on AMX.
double probe_amx_int8_peak(int threads, int64_t iterations) {
  return __builtin_cpu_supports("amx-int8") ? amx_rate(threads, iterations, true) : -1.0;
}

// int8 weights at one token, in FLOP/s (2 per weight) on `threads` threads, as the float kernel takes them
// (widen_loop: AVX-512 12 x 16 weights per iteration, else AVX2 12 x 8); -1 where the CPU has neither.
double probe_widen_peak(int threads, int64_t iterations) {
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
    return loop_rate(threads, iterations, widen_loop, 12 * 16 * 2);
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return -1.0;
  return loop_rate(threads, iterations, widen_loop_avx2, 12 * 8 * 2);
}

// int8 weights at one token, in FLOP/s (2 per weight) on `threads` threads, as the AVX512-VNNI kernel takes them
// (vnni_loop: 6 x 32 weights per iteration); -1 where the CPU lacks it.
double probe_vnni_peak(int threads, int64_t iterations) {
  if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vnni")) return -1.0;
  return loop_rate(threads, iterations, vnni_loop, 6 * 32 * 2);
}

// int8 weights at one token, in FLOP/s (2 per weight) on `threads` threads, as the AVX2 integer kernel takes them
// (madd_loop: 6 x 32 weights per iteration); -1 where the CPU lacks AVX2.
double probe_madd_peak(int threads, int64_t iterations) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return -1.0;
  return loop_rate(threads, iterations, madd_loop, 6 * 32 * 2);
}

// An int16 GEMM's multiplies on AVX2's VPMADDWD (madd_gemm_loop), in OP/s (2 per multiply) on `threads` threads;
// -1 where the CPU lacks AVX2. Against probe_fma_peak's float32 FLOP/s: whether integer dots could multiply faster
// than the float32 GEMM that int8 weights take above the skinny kernel.
double probe_madd_gemm_peak(int threads, int64_t iterations) {
  if (!__builtin_cpu_supports("avx2")) return -1.0;
  return loop_rate(threads, iterations, madd_gemm_loop, 12 * 16 * 2);
}

// A W8A8 GEMM's multiplies on AVX2's VPMADDUBSW (maddubs_gemm_loop: 32 multiplies per VPMADDUBSW), in OP/s (2 per
// multiply) on `threads` threads; -1 where the CPU lacks AVX2.
double probe_maddubs_gemm_peak(int threads, int64_t iterations) {
  if (!__builtin_cpu_supports("avx2")) return -1.0;
  return loop_rate(threads, iterations, maddubs_gemm_loop, 12 * 32 * 2);
}

void probe_add(const float *a, const float *b, float *c, int64_t n) {
  const int nt = cpus();
  on_threads(nt, [&](int id) {
    for (int64_t i = n * id / nt; i < n * (id + 1) / nt; ++i) c[i] = a[i] + b[i];
  });
}

}  // extern "C"
