// Fused SwiGLU for the CPU, registered with MindSpore as an `aot` Custom op.
//
//   SwigluFwd: x [..., 2I] packed [gate, up]  ->  y  [..., I] = silu(gate) * up
//   SwigluBwd: x [..., 2I], dy [..., I]       ->  dx [..., 2I] = [d_gate, d_up]
//
// float32 / float16 / bfloat16 in and out, float32 inside. One source, compiled for AVX-512, AVX2 and
// a generic x86-64 baseline in one .so; the ISA is chosen at run time, so the .so loads on any x86-64.
// Rows and column blocks are spread over OpenMP threads.
#include <immintrin.h>
#include <omp.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct f16 { uint16_t bits; };
struct bf16 { uint16_t bits; };

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal half -> normal float
    int e = -1;
    do { man <<= 1; ++e; } while (!(man & 0x400u));
    bits = sign | uint32_t(112 - e) << 23 | ((man & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {  // round to nearest even
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint16_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) return sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0u);
  if (ax >= 0x477FF000u) return sign | 0x7C00u;  // rounds past 65504
  if (ax < 0x38800000u) {                        // subnormal half or zero
    if (ax < 0x33000000u) return sign;
    uint32_t e = ax >> 23, man = (ax & 0x7FFFFFu) | 0x800000u, shift = 126 - e;
    uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return sign | h;
  }
  uint32_t h = ((ax >> 13) - (112u << 10)), rem = ax & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | h;
}

// Calls body(row, c0, c1) over [rows] x [0, inter) cut into column blocks, in parallel when large.
template <typename Body>
void for_tiles(int64_t rows, int64_t inter, const Body &body) {
  constexpr int64_t kBlock = 4096, kSerial = 1 << 15;
  const int64_t blocks = (inter + kBlock - 1) / kBlock, tiles = rows * blocks;
  const bool parallel = rows * inter >= kSerial && omp_get_max_threads() > 1;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t r = t / blocks, c0 = (t % blocks) * kBlock;
    body(r, c0, c0 + kBlock < inter ? c0 + kBlock : inter);
  }
}

using FwdFn = void (*)(const void *, void *, int64_t, int64_t);
using BwdFn = void (*)(const void *, const void *, void *, int64_t, int64_t);
struct Kernels {
  FwdFn fwd[3];  // float32, float16, bfloat16
  BwdFn bwd[3];
};

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
namespace avx512 {
#define MSW_W 16
#include "swiglu_impl.inc"
#undef MSW_W
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
#define MSW_W 8
#include "swiglu_impl.inc"
#undef MSW_W
}  // namespace avx2
#pragma GCC pop_options

namespace generic {
#define MSW_W 4
#include "swiglu_impl.inc"
#undef MSW_W
}  // namespace generic

const char *const kIsaNames[] = {"avx512", "avx2", "generic"};
const Kernels *const kIsaKernels[] = {&avx512::kernels, &avx2::kernels, &generic::kernels};

int best_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return 1;
  return 2;
}

const int kBestIsa = best_isa();
int g_isa = kBestIsa;
std::atomic<int64_t> g_launches[2];  // SwigluFwd, SwigluBwd: lets tests see what a compiled graph runs

int dtype_index(const char *dtype) {
  const std::string d(dtype);
  if (d == "float32" || d == "float") return 0;
  if (d == "float16") return 1;
  if (d == "bfloat16") return 2;
  return -1;
}

// Leading dims flattened into rows; last dim of the packed tensor is 2 * inter.
void rows_inter(int ndim, const int64_t *shape, int64_t *rows, int64_t *inter) {
  *rows = 1;
  for (int i = 0; i + 1 < ndim; ++i) *rows *= shape[i];
  *inter = ndim > 0 ? shape[ndim - 1] / 2 : 0;
}

}  // namespace

enum TypeId : int {};
class AotExtra;

extern "C" {

// Introspection for tests and benchmarks (ctypes): the ISA in use, and a way to force a lower one.
const char *msw_isa() { return kIsaNames[g_isa]; }
int64_t msw_launches(int which) { return which == 0 || which == 1 ? g_launches[which].load() : -1; }
int msw_set_isa(const char *name) {
  for (int i = 0; i < 3; ++i) {
    if (name == std::string(kIsaNames[i])) {
      if (i < kBestIsa) return -1;  // the CPU lacks it
      g_isa = i;
      return 0;
    }
  }
  return -1;
}

// Bandwidth probes for the benchmarks' ceilings: a parallel streaming read (sum) and a 2-read-1-write add.
double msw_read(const float *x, int64_t n) {
  double total = 0.0;
#pragma omp parallel for reduction(+ : total) schedule(static)
  for (int64_t b = 0; b < n / 4096; ++b) {  // 4096-float blocks, 16 independent sums each (vectorised)
    float acc[16] = {0};
    for (int64_t i = b * 4096; i < (b + 1) * 4096; i += 16)
      for (int j = 0; j < 16; ++j) acc[j] += x[i + j];
    for (float a : acc) total += a;
  }
  for (int64_t i = n / 4096 * 4096; i < n; ++i) total += x[i];
  return total;
}

void msw_add(const float *a, const float *b, float *c, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
}

int SwigluFwd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam != 2) return 1;
  ++g_launches[0];
  const int d = dtype_index(dtypes[0]);
  if (d < 0 || std::string(dtypes[0]) != dtypes[1]) return 2;
  int64_t rows, inter;
  rows_inter(ndims[0], shapes[0], &rows, &inter);
  if (ndims[0] < 1 || shapes[0][ndims[0] - 1] % 2 != 0) return 3;
  if (rows * inter > 0) kIsaKernels[g_isa]->fwd[d](params[0], params[1], rows, inter);
  return 0;
}

std::vector<int64_t> SwigluFwdInferShape(int *ndims, int64_t **shapes, AotExtra *) {
  std::vector<int64_t> out(shapes[0], shapes[0] + ndims[0]);
  if (!out.empty() && out.back() >= 0) out.back() /= 2;  // -1 (unknown) stays unknown
  return out;
}

TypeId SwigluFwdInferType(std::vector<TypeId> type_ids, AotExtra *) { return type_ids[0]; }

int SwigluBwd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam != 3) return 1;
  ++g_launches[1];
  const int d = dtype_index(dtypes[0]);
  if (d < 0 || std::string(dtypes[0]) != dtypes[1] || std::string(dtypes[0]) != dtypes[2]) return 2;
  int64_t rows, inter;
  rows_inter(ndims[0], shapes[0], &rows, &inter);
  if (ndims[0] < 1 || shapes[0][ndims[0] - 1] % 2 != 0) return 3;
  if (rows * inter > 0) kIsaKernels[g_isa]->bwd[d](params[0], params[1], params[2], rows, inter);
  return 0;
}

std::vector<int64_t> SwigluBwdInferShape(int *ndims, int64_t **shapes, AotExtra *) {
  return std::vector<int64_t>(shapes[0], shapes[0] + ndims[0]);
}

TypeId SwigluBwdInferType(std::vector<TypeId> type_ids, AotExtra *) { return type_ids[0]; }

}  // extern "C"
