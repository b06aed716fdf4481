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

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
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

inline float to1(float v) { return v; }
inline float to1(f16 v) { return half_to_float(v.bits); }
inline float to1(bf16 v) {
  uint32_t b = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
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
struct LinearKernels {  // indexed by dtype, as above
  void (*to_float[3])(const void *, float *, int64_t);
  void (*from_float[3])(const float *, void *, int64_t);
  void (*swiglu_from_float[3])(const float *, const float *, void *, int64_t);
  void (*skinny[3])(const float *, int64_t, int64_t, const void *, int64_t, float *, int64_t);
};

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
namespace avx512 {
#define MSW_W 16
#include "swiglu_impl.inc"
#include "linear_impl.inc"
#undef MSW_W
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
#define MSW_W 8
#include "swiglu_impl.inc"
#include "linear_impl.inc"
#undef MSW_W
}  // namespace avx2
#pragma GCC pop_options

namespace generic {
#define MSW_W 4
#include "swiglu_impl.inc"
#include "linear_impl.inc"
#undef MSW_W
}  // namespace generic

const char *const kIsaNames[] = {"avx512", "avx2", "generic"};
const Kernels *const kIsaKernels[] = {&avx512::kernels, &avx2::kernels, &generic::kernels};
const LinearKernels *const kIsaLinear[] = {&avx512::linear_kernels, &avx2::linear_kernels, &generic::linear_kernels};

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
std::atomic<int64_t> g_launches[4];  // SwigluFwd, SwigluBwd, Linear, GateUpSwiglu: what a compiled graph runs

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


// ---- Linear layers: y = x w^T with w [M, K] as stored by Dense / HuggingFace ----------------------------
// Few tokens (decode): the skinny kernel above, which reads each weight row once for all tokens. More tokens:
// oneDNN's GEMM, the one MindSpore's own CPU MatMul uses (libdnnl.so.3, already loaded by MindSpore), called
// through its threadpool interface with OpenMP threads: float32 sgemm, bfloat16 x bfloat16 -> float32 (AMX or
// AVX512-BF16 where the CPU has them; the products are exact, the sums float32), float16 widened to float32 one
// block of weight rows at a time. Without oneDNN every size takes the skinny kernel.
namespace dnnl_tp {  // oneDNN's dnnl::threadpool_interop::threadpool_iface, ABI-compatible
struct threadpool_iface {
  virtual int get_num_threads() const = 0;
  virtual bool get_in_parallel() const = 0;
  virtual void parallel_for(int n, const std::function<void(int, int)> &fn) = 0;
  virtual uint64_t get_flags() const = 0;
  virtual ~threadpool_iface() {}
};
}  // namespace dnnl_tp

struct OmpPool final : dnnl_tp::threadpool_iface {
  int get_num_threads() const override { return omp_get_max_threads(); }
  bool get_in_parallel() const override { return omp_in_parallel(); }
  void parallel_for(int n, const std::function<void(int, int)> &fn) override {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i) fn(i, n);
  }
  uint64_t get_flags() const override { return 0; }
};

using SgemmFn = int (*)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t,
                        float, float *, int64_t, void *);
using BgemmFn = int (*)(char, char, int64_t, int64_t, int64_t, float, const uint16_t *, int64_t, const uint16_t *,
                        int64_t, float, float *, int64_t, void *);
struct Dnnl {
  SgemmFn sgemm = nullptr;
  BgemmFn bgemm = nullptr;
  OmpPool pool;
};
std::mutex g_dnnl_mutex;
Dnnl g_dnnl;
bool g_dnnl_tried = false;
bool g_dnnl_off = false;  // tests and benchmarks force the skinny kernel for every size

bool bind_dnnl(void *h) {
  if (!h) return false;
  g_dnnl.sgemm = reinterpret_cast<SgemmFn>(dlsym(h, "dnnl_threadpool_interop_sgemm"));
  g_dnnl.bgemm = reinterpret_cast<BgemmFn>(dlsym(h, "dnnl_threadpool_interop_gemm_bf16bf16f32"));
  return g_dnnl.sgemm && g_dnnl.bgemm;
}

