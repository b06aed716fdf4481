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
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
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
  double (*read_sum)(const float *, int64_t);
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
// oneDNN's matmul primitive from MindSpore's own libdnnl.so.3 (already loaded by MindSpore), run through its
// threadpool interface with OpenMP threads. It reads the weights in place (strides {1, K}: no packed copy, so
// nothing goes stale when a weight changes) and picks brgemm for this CPU: AVX-512 for float32, AMX for
// bfloat16, AVX512-FP16 for float16; the products are exact, every sum is float32. Without oneDNN every size
// takes the skinny kernel.
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

// The slice of oneDNN's C API (dnnl.h, v3) used here. Handles are opaque; 0 is dnnl_success.
using Handle = void *;
struct ExecArg {
  int arg;
  Handle memory;
};
constexpr int kArgSrc = 1, kArgDst = 17, kArgWeights = 33, kEngineCpu = 1;
constexpr int kDnnlType[3] = {3, 1, 2};  // dnnl_f32, dnnl_f16, dnnl_bf16 by dtype index
struct Dnnl {
  int (*engine_create)(Handle *, int, size_t);
  int (*stream_create)(Handle *, Handle, void *);  // dnnl_threadpool_interop_stream_create
  int (*md_create)(Handle *, int, const int64_t *, int, const int64_t *);
  int (*md_destroy)(Handle);
  int (*matmul_pd_create)(Handle *, Handle, Handle, Handle, Handle, Handle, Handle);
  int (*pd_destroy)(Handle);
  int (*primitive_create)(Handle *, Handle);
  int (*primitive_destroy)(Handle);
  int (*memory_create)(Handle *, Handle, Handle, void *);
  int (*memory_destroy)(Handle);
  int (*execute)(Handle, Handle, int, const ExecArg *);
  int (*stream_wait)(Handle);
  Handle engine = nullptr;
  OmpPool pool;
};
std::mutex g_dnnl_mutex;
Dnnl g_dnnl;
bool g_dnnl_tried = false;

template <typename F>
bool sym(void *h, F &f, const char *name) {
  return (f = reinterpret_cast<F>(dlsym(h, name))) != nullptr;
}

bool bind_dnnl(void *h) {
  Dnnl &g = g_dnnl;
  return h && sym(h, g.engine_create, "dnnl_engine_create") &&
         sym(h, g.stream_create, "dnnl_threadpool_interop_stream_create") &&
         sym(h, g.md_create, "dnnl_memory_desc_create_with_strides") &&
         sym(h, g.md_destroy, "dnnl_memory_desc_destroy") &&
         sym(h, g.matmul_pd_create, "dnnl_matmul_primitive_desc_create") &&
         sym(h, g.pd_destroy, "dnnl_primitive_desc_destroy") && sym(h, g.primitive_create, "dnnl_primitive_create") &&
         sym(h, g.primitive_destroy, "dnnl_primitive_destroy") &&
         sym(h, g.memory_create, "dnnl_memory_create") && sym(h, g.memory_destroy, "dnnl_memory_destroy") &&
         sym(h, g.execute, "dnnl_primitive_execute") && sym(h, g.stream_wait, "dnnl_stream_wait") &&
         g.engine_create(&g.engine, kEngineCpu, 0) == 0;
}

const Dnnl *dnnl() {
  std::lock_guard<std::mutex> lock(g_dnnl_mutex);
  if (!g_dnnl_tried) {
    g_dnnl_tried = true;
    bind_dnnl(dlopen("libdnnl.so.3", RTLD_NOW | RTLD_NOLOAD));
  }
  return g_dnnl.engine ? &g_dnnl : nullptr;
}

// One matmul primitive per shape: c [na, nb] (row stride ldc) = a [na, k] b^T, b [nb, k], a and b row-major;
// a, b and c each float32 or the dtype. Kept per (dtypes, na, nb, k, ldc); the cache is dropped when it
// holds kMaxMatmuls (dynamic token counts), calls still running keep theirs alive.
struct Matmul {
  const Dnnl *dn;
  Handle primitive = nullptr, md[3] = {};  // src, weights, dst
  ~Matmul() {
    if (primitive) dn->primitive_destroy(primitive);
    for (Handle h : md)
      if (h) dn->md_destroy(h);
  }
};
constexpr size_t kMaxMatmuls = 256;
std::map<std::tuple<int, int, int, int64_t, int64_t, int64_t, int64_t>, std::shared_ptr<Matmul>> g_matmuls;

