// The cpu backend's operators, registered with MindSpore as `aot` Custom ops, and the library's diagnostics.
//
//   SwigluFwd     x [..., 2I] packed [gate, up]        ->  y  [..., I] = silu(gate) * up
//   SwigluBwd     x [..., 2I], dy [..., I]             ->  dx [..., 2I] = [d_gate, d_up]
//   Linear        x [..., K], w [M, K]                 ->  y  [..., M] = x w^T
//   GateUpSwiglu  x [..., K], w [2I, K] = [gate; up]   ->  y  [..., I] = silu(x w_gate^T) * (x w_up^T)
//   MoeGateUpSwiglu  x [T, H], ids [T, k] int32, w [E, 2I, H]        ->  h [T k, I], rows grouped by expert
//   MoeDownCombine   h [T k, I], ids [T, k], weights [T, k] float32, w [E, H, I]  ->  y [T, H]
//                    y[t] = sum_j weights[t, j] * (h[row of (t, j)] w_down,e^T), summed in float32
//
//   Q{op}_{format}: the same four with quantized weights of a format of common.h's kFormatRows, its name's
//                    '-' as '_' (QLinear_int8, QMoeDownCombine_int8_group): w int8 followed by its float32
//                    scales: per row (int8: scale [M]; the Moe ops [E, 2I] and [E, H]), w[row] = scale[row] *
//                    q[row], widened exactly; or per group of K / G inputs (int8-group: scale [M, G]; [E, 2I, G],
//                    [E, H, G]), msw::Linear::scale. int4-group: w uint8 [M, K/2] (two weights a byte), scale
//                    [M, G] and, Q{op}_int4_group_zp, zero points [M, G] uint8. w8a8: int8 x int8 (x quantized
//                    per token in the op), scale [M]; w8a8_static: then the input scale and offset [1] ([E, 1]
//                    for the Moe ops). (Each its own name: MindSpore keeps one registration per aot op name.)
//   RmsNorm       x [..., H], w [H], eps [1] float32       ->  y [..., H] = x / sqrt(mean(x^2) + eps) * w
//   Add           a [...], b [...] (one shape)             ->  y = a + b (the residual connection)
//
// float32 / float16 / bfloat16 in and out (one dtype per call), float32 inside, rounded once. Each op has its
// C++ {name}InferShape / {name}InferType, which dynamic shapes and MindIR reloading need.
#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "amx.h"
#include "common.h"
#include "gemm.h"
#include "moe.h"
#include "onednn.h"