const Dnnl *dnnl() {
  std::lock_guard<std::mutex> lock(g_dnnl_mutex);
  if (!g_dnnl_tried) {
    g_dnnl_tried = true;
    if (!bind_dnnl(dlopen("libdnnl.so.3", RTLD_NOW | RTLD_NOLOAD))) g_dnnl.sgemm = nullptr, g_dnnl.bgemm = nullptr;
  }
  return g_dnnl_off || !g_dnnl.sgemm ? nullptr : &g_dnnl;
}

// Token counts up to which the skinny kernel beats oneDNN here (float32, float16, bfloat16; measured with
// tools/bench_linear.py at llama-7b shapes: oneDNN's bfloat16 GEMM uses AMX from 8 tokens).
int64_t g_skinny_max[3] = {32, 64, 4};

struct Op {
  int d;                 // dtype index
  const void *x;         // [n, k] in the dtype
  const float *xf;       // x as float32 (x itself for float32)
  int64_t n, k;
  const LinearKernels *lk;
  size_t es() const { return d == 0 ? 4 : 2; }
  const char *row(const void *w, int64_t r) const { return static_cast<const char *>(w) + r * k * es(); }
};

std::vector<float> widen_x(const Op &op) {
  std::vector<float> xf(op.d == 0 ? 0 : op.n * op.k);
  if (op.d != 0) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < op.n; ++t) op.lk->to_float[op.d](op.row(op.x, t), xf.data() + t * op.k, op.k);
  }
  return xf;
}

// c[t * ldc + j] = sum_k x[t, k] * w[j, k] for j < rows, by oneDNN. scratch: float16 weights widened.
void gemm_rows(const Dnnl &dn, const Op &op, const void *w, int64_t rows, float *c, int64_t ldc,
               std::vector<float> &scratch) {
  if (op.d == 2) {
    dn.bgemm('N', 'T', op.n, rows, op.k, 1.0f, static_cast<const uint16_t *>(op.x), op.k,
             static_cast<const uint16_t *>(w), op.k, 0.0f, c, ldc, (void *)&dn.pool);
    return;
  }
  const float *wf = static_cast<const float *>(w);
  if (op.d == 1) {
    scratch.resize(rows * op.k);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) op.lk->to_float[1](op.row(w, r), scratch.data() + r * op.k, op.k);
    wf = scratch.data();
  }
  dn.sgemm('N', 'T', op.n, rows, op.k, 1.0f, op.xf, op.k, wf, op.k, 0.0f, c, ldc, (void *)&dn.pool);
}

// Weight rows per oneDNN call when the output needs a float32 staging block: ~16 MiB of widened float16 rows.
int64_t block_rows(const Op &op, int64_t m) {
  int64_t b = op.d == 1 ? std::max<int64_t>(64, (int64_t(4) << 20) / std::max<int64_t>(op.k, 1)) : 1024;
  return std::min(b, m);
}

// y [n, m] = x [n, k] w^T, w [m, k]
void linear(const Op &op, const void *w, int64_t m, void *y) {
  const Dnnl *dn = dnnl();
  if (dn && op.n > g_skinny_max[op.d]) {
    if (op.d == 0) {
      dn->sgemm('N', 'T', op.n, m, op.k, 1.0f, op.xf, op.k, static_cast<const float *>(w), op.k, 0.0f,
                static_cast<float *>(y), m, (void *)&dn->pool);
      return;
    }
    const int64_t b = block_rows(op, m);
    std::vector<float> c(op.n * b), scratch;
    for (int64_t j0 = 0; j0 < m; j0 += b) {
      const int64_t rows = std::min(b, m - j0);
      gemm_rows(*dn, op, op.row(w, j0), rows, c.data(), rows, scratch);
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < op.n; ++t)
        op.lk->from_float[op.d](c.data() + t * rows, static_cast<char *>(y) + (t * m + j0) * op.es(), rows);
    }
    return;
  }
  constexpr int64_t kRows = 64;