std::shared_ptr<Matmul> matmul(const Dnnl &dn, int a_d, int b_d, int c_d, int64_t na, int64_t nb, int64_t k,
                               int64_t ldc) {
  std::lock_guard<std::mutex> lock(g_dnnl_mutex);
  auto key = std::make_tuple(a_d, b_d, c_d, na, nb, k, ldc);
  auto it = g_matmuls.find(key);
  if (it != g_matmuls.end()) return it->second;
  const int64_t dims[3][2] = {{na, k}, {k, nb}, {na, nb}}, strides[3][2] = {{k, 1}, {1, k}, {ldc, 1}};
  auto mm = std::make_shared<Matmul>();
  mm->dn = &dn;
  Handle pd = nullptr;
  bool ok = true;
  for (int i = 0; i < 3; ++i) ok = ok && dn.md_create(&mm->md[i], 2, dims[i], kDnnlType[i == 0 ? a_d : i == 1 ? b_d : c_d], strides[i]) == 0;
  ok = ok && dn.matmul_pd_create(&pd, dn.engine, mm->md[0], mm->md[1], nullptr, mm->md[2], nullptr) == 0;
  ok = ok && dn.primitive_create(&mm->primitive, pd) == 0;
  if (pd) dn.pd_destroy(pd);
  if (!ok) return nullptr;  // e.g. no float16 matmul on this CPU: the caller takes the skinny kernel
  if (g_matmuls.size() >= kMaxMatmuls) g_matmuls.clear();
  return g_matmuls[key] = mm;
}

// c [na, nb] = a b^T by oneDNN (see matmul); false when oneDNN cannot run it.
bool gemm(const Dnnl &dn, int a_d, const void *a, int64_t na, int b_d, const void *b, int64_t nb, int64_t k, void *c,
          int c_d, int64_t ldc) {
  const std::shared_ptr<Matmul> mm = matmul(dn, a_d, b_d, c_d, na, nb, k, ldc);
  if (!mm) return false;
  thread_local Handle stream = nullptr;
  if (!stream && dn.stream_create(&stream, dn.engine, const_cast<OmpPool *>(&dn.pool)) != 0) return false;
  Handle mem[3] = {};
  const void *data[3] = {a, b, c};
  bool ok = true;
  for (int i = 0; i < 3; ++i) ok = ok && dn.memory_create(&mem[i], mm->md[i], dn.engine, const_cast<void *>(data[i])) == 0;
  const ExecArg args[3] = {{kArgSrc, mem[0]}, {kArgWeights, mem[1]}, {kArgDst, mem[2]}};
  ok = ok && dn.execute(mm->primitive, stream, 3, args) == 0 && dn.stream_wait(stream) == 0;
  for (Handle h : mem)
    if (h) dn.memory_destroy(h);
  return ok;
}

// Whether this oneDNN has a matmul for the dtype on this CPU (float16 needs AVX512-FP16 or AVX2-VNNI-2).
bool onednn_takes(const Dnnl &dn, int d) {
  static std::atomic<int> known[3] = {-1, -1, -1};
  if (known[d] < 0)  // both ways round: x (float32 for float16) by w, and swapped
    known[d] = matmul(dn, d == 1 ? 0 : d, d, d, 2, 16, 16, 16) && matmul(dn, d, d, 0, 16, 2, 16, 2);
  return known[d] == 1;
}

// How a linear op runs: the skinny kernel, oneDNN (c = x w^T), or oneDNN with the roles swapped (c^T = w x^T:
// the weights as its source operand, read in place, then the block transposed back). By dtype (float32,
// float16, bfloat16): the skinny kernel up to kSkinnyMax tokens, swapped within kSwap; both measured with
// tools/bench_linear.py at llama-7b shapes.
enum Route { kSkinny, kOnednn, kSwapped };
constexpr int64_t kSkinnyMax[3] = {8, 12, 4};
constexpr int64_t kSwap[3][2] = {{9, 192}, {1, 0}, {32, 192}};  // float16: swapping gained nothing measurable
std::atomic<int> g_forced_route{-1};  // tests and benchmarks force one route for every size