namespace {

// Launch counters by op name: what a compiled graph really runs (a diagnostic, read by the tests).
const char *const kOps[] = {"SwigluFwd",       "SwigluBwd",      "Linear",           "GateUpSwiglu",
                            "MoeGateUpSwiglu", "MoeDownCombine", "RmsNorm",          "Add",
                            "QLinear_int8",         "QGateUpSwiglu_int8",  "QMoeGateUpSwiglu_int8",
                            "QMoeDownCombine_int8", "QLinear_int8_group",  "QGateUpSwiglu_int8_group",
                            "QMoeGateUpSwiglu_int8_group", "QMoeDownCombine_int8_group", "QLinear_int4_group",
                            "QGateUpSwiglu_int4_group", "QLinear_int4_group_zp", "QGateUpSwiglu_int4_group_zp",
                            "QMoeGateUpSwiglu_int4_group", "QMoeGateUpSwiglu_int4_group_zp",
                            "QMoeDownCombine_int4_group", "QMoeDownCombine_int4_group_zp", "QLinear_w8a8",
                            "QGateUpSwiglu_w8a8", "QMoeGateUpSwiglu_w8a8", "QMoeDownCombine_w8a8",
                            "QLinear_w8a8_static", "QGateUpSwiglu_w8a8_static", "QMoeGateUpSwiglu_w8a8_static",
                            "QMoeDownCombine_w8a8_static"};
constexpr int kNumOps = sizeof kOps / sizeof kOps[0];
std::atomic<int64_t> g_launches[kNumOps];

int op_index(const char *name) {
  for (int i = 0; i < kNumOps; ++i)
    if (std::string(name) == kOps[i]) return i;
  return -1;
}

// The dtype of an op whose inputs and output all have one dtype, or -1.
int one_dtype(int nparam, const char **dtypes) {
  const int d = msw::dtype_index(dtypes[0]);
  for (int i = 1; i < nparam; ++i)
    if (std::string(dtypes[i]) != dtypes[0]) return -1;
  return d;
}

// Leading dims flattened into rows; the last dim of the packed tensor is 2 * inter.
void rows_inter(int ndim, const int64_t *shape, int64_t *rows, int64_t *inter) {
  *rows = 1;
  for (int i = 0; i + 1 < ndim; ++i) *rows *= shape[i];
  *inter = ndim > 0 ? shape[ndim - 1] / 2 : 0;
}

// The weights in one stored element of format `fmt` (-1: float): 2 for int4's bytes, else 1.
int64_t per_element(int fmt) { return fmt >= 0 && msw::kFormatRows[fmt].bits == 4 ? 2 : 1; }

// Whether the zero points at params[s + 1] have the shape of the scales at params[s] (int4 with zero points).
bool zeros_fit(int *ndims, int64_t **shapes, int s) {
  return ndims[s + 1] == ndims[s] && std::equal(shapes[s], shapes[s] + ndims[s], shapes[s + 1]);
}

// (x [..., k], w [m, k]; int4 [m, k / 2]) of a linear op of format `fmt`; false when they do not fit.
bool linear_shapes(int *ndims, int64_t **shapes, int64_t *n, int64_t *k, int64_t *m, int fmt) {
  const int64_t per = per_element(fmt);
  if (ndims[0] < 1 || ndims[1] != 2 || shapes[0][ndims[0] - 1] != shapes[1][1] * per) return false;
  *n = 1;
  for (int i = 0; i + 1 < ndims[0]; ++i) *n *= shapes[0][i];
  *k = shapes[1][1] * per;
  *m = shapes[1][0];
  return true;
}

bool is(const char *dtype, const char *name) { return std::string(dtype) == name; }

// Whether the static W8A8 input scale and offset at params[s], s + 1 hold `count` values each (1; experts: E).
bool act_fit(int *ndims, int64_t **shapes, int s, int64_t count) {
  for (int i = s; i < s + 2; ++i) {
    int64_t size = 1;
    for (int j = 0; j < ndims[i]; ++j) size *= shapes[i][j];
    if (size != count) return false;
  }
  return true;
}
bool takes_act(int fmt) { return fmt >= 0 && msw::kFormatRows[fmt].act_params > 0; }

// Whether an op of format `fmt` (-1: float) gets what it takes: the weights at params[w] in the format's container
// (int8; int4: uint8 bytes) with float32 scales after them (nparam: the op's count with scales; int4: and
// optionally uint8 zero points after the scales) for a format, in the float dtype without them for -1: 1 (2: with
// zero points) or 0, or -1 when they do not fit.
int quantized(int fmt, int nparam, const char **dtypes, int w, int with_scales) {
  if (fmt < 0) return nparam == with_scales - 1 ? 0 : -1;
  const bool int4 = msw::kFormatRows[fmt].bits == 4;
  const bool zero = int4 && nparam == with_scales + 1 && is(dtypes[w + 2], "uint8");
  const int act = msw::kFormatRows[fmt].act_params;  // static W8A8: float32 input scale and offset
  if (nparam != with_scales + (zero ? 1 : 0) + act || !is(dtypes[w], int4 ? "uint8" : "int8") ||
      msw::dtype_index(dtypes[w + 1]) != msw::kF32)
    return -1;
  for (int i = 0; i < act; ++i)
    if (msw::dtype_index(dtypes[w + 2 + i]) != msw::kF32) return -1;
  return zero ? 2 : 1;
}

// The groups of format `fmt`'s scales with `lead` leading dimensions (lead_dims), then the weights' rows (one scale
// per row: [..., rows]; grouped: [..., rows, groups], groups dividing k), or 0 when they do not fit (1 for float
// weights).
int64_t scale_groups(int fmt, int ndim, const int64_t *shape, int lead, const int64_t *lead_dims, int64_t k) {
  if (fmt < 0) return 1;
  const bool grouped = msw::kFormatRows[fmt].grouped;
  if (ndim != lead + (grouped ? 1 : 0) || !std::equal(lead_dims, lead_dims + lead, shape)) return 0;
  if (!grouped) return 1;
  return shape[lead] >= 1 && k % shape[lead] == 0 ? shape[lead] : 0;
}

// The format a call computes as: a grouped int8 row of one group per row is the per-row format.
int computed_format(int fmt, int64_t groups) {
  return fmt == msw::kFormatInt8Group && groups == 1 ? msw::kFormatInt8 : fmt;
}

// A linear op's call (x, w, y) or, int8, (x, w, scale, y): 0, or the aot status code. `packed`: w is
// [gate; up] and y gets the SwiGLU.
template <typename Body>
int run_linear(int fmt, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, bool packed,
               const Body &body) {
  const int q = quantized(fmt, nparam, dtypes, 1, 4);
  if (q < 0) return 1;
  const int d = msw::dtype_index(dtypes[0]), y = nparam - 1;
  if (d < 0 || !is(dtypes[y], dtypes[0]) || (!q && !is(dtypes[1], dtypes[0]))) return 2;
  int64_t n, k, m;
  if (!linear_shapes(ndims, shapes, &n, &k, &m, fmt) || (packed && m % 2)) return 3;
  const int64_t groups = q ? scale_groups(fmt, ndims[2], shapes[2], 1, &m, k) : 1;
  if (groups < 1) return 3;
  if (q == 2 && !zeros_fit(ndims, shapes, 2)) return 3;
  if (takes_act(fmt) && !act_fit(ndims, shapes, 3, 1)) return 3;
  const int64_t out = packed ? m / 2 : m;
  if (n * out == 0) return 0;
  if (k == 0) {
    std::memset(params[y], 0, n * out * msw::dtype_size(d));  // an empty sum; silu(0) * 0 = 0 too
    return 0;
  }
  msw::Linear call{d, params[0], n, k};
  call.scale = q ? static_cast<const float *>(params[2]) : nullptr;
  call.zero = q == 2 ? static_cast<const uint8_t *>(params[3]) : nullptr;
  call.groups = groups;
  call.format = computed_format(fmt, groups);
  if (takes_act(fmt))
    call.in_scale = static_cast<const float *>(params[3]), call.in_offset = static_cast<const float *>(params[4]);
  return body(call, params[1], out, params[y]) ? 0 : 4;
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

// ---- diagnostics (ctypes): the ISA and the GEMM path can be forced, for tests and the benchmarks ----------
const char *msw_isa() { return msw::isa().name; }
int msw_set_isa(const char *name) { return msw::set_isa(name); }
const char *msw_isa_name(int i) { return msw::isa_name(i); }
const char *msw_onednn(const char *path) { return msw::onednn::bind(path); }
const char *msw_dtype_name(int d) { return d >= 0 && d < msw::kDtypes ? msw::kDtypeNames[d] : nullptr; }
const char *msw_path_name(int p) { return p >= 0 && p < msw::kPaths ? msw::kPathNames[p] : nullptr; }
int msw_path(const char *dtype, int64_t n, int expert, const char *format) {  // format: a row's name, "": float
  const int d = msw::dtype_index(dtype);
  for (int f = 0; f < msw::kFormats; ++f)
    if (msw::kFormatRows[f].int8_x && std::string(format) == msw::kFormatRows[f].name) return msw::path_w8a8(n);
  return d < 0 ? -1 : msw::path(d, n, expert != 0, std::string(format) == msw::kFormatRows[msw::kFormatInt8].name);
}
int msw_force_path(int p) { return msw::force_path(p); }
const char *msw_tuning() {  // (built per call: msw_set_isa changes the ISA's entries)
  thread_local std::string json;
  json = msw::tuning_json();
  return json.c_str();
}
const char *msw_op_name(int i) { return i >= 0 && i < kNumOps ? kOps[i] : nullptr; }
const char *msw_format_name(int i) { return i >= 0 && i < msw::kFormats ? msw::kFormatRows[i].name : nullptr; }
int64_t msw_launches(const char *op) {
  const int i = op_index(op);
  return i < 0 ? -1 : g_launches[i].load();
}
// W8A8's AMX-INT8 panel kernel alone: acc [m][n padded to 16] = (xq - o) . w on the tiles (tiles != 0; -1 where
// the CPU has none) or on their scalar model (any CPU)
int msw_amx_s8_sums(int tiles, const int8_t *xq, int64_t n, int64_t k, int32_t o, const int8_t *w, int64_t m,
                    int32_t *acc) {
  if (tiles && !msw::amx::available_s8()) return -1;
  std::vector<char> xp;
  int64_t np = 0;
  const int32_t c = msw::amx::pack_panel_s8(xq, n, k, o, xp, np);
  (tiles ? msw::amx::i8_panel : msw::amx::i8_panel_model)(xp.data(), np, k, w, m, acc, c);
  return 0;
}

// ---- the ops ------------------------------------------------------------------------------------------------
int SwigluFwd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam != 2) return 1;
  ++g_launches[op_index("SwigluFwd")];
  const int d = one_dtype(2, dtypes);
  if (d < 0) return 2;
  int64_t rows, inter;
  rows_inter(ndims[0], shapes[0], &rows, &inter);
  if (ndims[0] < 1 || shapes[0][ndims[0] - 1] % 2 != 0) return 3;
  if (rows * inter > 0) msw::isa().swiglu_fwd[d](params[0], params[1], rows, inter);
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
  ++g_launches[op_index("SwigluBwd")];
  const int d = one_dtype(3, dtypes);
  if (d < 0) return 2;
  int64_t rows, inter;
  rows_inter(ndims[0], shapes[0], &rows, &inter);
  if (ndims[0] < 1 || shapes[0][ndims[0] - 1] % 2 != 0) return 3;
  if (rows * inter > 0) msw::isa().swiglu_bwd[d](params[0], params[1], params[2], rows, inter);
  return 0;
}