#pragma omp parallel
  {
    std::vector<float> c(op.n * kRows);
#pragma omp for schedule(static)
    for (int64_t j0 = 0; j0 < m; j0 += kRows) {
      const int64_t rows = std::min(kRows, m - j0);
      if (op.d == 0) {
        op.lk->skinny[0](op.xf, op.n, op.k, op.row(w, j0), rows, static_cast<float *>(y) + j0, m);
        continue;
      }
      op.lk->skinny[op.d](op.xf, op.n, op.k, op.row(w, j0), rows, c.data(), kRows);
      for (int64_t t = 0; t < op.n; ++t)
        op.lk->from_float[op.d](c.data() + t * kRows, static_cast<char *>(y) + (t * m + j0) * op.es(), rows);
    }
  }
}

// y [n, inter] = silu(x w_gate^T) * (x w_up^T), w = [w_gate; w_up] [2 inter, k]: the SwiGLU is the GEMM's
// epilogue, applied to one block of columns at a time, so [n, 2 inter] never exists.
void gate_up_swiglu(const Op &op, const void *w, int64_t inter, void *y) {
  const Dnnl *dn = dnnl();
  auto epilogue = [&](const float *c, int64_t ldc, int64_t t, int64_t j0, int64_t cols) {  // c: [gate | up]
    op.lk->swiglu_from_float[op.d](c + t * ldc, c + t * ldc + cols, static_cast<char *>(y) + (t * inter + j0) * op.es(),
                                  cols);
  };
  if (dn && op.n > g_skinny_max[op.d]) {
    const int64_t b = block_rows(op, inter);
    std::vector<float> c(op.n * 2 * b), scratch;
    for (int64_t j0 = 0; j0 < inter; j0 += b) {
      const int64_t cols = std::min(b, inter - j0);
      gemm_rows(*dn, op, op.row(w, j0), cols, c.data(), 2 * cols, scratch);
      gemm_rows(*dn, op, op.row(w, inter + j0), cols, c.data() + cols, 2 * cols, scratch);
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < op.n; ++t) epilogue(c.data(), 2 * cols, t, j0, cols);
    }
    return;
  }
  constexpr int64_t kCols = 32;
#pragma omp parallel
  {
    std::vector<float> c(op.n * 2 * kCols);
#pragma omp for schedule(static)
    for (int64_t j0 = 0; j0 < inter; j0 += kCols) {
      const int64_t cols = std::min(kCols, inter - j0);
      op.lk->skinny[op.d](op.xf, op.n, op.k, op.row(w, j0), cols, c.data(), 2 * cols);
      op.lk->skinny[op.d](op.xf, op.n, op.k, op.row(w, inter + j0), cols, c.data() + cols, 2 * cols);
      for (int64_t t = 0; t < op.n; ++t) epilogue(c.data(), 2 * cols, t, j0, cols);
    }
  }
}

// Shapes of the Custom ops' (x [..., k], w [m, k]) inputs; returns false when they do not fit.
bool linear_shapes(int *ndims, int64_t **shapes, int64_t *n, int64_t *k, int64_t *m) {
  if (ndims[0] < 1 || ndims[1] != 2 || shapes[0][ndims[0] - 1] != shapes[1][1]) return false;
  *n = 1;
  for (int i = 0; i + 1 < ndims[0]; ++i) *n *= shapes[0][i];
  *k = shapes[1][1];
  *m = shapes[1][0];
  return true;
}