Route route(int d, int64_t n) {
  const int forced = g_forced_route;
  const Route r = forced >= 0 ? Route(forced)
                  : n <= kSkinnyMax[d] ? kSkinny
                  : n >= kSwap[d][0] && n <= kSwap[d][1] ? kSwapped : kOnednn;
  const Dnnl *dn = r == kSkinny ? nullptr : dnnl();
  return dn && onednn_takes(*dn, d) ? r : kSkinny;
}

struct Op {
  int d;                 // dtype index
  const void *x;         // [n, k] in the dtype
  const float *xf;       // x as float32 (x itself for float32): the skinny kernel, and oneDNN for float16
  int64_t n, k;
  const LinearKernels *lk;
  const Dnnl *dn;        // oneDNN when it takes this call, else null
  bool swapped;          // oneDNN with the roles swapped
  // x as oneDNN's source operand: float16 goes in widened (float32 x float16 weights runs faster than float16
  // x float16 here, measured 1.05-1.4x at 64-128 tokens; every product is exact either way)
  int a_d() const { return d == 1 ? 0 : d; }
  const void *a() const { return d == 1 ? static_cast<const void *>(xf) : x; }
  size_t es() const { return d == 0 ? 4 : 2; }
  const char *row(const void *w, int64_t r) const { return static_cast<const char *>(w) + r * k * es(); }
};

// Weight rows per oneDNN call when its output goes through a float32 block first.
constexpr int64_t kBlockRows = 1024;

// y[t, ldy * t + j0 + j] (dtype) = ct[j * n + t], j < cols: a swapped GEMM's block transposed back, rounded once.
void store_transposed(const Op &op, const float *ct, int64_t cols, void *y, int64_t ldy, int64_t j0) {
#pragma omp parallel
  {
    std::vector<float> row(cols);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < op.n; ++t) {
      for (int64_t j = 0; j < cols; ++j) row[j] = ct[j * op.n + t];
      op.lk->from_float[op.d](row.data(), static_cast<char *>(y) + (t * ldy + j0) * op.es(), cols);
    }
  }
}

// c = (x w_rows^T) [n, rows] into c (ldc), or swapped, c^T = w_rows x^T [rows, n]; float32.
bool gemm_block(const Op &op, bool swap, const void *w_rows, int64_t rows, float *c, int64_t ldc) {
  return swap ? gemm(*op.dn, op.d, w_rows, rows, op.d, op.x, op.n, op.k, c, 0, op.n)
              : gemm(*op.dn, op.a_d(), op.a(), op.n, op.d, w_rows, rows, op.k, c, 0, ldc);
}