std::vector<int64_t> SwigluBwdInferShape(int *ndims, int64_t **shapes, AotExtra *) {
  return std::vector<int64_t>(shapes[0], shapes[0] + ndims[0]);
}

TypeId SwigluBwdInferType(std::vector<TypeId> type_ids, AotExtra *) { return type_ids[0]; }

static int linear_op(int fmt, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  return run_linear(fmt, nparam, params, ndims, shapes, dtypes, false, msw::linear);
}
static std::vector<int64_t> linear_shape(int *ndims, int64_t **shapes) {
  return linear_out_shape(ndims, shapes, false);
}

static int gate_up_swiglu_op(int fmt, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  return run_linear(fmt, nparam, params, ndims, shapes, dtypes, true, msw::gate_up_swiglu);
}
static std::vector<int64_t> gate_up_shape(int *ndims, int64_t **shapes) {
  return linear_out_shape(ndims, shapes, true);
}

// The experts' ops: 2-D x / h, [T, k] int32 ids, stacked 3-D weights of the float dtype, or int8 with float32
// scales [E, rows] or [E, rows, groups] (int4: [E, rows, in / 2] bytes with scales [E, rows, groups] and, with q 2,
// zero points of their shape; routing weights float32). The scales' groups (1 without int8), or 0.
static int64_t expert_in(int fmt, int64_t **shapes, int w) { return shapes[w][2] * per_element(fmt); }
static int64_t expert_groups(int fmt, int q, int *ndims, int64_t **shapes, int w) {
  const int64_t groups = scale_groups(fmt, ndims[w + 1], shapes[w + 1], 2, shapes[w], expert_in(fmt, shapes, w));
  if (q == 2 && !zeros_fit(ndims, shapes, w + 1)) return 0;
  return groups;
}