// Runs body(op) for a Custom op call with (x, w, y); returns the aot status code.
template <typename Body>
int run_linear(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, bool packed,
               const Body &body) {
  if (nparam != 3) return 1;
  const int d = dtype_index(dtypes[0]);
  if (d < 0 || std::string(dtypes[0]) != dtypes[1] || std::string(dtypes[0]) != dtypes[2]) return 2;
  int64_t n, k, m;
  if (!linear_shapes(ndims, shapes, &n, &k, &m) || (packed && m % 2)) return 3;
  const int64_t out = packed ? m / 2 : m;
  if (n * out == 0) return 0;
  const size_t es = d == 0 ? 4 : 2;
  if (k == 0) {
    std::memset(params[2], 0, n * out * es);  // an empty sum; silu(0) * 0 = 0 too
    return 0;
  }
  Op op{d, params[0], nullptr, n, k, kIsaLinear[g_isa]};
  std::vector<float> xf = widen_x(op);
  op.xf = d == 0 ? static_cast<const float *>(params[0]) : xf.data();
  body(op, params[1], out, params[2]);
  return 0;
}

std::vector<int64_t> linear_out_shape(int *ndims, int64_t **shapes, bool packed) {
  std::vector<int64_t> out(shapes[0], shapes[0] + ndims[0]);
  const int64_t m = ndims[1] == 2 ? shapes[1][0] : -1;
  if (!out.empty()) out.back() = m < 0 ? -1 : packed ? m / 2 : m;
  return out;
}
}  // namespace

enum TypeId : int {};
class AotExtra;

extern "C" {

// Introspection for tests and benchmarks (ctypes): the ISA in use, and a way to force a lower one.
const char *msw_isa() { return kIsaNames[g_isa]; }
int64_t msw_launches(int which) { return which >= 0 && which < 4 ? g_launches[which].load() : -1; }
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

extern "C" {

// The GEMM behind the linear ops for more than msw_skinny_max tokens: "onednn", or "skinny" when libdnnl.so.3
// is not loaded (or was turned off). `path`, when given, is dlopen'ed first (MindSpore's lib folder).
const char *msw_gemm(const char *path) {
  if (path && *path) {
    std::lock_guard<std::mutex> lock(g_dnnl_mutex);
    if (!g_dnnl.sgemm && bind_dnnl(dlopen(path, RTLD_NOW))) g_dnnl_tried = true;
  }
  return dnnl() ? "onednn" : "skinny";
}
void msw_set_onednn(int on) { g_dnnl_off = !on; }
int64_t msw_skinny_max(int dtype, int64_t value) {  // value < 0: read only
  if (dtype < 0 || dtype > 2) return -1;
  if (value >= 0) g_skinny_max[dtype] = value;
  return g_skinny_max[dtype];
}

// Linear: x [..., K], w [M, K] -> y [..., M] = x w^T
int Linear(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  ++g_launches[2];
  return run_linear(nparam, params, ndims, shapes, dtypes, false,
                    [](const Op &op, const void *w, int64_t m, void *y) { linear(op, w, m, y); });
}
std::vector<int64_t> LinearInferShape(int *ndims, int64_t **shapes, AotExtra *) {
  return linear_out_shape(ndims, shapes, false);
}
TypeId LinearInferType(std::vector<TypeId> type_ids, AotExtra *) { return type_ids[0]; }

// GateUpSwiglu: x [..., K], w [2I, K] = [gate; up] -> y [..., I] = silu(x w_gate^T) * (x w_up^T)
int GateUpSwiglu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  ++g_launches[3];
  return run_linear(nparam, params, ndims, shapes, dtypes, true,
                    [](const Op &op, const void *w, int64_t inter, void *y) { gate_up_swiglu(op, w, inter, y); });
}
std::vector<int64_t> GateUpSwigluInferShape(int *ndims, int64_t **shapes, AotExtra *) {
  return linear_out_shape(ndims, shapes, true);
}
TypeId GateUpSwigluInferType(std::vector<TypeId> type_ids, AotExtra *) { return type_ids[0]; }

}  // extern "C"