// y [n, m] = x [n, k] w^T, w [m, k]
bool linear(const Op &op, const void *w, int64_t m, void *y) {
  if (op.dn && !op.swapped) return gemm(*op.dn, op.a_d(), op.a(), op.n, op.d, w, m, op.k, y, op.d, m);
  if (op.dn) {
    const int64_t b = std::min(kBlockRows, m);
    std::vector<float> ct(b * op.n);
    for (int64_t j0 = 0; j0 < m; j0 += b) {
      const int64_t rows = std::min(b, m - j0);
      if (!gemm_block(op, true, op.row(w, j0), rows, ct.data(), op.n)) return false;
      store_transposed(op, ct.data(), rows, y, m, j0);
    }
    return true;
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
  return true;
}

// y [n, inter] = silu(x w_gate^T) * (x w_up^T), w = [w_gate; w_up] [2 inter, k]: the SwiGLU is the GEMM's
// epilogue, applied to one block of columns at a time, so [n, 2 inter] never exists.
bool gate_up_swiglu(const Op &op, const void *w, int64_t inter, void *y) {
  auto epilogue = [&](const float *c, int64_t ldc, int64_t t, int64_t j0, int64_t cols) {  // c: [gate | up]
    op.lk->swiglu_from_float[op.d](c + t * ldc, c + t * ldc + cols, static_cast<char *>(y) + (t * inter + j0) * op.es(),
                                  cols);
  };
  if (op.dn) {
    const bool swap = op.swapped;
    const int64_t b = std::min(kBlockRows, inter);
    std::vector<float> c(op.n * 2 * b);  // [n, gate | up], or swapped [gate; up] x [n]
    for (int64_t j0 = 0; j0 < inter; j0 += b) {
      const int64_t cols = std::min(b, inter - j0), up = swap ? cols * op.n : cols;
      if (!gemm_block(op, swap, op.row(w, j0), cols, c.data(), 2 * cols) ||
          !gemm_block(op, swap, op.row(w, inter + j0), cols, c.data() + up, 2 * cols))
        return false;
      if (!swap) {
#pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < op.n; ++t) epilogue(c.data(), 2 * cols, t, j0, cols);
        continue;
      }
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < cols; ++j)  // gate row j <- silu(gate) * up, in float32
        op.lk->swiglu_from_float[0](c.data() + j * op.n, c.data() + up + j * op.n, c.data() + j * op.n, op.n);
      store_transposed(op, c.data(), cols, y, inter, j0);
    }
    return true;
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
  return true;
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
  Op op{d, params[0], nullptr, n, k, kIsaLinear[g_isa], nullptr, false};
  if (k == 0) {
    std::memset(params[2], 0, n * out * op.es());  // an empty sum; silu(0) * 0 = 0 too
    return 0;
  }
  const Route r = route(d, n);
  op.dn = r == kSkinny ? nullptr : dnnl();
  op.swapped = r == kSwapped;
  // x as float32 (see Op::xf): itself for float32; widened for the skinny kernel and for float16 on oneDNN
  std::vector<float> xf;
  if (d != 0 && (r == kSkinny || (r == kOnednn && d == 1))) {
    xf.resize(n * k);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n; ++t) op.lk->to_float[d](op.row(op.x, t), xf.data() + t * k, k);
  }
  op.xf = d == 0 ? static_cast<const float *>(op.x) : xf.data();
  return body(op, params[1], out, params[2]) ? 0 : 4;
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
double msw_read(const float *x, int64_t n) { return kIsaLinear[g_isa]->read_sum(x, n); }

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

// Binds oneDNN (`path`, when given, is dlopen'ed first: MindSpore's lib folder); "onednn", or "skinny" when
// libdnnl.so.3 is not loaded.
const char *msw_gemm(const char *path) {
  if (path && *path) {
    std::lock_guard<std::mutex> lock(g_dnnl_mutex);
    if (!g_dnnl.engine && bind_dnnl(dlopen(path, RTLD_NOW))) g_dnnl_tried = true;
  }
  return dnnl() ? "onednn" : "skinny";
}
// The route a linear op takes for `n` tokens of dtype index `dtype` (0 skinny, 1 oneDNN, 2 swapped), -1 for a
// bad dtype; msw_force_route(-1) restores the automatic choice. Returns the previous forcing.
int msw_route(int dtype, int64_t n) { return dtype >= 0 && dtype < 3 ? route(dtype, n) : -1; }
int msw_force_route(int r) { return g_forced_route.exchange(r >= 0 && r <= 2 ? r : -1); }

// Linear: x [..., K], w [M, K] -> y [..., M] = x w^T
int Linear(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  ++g_launches[2];
  return run_linear(nparam, params, ndims, shapes, dtypes, false, linear);
}
std::vector<int64_t> LinearInferShape(int *ndims, int64_t **shapes, AotExtra *) {
  return linear_out_shape(ndims, shapes, false);
}
TypeId LinearInferType(std::vector<TypeId> type_ids, AotExtra *) { return type_ids[0]; }

// GateUpSwiglu: x [..., K], w [2I, K] = [gate; up] -> y [..., I] = silu(x w_gate^T) * (x w_up^T)
int GateUpSwiglu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  ++g_launches[3];
  return run_linear(nparam, params, ndims, shapes, dtypes, true, gate_up_swiglu);
}
std::vector<int64_t> GateUpSwigluInferShape(int *ndims, int64_t **shapes, AotExtra *) {
  return linear_out_shape(ndims, shapes, true);
}
TypeId GateUpSwigluInferType(std::vector<TypeId> type_ids, AotExtra *) { return type_ids[0]; }

}  // extern "C"