static int moe_gate_up_swiglu_op(int fmt, int nparam, void **params, int *ndims, int64_t **shapes,
                                 const char **dtypes) {
  const int q = quantized(fmt, nparam, dtypes, 2, 5);
  if (q < 0) return 1;
  const int d = msw::dtype_index(dtypes[0]), out = nparam - 1;
  if (d < 0 || !is(dtypes[1], "int32") || (!q && !is(dtypes[2], dtypes[0])) || !is(dtypes[out], dtypes[0]))
    return 2;
  if (ndims[0] != 2 || ndims[1] != 2 || ndims[2] != 3 || shapes[1][0] != shapes[0][0] ||
      expert_in(fmt, shapes, 2) != shapes[0][1] || shapes[2][1] % 2)
    return 3;
  const int64_t groups = expert_groups(fmt, q, ndims, shapes, 2);
  if (!groups || (takes_act(fmt) && !act_fit(ndims, shapes, 4, shapes[2][0]))) return 3;
  const int64_t tokens = shapes[0][0], k = shapes[1][1], experts = shapes[2][0], inter = shapes[2][1] / 2;
  if (tokens * k * inter == 0) return 0;
  const float *in_scale = takes_act(fmt) ? static_cast<const float *>(params[4]) : nullptr;
  const float *in_offset = takes_act(fmt) ? static_cast<const float *>(params[5]) : nullptr;
  return msw::moe_gate_up_swiglu(d, params[0], static_cast<const int32_t *>(params[1]), tokens, k, params[2],
                                 experts, shapes[0][1], inter, params[out],
                                 q ? static_cast<const float *>(params[3]) : nullptr, groups,
                                 computed_format(fmt, groups),
                                 q == 2 ? static_cast<const uint8_t *>(params[4]) : nullptr, in_scale, in_offset)
             ? 0 : 4;
}
static std::vector<int64_t> moe_gate_up_shape(int *ndims, int64_t **shapes) {
  const int64_t rows = shapes[1][0] < 0 || shapes[1][1] < 0 ? -1 : shapes[1][0] * shapes[1][1];
  return {rows, shapes[2][1] < 0 ? -1 : shapes[2][1] / 2};
}

static int moe_down_combine_op(int fmt, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  const int q = quantized(fmt, nparam, dtypes, 3, 6);
  if (q < 0) return 1;
  const int d = msw::dtype_index(dtypes[0]), out = nparam - 1;
  if (d < 0 || !is(dtypes[1], "int32") || msw::dtype_index(dtypes[2]) != msw::kF32 ||
      (!q && !is(dtypes[3], dtypes[0])) || !is(dtypes[out], dtypes[0]))
    return 2;
  if (ndims[0] != 2 || ndims[1] != 2 || ndims[2] != 2 || ndims[3] != 3 || shapes[2][0] != shapes[1][0] ||
      shapes[2][1] != shapes[1][1] || shapes[0][0] != shapes[1][0] * shapes[1][1] ||
      expert_in(fmt, shapes, 3) != shapes[0][1])
    return 3;
  const int64_t groups = expert_groups(fmt, q, ndims, shapes, 3);
  if (!groups || (takes_act(fmt) && !act_fit(ndims, shapes, 5, shapes[3][0]))) return 3;
  const int64_t tokens = shapes[1][0], k = shapes[1][1], hidden = shapes[3][1];
  const float *in_scale = takes_act(fmt) ? static_cast<const float *>(params[5]) : nullptr;
  const float *in_offset = takes_act(fmt) ? static_cast<const float *>(params[6]) : nullptr;
  if (tokens * hidden == 0) return 0;
  if (k * shapes[0][1] == 0) {
    std::memset(params[out], 0, tokens * hidden * msw::dtype_size(d));
    return 0;
  }
  return msw::moe_down_combine(d, params[0], static_cast<const int32_t *>(params[1]),
                               static_cast<const float *>(params[2]), tokens, k, params[3], shapes[3][0], hidden,
                               shapes[0][1], params[out], q ? static_cast<const float *>(params[4]) : nullptr,
                               groups, computed_format(fmt, groups),
                               q == 2 ? static_cast<const uint8_t *>(params[5]) : nullptr, in_scale, in_offset)
             ? 0 : 4;
}
static std::vector<int64_t> moe_down_shape(int *, int64_t **shapes) {
  return {shapes[1][0], shapes[3][1]};
}

int RmsNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  ++g_launches[op_index("RmsNorm")];
  if (nparam != 4) return 1;
  const int d = msw::dtype_index(dtypes[0]);
  if (d < 0 || std::string(dtypes[1]) != dtypes[0] || msw::dtype_index(dtypes[2]) != msw::kF32 ||
      std::string(dtypes[3]) != dtypes[0])
    return 2;
  if (ndims[0] < 1 || ndims[1] != 1 || shapes[1][0] != shapes[0][ndims[0] - 1]) return 3;
  int64_t rows = 1;
  for (int i = 0; i + 1 < ndims[0]; ++i) rows *= shapes[0][i];
  const int64_t h = shapes[1][0];
  const float eps = *static_cast<const float *>(params[2]);
  const size_t es = msw::dtype_size(d);
  const auto &ik = msw::isa();
  msw::parallel_ranges(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      ik.rms_norm_row[d](static_cast<const char *>(params[0]) + r * h * es, params[1], h, eps,
                         static_cast<char *>(params[3]) + r * h * es);
  }, (1 << 15) / std::max<int64_t>(h, 1));
  return 0;
}
std::vector<int64_t> RmsNormInferShape(int *ndims, int64_t **shapes, AotExtra *) {
  return std::vector<int64_t>(shapes[0], shapes[0] + ndims[0]);
}
TypeId RmsNormInferType(std::vector<TypeId> type_ids, AotExtra *) { return type_ids[0]; }

int Add(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  ++g_launches[op_index("Add")];
  if (nparam != 3) return 1;
  const int d = one_dtype(3, dtypes);
  if (d < 0) return 2;
  if (ndims[0] != ndims[1] || !std::equal(shapes[0], shapes[0] + ndims[0], shapes[1])) return 3;
  int64_t n = 1;
  for (int i = 0; i < ndims[0]; ++i) n *= shapes[0][i];
  constexpr int64_t kChunk = 1 << 14;
  const size_t es = msw::dtype_size(d);
  const auto &ik = msw::isa();
  msw::parallel_ranges((n + kChunk - 1) / kChunk, [&](int64_t c0, int64_t c1) {
    const int64_t i0 = c0 * kChunk, i1 = std::min(n, c1 * kChunk);
    ik.add[d](static_cast<const char *>(params[0]) + i0 * es, static_cast<const char *>(params[1]) + i0 * es,
              static_cast<char *>(params[2]) + i0 * es, i1 - i0);
  }, 2);
  return 0;
}
std::vector<int64_t> AddInferShape(int *ndims, int64_t **shapes, AotExtra *) {
  return std::vector<int64_t>(shapes[0], shapes[0] + ndims[0]);
}
TypeId AddInferType(std::vector<TypeId> type_ids, AotExtra *) { return type_ids[0]; }

}  // extern "C"

// ---- the GEMM ops, float and quantized (each its own name: MindSpore keeps one registration per aot op)
extern "C" {

#define MSW_GEMM_OP(name, impl, infer, fmt)                                                                    \
  int name(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {     \
    ++g_launches[op_index(#name)];                                                                             \
    return impl(fmt, nparam, params, ndims, shapes, dtypes);                                                  \
  }                                                                                                            \
  std::vector<int64_t> name##InferShape(int *ndims, int64_t **shapes, AotExtra *e) {                           \
    return infer(ndims, shapes);                                                                               \
  }                                                                                                            \
  TypeId name##InferType(std::vector<TypeId> type_ids, AotExtra *) { return type_ids[0]; }

// each op for float weights (-1) and for every format of kFormatRows, named after it (int4 also with zero points,
// _zp: MindSpore keeps one registration, so one input count, per name)
#define MSW_GEMM_OPS(name, impl, infer)                                                                        \
  MSW_GEMM_OP(name, impl, infer, -1)                                                                           \
  MSW_GEMM_OP(Q##name##_int8, impl, infer, msw::kFormatInt8)                                                  \
  MSW_GEMM_OP(Q##name##_int8_group, impl, infer, msw::kFormatInt8Group)                                       \
  MSW_GEMM_OP(Q##name##_int4_group, impl, infer, msw::kFormatInt4Group)                                       \
  MSW_GEMM_OP(Q##name##_int4_group_zp, impl, infer, msw::kFormatInt4Group)                                    \
  MSW_GEMM_OP(Q##name##_w8a8, impl, infer, msw::kFormatW8A8)                                                  \
  MSW_GEMM_OP(Q##name##_w8a8_static, impl, infer, msw::kFormatW8A8Static)

MSW_GEMM_OPS(Linear, linear_op, linear_shape)
MSW_GEMM_OPS(GateUpSwiglu, gate_up_swiglu_op, gate_up_shape)
MSW_GEMM_OPS(MoeGateUpSwiglu, moe_gate_up_swiglu_op, moe_gate_up_shape)
MSW_GEMM_OPS(MoeDownCombine, moe_down_combine_op, moe_down_shape)
#undef MSW_GEMM_OPS
#undef MSW_GEMM_OP

}  // extern "C"
