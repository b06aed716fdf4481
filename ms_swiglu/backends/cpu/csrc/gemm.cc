// The linear kernels. Few tokens (decode): the skinny kernel (isa_linear.inc), which reads each weight row once
// for all tokens. More tokens: oneDNN's matmul primitive (onednn.cc), reading the weights in place, plain or
// with the roles swapped. Weights stay in their dtype, every sum is float32, and each output is rounded once.
#include "gemm.h"

#include <algorithm>
#include <atomic>
#include <utility>
#include <cstdio>
#include <cstring>
#include <vector>

#include "amx.h"
#include "common.h"
#include "onednn.h"
#include "pool.h"
#include "tuning.h"

namespace msw {

const char *const kPathNames[kPaths] = {"skinny", "onednn", "onednn-swapped", "amx", "panel"};

namespace {

constexpr int64_t kSerialElements = kTuning.serial_elements;

std::atomic<int> g_forced{-1};

// The dtype oneDNN multiplies weights of dtype d in: d itself or, where this oneDNN and CPU have no matmul for d
// (16-bit without AVX-512), float32, with x and each block of weight rows widened first (exactly), which still
// runs faster than the skinny kernel above its range; -1: none.
int w_dtype(int d) { return onednn::takes(d) ? d : d != kF32 && onednn::takes(kF32) ? kF32 : -1; }

// The dtype oneDNN reads x in: float32 where the weights are widened to it, and float16 goes in widened (float32 x
// float16 weights ran faster than float16 x float16; every product is exact either way)
int a_dtype(int d) { return d == kF16 || w_dtype(d) == kF32 ? kF32 : d; }

// Whether oneDNN takes 16-bit weights of dtype d only widened to float32: then the float32 rows of the tuning
// table's swapped ranges hold, and the skinny kernel keeps kTuning.skinny_max_widened tokens.
bool widened(int d) { return d != kF32 && w_dtype(d) == kF32; }

// A call on its path: x as float32 (x itself for float32) where the path reads float32.
struct Op {
  int d, yd;  // the dtype of x and w, of y
  const void *x;
  const float *xf;  // the skinny kernel reads float32 x; oneDNN reads float16 x widened (see a_d())
  const uint16_t *xv;  // the amx path reads x as B tiles (amx::to_vnni)
  const float *xsum;  // and, with int8 weights, each token's sum over k (amx::q8_sums)
  int64_t n, k;
  Path path;
  const IsaKernels *ik;
  const float *scale;  // int8 weights: their scales [m, groups]; nullptr: weights in dtype d
  int64_t groups;
  const WeightTraits *wk = nullptr;  // the ISA's kernels for the weights' format
  int bits = 8;  // of a quantized weight (int4: two a byte)
  const uint8_t *zero = nullptr;  // int4's zero points [m, groups]; nullptr: 8
  const void *q4x = nullptr;  // int4 at one token: x as its skinny kernel reads it (WeightTraits::prep_q4) and
  const float *q4sums = nullptr;  // each group's sum of x
  // one token of 16-bit x with int8 weights (int4 on AVX2): x split in int16 parts for the ISA's integer dot
  // (WeightTraits::split_x), which reads the rows faster than the float32 FMA kernel. Not float32 x: its 24-bit significands
  // leave residuals wherever |x| < max |x| / 64 on VPDPWSSD, and would round past float32's own precision on VPMADDWD.
  const SplitX *split = nullptr;
  // the panel path: x transposed, [k][np] (IsaKernels::panel_x)
  const float *xt = nullptr;
  int64_t np = 0;
  int a_d() const { return a_dtype(d); }  // x as oneDNN's source operand
  int w_d() const { return w_dtype(d); }  // the weights as oneDNN's operand (int8: widened to it)
  int sx_d() const { return w_d() == d ? d : kF32; }  // x as the swapped path's weights operand
  bool grouped() const { return scale && (groups > 1 || bits == 4); }  // weights with group-wise scales
  bool decompress() const {
    return scale && !grouped() && n <= kTuning.onednn_int8_max && onednn::takes_q8(a_d());
  }
  int64_t block_rows() const {
    return widened(d) && !grouped() && !decompress() ? kTuning.widened_block_rows : kTuning.onednn_block_rows;
  }
  // the skinny kernel reads x as it is: bfloat16 x on VDPBF16PS (int8 weights widened to bfloat16 in registers)
  bool bf16_dot() const {
    if (bits == 4) {  // int4: groups of 2^j >= 32 inputs in chunks of 128 (isa_linear.inc: skinny_bf16_q4)
      const int64_t g = k / groups;
      return d == kBF16 && wk->skinny_bf16_q4 && g >= 32 && (g & (g - 1)) == 0 && k % 128 == 0;
    }
    return d == kBF16 && wk->skinny_bf16 && (!scale || n >= kTuning.bf16_dot_int8_from);
  }
  // whether the path's kernel takes the weights' group-wise scales itself (else stream_grouped dequantizes first)
  bool takes_groups() const {
    const int64_t g = k / groups;
    const bool pow2 = (g & (g - 1)) == 0;
    if (bits == 4) return path == kSkinny && n == 1 && g % 32 == 0;  // (the int4 skinny range: one token)
    if (path == kPanel) return true;
    if (path != kSkinny) return false;
    return bf16_dot() ? g >= 32 && pow2 : g % 16 == 0 && (n == 1 || pow2);
  }
  const void *as(int xd) const { return xd == d ? x : static_cast<const void *>(xf); }  // x in dtype xd
  const void *a() const { return as(a_d()); }
  size_t es() const { return dtype_size(d); }
  size_t yes() const { return dtype_size(yd); }
  size_t row_bytes() const { return scale ? size_t(k) * bits / 8 : k * es(); }
  const char *row(const void *w, int64_t r) const { return static_cast<const char *>(w) + r * row_bytes(); }
  // the group-wise scales (and int4's zero points) of the rows from r on; nullptr for other weights
  const float *scales(int64_t r) const { return grouped() ? scale + r * groups : nullptr; }
  const uint8_t *zeros(int64_t r) const { return zero ? zero + r * groups : nullptr; }
  // [rows, k] of the quantized rows from r in dtype wd, rounded once (group-wise scales, int4)
  void widen(int wd, const void *w, int64_t r, int64_t rows, void *to) const {
    if (bits == 4) return wk->widen_q4[wd](row(w, r), to, rows, k, scales(r), zeros(r), groups);
    wk->widen[wd](row(w, r), to, rows, k, scales(r), groups);
  }
  // c[t * ldc + j] *= scale[r0 + j]: int8 weights' per-row scales, applied to the float32 sums
  void rescale(int64_t r0, int64_t rows, float *c, int64_t ldc, bool transposed = false) const {
    if (!scale || grouped()) return;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < rows; ++j) (transposed ? c[j * ldc + t] : c[t * ldc + j]) *= scale[r0 + j];
  }
  // weight rows per call of stream(): the amx path blocks its rows itself (amx.cc), in larger blocks once there is
  // more than one tile of 16 tokens
  int64_t step(int64_t skinny_rows) const { return path == kAmx && n > 16 ? kTuning.amx_call_rows : skinny_rows; }
  // c[t * ldc + j] = sum_k x[t, k] w[r0 + j, k], j < rows: the weight-streaming kernel of the path. Group-wise
  // scales go into the skinny and panel kernels (each group's sum, or each weight, times its scale), which read
  // the int8 rows once; elsewhere the rows are dequantized first (stream_grouped).
  void stream(const void *w, int64_t r0, int64_t rows, float *c, int64_t ldc) const {
    if (path == kAmx && bits == 4 && n > 16 && (k / groups) % 32 == 0)  // int4 into the tiles as they are packed
      return amx::rows_q4(xv, n, k, reinterpret_cast<const uint8_t *>(row(w, r0)), rows, c, ldc, scales(r0), zeros(r0),
                          groups);
    if (grouped() && !takes_groups()) return stream_grouped(w, r0, rows, c, ldc);
    const void *w_rows = row(w, r0);
    const float *sc = scales(r0);
    const int64_t gs = grouped() ? groups : 1;
    if (bits == 4) {  // (one token on the skinny path: takes_groups)
      if (split) return wk->skinny_parts_q4(*split, k, w_rows, rows, c, sc, zeros(r0), gs);
      if (bf16_dot())
        return wk->skinny_bf16_q4(static_cast<const bf16 *>(q4x), q4sums, n, k, w_rows, rows, c, ldc, sc, zeros(r0),
                                  gs);
      return wk->skinny_q4(static_cast<const float *>(q4x), q4sums, n, k, w_rows, rows, c, ldc, sc, zeros(r0), gs);
    }
    if (path == kAmx && scale) {  // int8 on tiles: widened to bfloat16 as the panels are packed
      amx::rows(xv, n, k, static_cast<const int8_t *>(w_rows), rows, c, ldc, xsum);
    } else if (path == kAmx) {
      amx::rows(xv, n, k, static_cast<const uint16_t *>(w_rows), rows, c, ldc);
    } else if (path == kPanel) {
      wk->panel(xt, n, np, k, w_rows, rows, c, ldc, sc, gs);
    } else if (split) {
      wk->skinny_parts(*split, k, w_rows, rows, c);
    } else if (bf16_dot()) {
      wk->skinny_bf16(static_cast<const bf16 *>(x), n, k, w_rows, rows, c, ldc, sc, gs);
    } else {
      wk->skinny(xf, n, k, w_rows, rows, c, ldc, sc, gs);
    }
    rescale(r0, rows, c, ldc);
  }
  // stream() over int8 rows with group-wise scales: dequantized to dtype d a few rows at a time into a buffer of the
  // calling thread (in L2, half a page from the x the kernel reads), each piece streamed as weights of dtype d; the
  // amx path takes the call's rows at once where the tokens' tiles outgrow L2 (its blocks share them: amx.cc)
  void stream_grouped(const void *w, int64_t r0, int64_t rows, float *c, int64_t ldc) const {
    Op f = *this;
    f.scale = nullptr, f.zero = nullptr, f.bits = 8;
    f.wk = &ik->weights[d];
    const int64_t piece = path == kAmx && n * k * es() > kTuning.amx_dequant_x_bytes
                              ? rows
                              : std::max<int64_t>(16, kTuning.dequant_bytes / (k * es()) / 16 * 16);  // amx: m % 16
    thread_local std::vector<char> buf;  // grown once per calling thread
    buf.resize(std::max(buf.size(), size_t(piece * k * es() + 4096)));
    char *to = buf.data() + half_page_from(f.bf16_dot() ? x : static_cast<const void *>(xf), buf.data());
    for (int64_t i0 = 0; i0 < rows; i0 += piece) {
      const int64_t p = std::min(piece, rows - i0);
      widen(d, w, r0 + i0, p, to);
      f.stream(to, 0, p, c + i0, ldc);
    }
  }
};

// y[t, ldy * t + j0 + j] (dtype) = ct[j * n + t], j < cols: a swapped GEMM's block transposed back, rounded once.
void store_transposed(const Op &op, const float *ct, int64_t cols, void *y, int64_t ldy, int64_t j0) {
  parallel_ranges(op.n, [&](int64_t t0, int64_t t1) {
    std::vector<float> row(cols);
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t j = 0; j < cols; ++j) row[j] = ct[j * op.n + t];
      op.ik->from_float[op.yd](row.data(), static_cast<char *>(y) + (t * ldy + j0) * op.yes(), cols);
    }
  });
}

// c = (x w[r0 : r0 + rows]^T) [n, rows] into c (ldc), or swapped, c^T = w[r0 : r0 + rows] x^T [rows, n];
// float32. int8 weights: not swapped, through oneDNN's weight decompression where it has it, to
// kTuning.onednn_int8_max tokens (Op::decompress; path() keeps them off the swapped path); else, and 16-bit
// weights oneDNN has no matmul for, widened (exactly) to the dtype oneDNN takes (Op::w_d), the whole block at once.
bool gemm_block(const Op &op, bool swap, const void *w, int64_t r0, int64_t rows, float *c, int64_t ldc) {
  const int wd = op.w_d();
  auto gemm = [&](const void *w_rows, int64_t m, float *cm) {
    return swap ? onednn::gemm(wd, w_rows, m, op.sx_d(), op.as(op.sx_d()), op.n, op.k, kF32, cm, op.n)
                : onednn::gemm(op.a_d(), op.a(), op.n, wd, w_rows, m, op.k, kF32, cm, ldc);
  };
  if (!op.scale && wd == op.d) return gemm(op.row(w, r0), rows, c);
  // (group-wise scales: the block dequantized first, which ran as fast as oneDNN's grouped weight decompression)
  if (op.decompress() && !swap)
    return onednn::gemm_q8(op.a_d(), op.a(), op.n, reinterpret_cast<const int8_t *>(op.row(w, r0)), op.scale + r0,
                           rows, op.k, kF32, c, ldc);
  thread_local std::vector<char> wide;  // grown once per calling thread (no page faults per call)
  const size_t wes = dtype_size(wd);
  wide.resize(std::max(wide.size(), size_t(rows * op.k * wes)));
  char *buf = wide.data();  // (the pool's threads have their own `wide`)
  parallel_ranges(rows, [&](int64_t i0, int64_t i1) {
    op.widen(wd, w, r0 + i0, i1 - i0, buf + i0 * op.k * wes);
  }, kSerialElements / std::max<int64_t>(op.k, 1));
  if (!gemm(buf, rows, c)) return false;
  op.rescale(r0, rows, c, swap ? op.n : ldc, swap);
  return true;
}

// x [n, k] (`bytes`) copied to a buffer of the calling thread that starts half a page from w (mod 4 KB). The skinny
// kernel's tiles load R weight rows and several rows of x at the same offset i; where k's rows are a multiple of
// 4 KB (k = 4096 in bfloat16) every weight row falls in one L1 set, and x's rows with them wherever x starts at w's
// offset in its page, which MindSpore's allocator does give (both 16 bytes into a page).
const void *placed(const void *x, size_t bytes, const void *w) {
  thread_local std::vector<char> buf;  // grown once per calling thread
  buf.resize(std::max(buf.size(), bytes + 4096));
  const size_t at = half_page_from(w, buf.data());
  std::memcpy(buf.data() + at, x, bytes);
  return buf.data() + at;
}

// Runs body(op) with x widened where the path reads float32, or laid out as B tiles for the amx path (which
// falls back to the skinny kernel where the tiles do not cover k or the `rows` it streams), and for the skinny
// kernel's multi-token tiles placed against the weights w. (int8 with group-wise scales takes the paths of weights
// of dtype d, which were as fast for it as for those.)
template <typename Body>
bool run(const Linear &call, const void *w, int64_t rows, const Body &body) {
  Op op{call.d, call.yd < 0 ? call.d : call.yd, call.x, nullptr, nullptr, nullptr, call.n, call.k,
        path(call.d, call.n, call.expert, call.format == kFormatInt8), &isa(), call.scale, call.groups};
  op.wk = &op.ik->weights[call.format < 0 ? WeightFormat(op.d) : kFormatRows[call.format].weights];
  op.bits = call.format < 0 ? 8 : kFormatRows[call.format].bits;
  op.zero = call.zero;
  if (op.path == kAmx && !amx::takes(op.k, rows)) op.path = kSkinny;
  amx::TileVector<uint16_t> xv;
  if (op.path == kAmx) {
    xv.resize(amx::vnni_elements(op.n, op.k));
    parallel_ranges(op.k / 2, [&](int64_t p0, int64_t p1) {
      amx::to_vnni(static_cast<const uint16_t *>(op.x), op.n, op.k, xv.data(), p0, p1);
    }, kSerialElements / std::max<int64_t>(op.n, 1));
    op.xv = xv.data();
  }
  std::vector<float> xsum;
  if (op.path == kAmx && op.scale && !op.grouped()) {
    xsum.resize(op.n);
    parallel_ranges(op.n, [&](int64_t t0, int64_t t1) {
      amx::q8_sums(static_cast<const uint16_t *>(op.x), op.n, op.k, xsum.data(), t0, t1);
    }, kSerialElements / std::max<int64_t>(op.k, 1));
    op.xsum = xsum.data();
  }
  std::vector<float> xf;
  const bool onednn_f32 = (op.path == kOnednn && op.a_d() == kF32) || (op.path == kSwapped && op.sx_d() == kF32);
  if (op.d != kF32 && ((op.path == kSkinny && !op.bf16_dot()) || op.path == kPanel || onednn_f32)) {
    xf.resize(op.n * op.k);
    parallel_ranges(op.n, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        op.ik->to_float[op.d](static_cast<const char *>(op.x) + t * op.k * op.es(), xf.data() + t * op.k, op.k);
    }, kSerialElements / std::max<int64_t>(op.k, 1));
  }
  op.xf = op.d == kF32 ? static_cast<const float *>(op.x) : xf.data();
  thread_local std::vector<float> xt;  // grown once per calling thread
  if (op.path == kPanel) {
    op.np = op.ik->panel_x(op.xf, op.n, op.k, xt);
    op.xt = xt.data();
  }
  if (op.path == kSkinny && op.n > 1) {  // (one token's tiles read one row of x)
    if (op.bf16_dot())
      op.x = placed(op.x, op.n * op.k * op.es(), w);
    else
      op.xf = static_cast<const float *>(placed(op.xf, op.n * op.k * sizeof(float), w));
  }
  thread_local std::vector<char> q4x;  // grown once per calling thread
  thread_local std::vector<float> q4sums;
  if (op.bits == 4 && op.takes_groups()) {  // int4 at one token: x prepared once for every row block
    q4sums.resize(op.n * op.groups);
    q4x.resize(op.n * op.k * (op.bf16_dot() ? sizeof(bf16) : sizeof(float)));
    if (op.bf16_dot())
      op.wk->prep_bf16_q4(static_cast<const bf16 *>(op.x), op.n, op.k, op.groups,
                          reinterpret_cast<bf16 *>(q4x.data()), q4sums.data());
    else
      op.wk->prep_q4(op.xf, op.n, op.k, op.groups, reinterpret_cast<float *>(q4x.data()), q4sums.data());
    op.q4x = q4x.data(), op.q4sums = q4sums.data();
  }
  SplitX split;
  if (op.path == kSkinny && op.n == 1 && op.d != kF32 && op.wk->split_x && op.wk->split_x(op.xf, op.k, split))
    op.split = &split;
  return body(op);
}

// The skinny kernel's range of tokens for dtype d on this CPU (the VDPBF16PS one's where it is in use).
int64_t skinny_max(int d, bool expert) {
  if (widened(d)) return kTuning.skinny_max_widened;
  if (d != kBF16 || !isa().weights[kWeightsBF16].skinny_bf16) return kTuning.skinny_max[d];
  return expert ? kTuning.skinny_max_bf16_dot_expert : kTuning.skinny_max_bf16_dot;
}

// The panel path's range of tokens for dtype d (int8 weights: q8) on this CPU; none where its ISA has no panel
// kernel, and not for a MoE block's experts.
Tokens panel_range(int d, bool expert, bool q8) {
  constexpr Tokens kNone = {1, 0};
  if (!isa().panel_x || expert) return kNone;
  if (q8) return a_dtype(d) == kF32 ? kTuning.panel_int8[d] : kNone;
  return widened(d) ? kTuning.panel[d] : kNone;
}

// The swapped path's range of tokens for dtype d: float32's where oneDNN takes d widened to float32.
Tokens swap_range(int d, bool expert) {
  const int t = widened(d) ? kF32 : d;
  return expert ? kTuning.swapped_expert[t] : kTuning.swapped[t];
}

}  // namespace

Path path(int d, int64_t n, bool expert, bool q8) {
  const int forced = g_forced;
  const Tokens swap = swap_range(d, expert), panel = panel_range(d, expert, q8);
  const Path p = forced >= 0 ? Path(forced)
                 : q8 && n <= kTuning.skinny_max_int8[d] ? kSkinny
                 : kTuning.amx[d].has(n) && amx::available() ? kAmx
                 : panel.has(n) ? kPanel
                 : n <= skinny_max(d, expert) ? kSkinny
                 : swap.has(n) ? kSwapped : kOnednn;
  if (p == kAmx) return d == kBF16 && amx::available() ? kAmx : kSkinny;
  if (p == kPanel) return isa().panel_x ? kPanel : kSkinny;
  if (p == kSkinny || w_dtype(d) < 0) return kSkinny;
  // int8 weights: not swapped. oneDNN's weight decompression takes them as the weights operand only (to
  // kTuning.onednn_int8_max tokens), and ran faster than the int8 rows swapped and widened.
  if (q8 && (p == kOnednn || forced < 0) && onednn::takes_q8(a_dtype(d))) return kOnednn;
  return p;
}

Path path_w8a8(int64_t n) {
  const int forced = g_forced;
  const WeightTraits &w8 = isa().weights[kWeightsW8A8];
  if (!w8.i8_panel) return kSkinny;
  if (forced == kSkinny || forced == kPanel) return Path(forced);
  if (forced < 0 && w8.i8_rows_first && n <= kTuning.w8a8_rows_max) return kSkinny;
  if (forced < 0 && n <= kTuning.w8a8_panel_max) return kPanel;
  return onednn::takes_s8() ? kOnednn : kPanel;  // (oneDNN's int8 matmul only where it is exact: onednn.cc)
}

int force_path(int p) { return g_forced.exchange(p >= 0 && p < kPaths ? p : -1); }

namespace {

// ", \"key\": {\"float32\": value(0), ...}" of tuning_json()
std::string by_dtype(const char *key, std::string (*value)(int d)) {
  std::string s = std::string(", \"") + key + "\": {";
  for (int d = 0; d < kDtypes; ++d) s += std::string(d ? ", " : "") + "\"" + kDtypeNames[d] + "\": " + value(d);
  return s + "}";
}
std::string json(Tokens r) {
  return r.lo <= r.hi ? "[" + std::to_string(r.lo) + ", " + std::to_string(r.hi) + "]" : std::string("null");
}
std::string json(bool b) { return b ? "true" : "false"; }

}  // namespace

std::string tuning_json() {
  std::string s = "{\"paths\": [";
  for (int p = 0; p < kPaths; ++p) s += std::string(p ? ", " : "") + "\"" + kPathNames[p] + "\"";
  s += "]";
  // as path() takes them on this CPU
  s += by_dtype("skinny_max_tokens", [](int d) { return std::to_string(skinny_max(d, false)); });
  s += by_dtype("skinny_max_tokens_expert", [](int d) { return std::to_string(skinny_max(d, true)); });
  s += by_dtype("skinny_max_tokens_int8", [](int d) { return std::to_string(kTuning.skinny_max_int8[d]); });
  s += by_dtype("amx_tokens", [](int d) { return json(kTuning.amx[d]); });
  s += by_dtype("swapped_tokens", [](int d) { return json(swap_range(d, false)); });
  s += by_dtype("swapped_tokens_expert", [](int d) { return json(swap_range(d, true)); });
  s += by_dtype("panel_tokens", [](int d) { return json(panel_range(d, false, false)); });
  s += by_dtype("panel_tokens_int8", [](int d) { return json(panel_range(d, false, true)); });
  // oneDNN's weight decompression, by the dtype of x, to this many tokens (above: widened)
  s += by_dtype("onednn_int8_weights", [](int d) { return json(onednn::takes_q8(a_dtype(d))); });
  s += ", \"onednn_int8_weights_max_tokens\": " + std::to_string(kTuning.onednn_int8_max);
  // 16-bit weights oneDNN takes only widened to float32
  s += by_dtype("onednn_float32_for", [](int d) { return json(widened(d)); });
  s += ", \"amx_available\": " + json(amx::available());
  s += ", \"amx_dequant_x_bytes\": " + std::to_string(kTuning.amx_dequant_x_bytes);
  s += ", \"block_rows\": " + std::to_string(kTuning.onednn_block_rows);
  const SkinnyTiles &tiles = *isa().tiles;
  s += ", \"skinny_tile_rows\": {\"16bit_1_token\": " + std::to_string(tiles.rows_16bit_1) +
       ", \"int8_1_token\": " + std::to_string(tiles.rows_int8_1) + ", \"int4_1_token\": " +
       std::to_string(tiles.rows_int4_1) + ", \"1_2_tokens\": " +
       std::to_string(tiles.rows_1_2) + ", \"other\": " + std::to_string(tiles.rows) + ", \"int8_other\": " +
       std::to_string(tiles.rows_int8) + "}";
  const auto quoted = [](const char *name) { return name ? "\"" + std::string(name) + "\"" : std::string("null"); };
  s += ", \"int8_one_token_dot\": " + quoted(isa().weights[kWeightsInt8].dot);
  s += ", \"int4_one_token_dot\": " + quoted(isa().weights[kWeightsInt4Group].dot);  // (16-bit x)
  // bfloat16 x read as it is by the skinny kernel (int8 rows with group-wise scales: widened times them to bfloat16)
  // W8A8: the integer dot, and the row kernel's tokens (the panel kernel above, where the ISA has one)
  // (null: the kernel at every count above the previous one)
  const WeightTraits &w8 = isa().weights[kWeightsW8A8];
  const bool panel = w8.i8_panel, dnn = panel && onednn::takes_s8();
  s += ", \"w8a8_dot\": " + quoted(w8.i8_dot) + ", \"w8a8_panel_dot\": " + quoted(w8.i8_panel_dot);
  const int64_t rows_max = w8.i8_rows_first ? kTuning.w8a8_rows_max : 0;
  s += ", \"w8a8_rows_max_tokens\": " + (panel ? std::to_string(rows_max) : std::string("null"));
  s += ", \"w8a8_panel_max_tokens\": " + (dnn ? std::to_string(kTuning.w8a8_panel_max) : std::string("null"));
  s += ", \"w8a8_onednn\": " + quoted(dnn ? onednn::s8_impl() : nullptr);  // above the panel range
  s += ", \"bfloat16_x_dot\": " + quoted(isa().weights[kWeightsBF16].skinny_bf16 ? "vdpbf16ps" : nullptr);
  return s + "}";
}

bool linear(const Linear &call, const void *w, int64_t m, void *y) {
  if (call.format >= 0 && kFormatRows[call.format].int8_x) return linear_w8a8(call, w, m, y, false);
  return run(call, w, m, [&](const Op &op) {
    if (op.path == kOnednn && !op.scale && op.w_d() == op.d)
      return onednn::gemm(op.a_d(), op.a(), op.n, op.d, w, m, op.k, op.yd, y, m);
    if (op.path == kOnednn && op.decompress() &&  // (else in blocks)
        onednn::gemm_q8(op.a_d(), op.a(), op.n, static_cast<const int8_t *>(w), op.scale, m, op.k, op.yd, y, m))
      return true;
    if (op.path == kSwapped || op.path == kOnednn) {  // (plain with widened weights: in a float32 block)
      const bool swap = op.path == kSwapped;
      const int64_t b = std::min(op.block_rows(), m);
      std::vector<float> c(b * op.n);
      for (int64_t j0 = 0; j0 < m; j0 += b) {
        const int64_t rows = std::min(b, m - j0);
        if (!gemm_block(op, swap, w, j0, rows, c.data(), swap ? op.n : rows)) return false;
        if (swap) {
          store_transposed(op, c.data(), rows, y, m, j0);
          continue;
        }
        parallel_ranges(op.n, [&](int64_t t0, int64_t t1) {
          for (int64_t t = t0; t < t1; ++t)
            op.ik->from_float[op.yd](c.data() + t * rows, static_cast<char *>(y) + (t * m + j0) * op.yes(), rows);
        });
      }
      return true;
    }
    const int64_t step = op.step(kTuning.skinny_block_rows);
    // blocks handed out one at a time, so that a thread that starts late does not leave the other waiting at the end
    parallel_each((m + step - 1) / step, [&](int64_t b) {
      const int64_t j0 = b * step, rows = std::min(step, m - j0);
      if (op.yd == kF32) return op.stream(w, j0, rows, static_cast<float *>(y) + j0, m);
      thread_local std::vector<float> c;
      c.resize(op.n * step);
      op.stream(w, j0, rows, c.data(), step);
      for (int64_t t = 0; t < op.n; ++t)
        op.ik->from_float[op.yd](c.data() + t * step, static_cast<char *>(y) + (t * m + j0) * op.yes(), rows);
    });
    return true;
  });
}

// y [n, inter] = silu(x w_gate^T) * (x w_up^T), w = [w_gate; w_up] [2 inter, k]: the SwiGLU is the GEMM's
// epilogue, applied to one block of columns at a time, so [n, 2 inter] never exists.
bool gate_up_swiglu(const Linear &call, const void *w, int64_t inter, void *y) {
  if (call.format >= 0 && kFormatRows[call.format].int8_x) return linear_w8a8(call, w, inter, y, true);
  return run(call, w, inter, [&](const Op &op) {
    auto epilogue = [&](const float *c, int64_t ldc, int64_t t, int64_t j0, int64_t cols) {  // c: [gate | up]
      op.ik->swiglu_from_float[op.yd](c + t * ldc, c + t * ldc + cols,
                                      static_cast<char *>(y) + (t * inter + j0) * op.yes(), cols);
    };
    if (op.path == kOnednn || op.path == kSwapped) {
      const bool swap = op.path == kSwapped;
      const int64_t b = std::min(op.block_rows(), inter);
      std::vector<float> c(op.n * 2 * b);  // [n, gate | up], or swapped [gate; up] x [n]
      for (int64_t j0 = 0; j0 < inter; j0 += b) {
        const int64_t cols = std::min(b, inter - j0), up = swap ? cols * op.n : cols;
        if (!gemm_block(op, swap, w, j0, cols, c.data(), 2 * cols) ||
            !gemm_block(op, swap, w, inter + j0, cols, c.data() + up, 2 * cols))
          return false;
        if (!swap) {
          parallel_ranges(op.n, [&](int64_t t0, int64_t t1) {
            for (int64_t t = t0; t < t1; ++t) epilogue(c.data(), 2 * cols, t, j0, cols);
          });
          continue;
        }
        parallel_ranges(cols, [&](int64_t c0, int64_t c1) {
          for (int64_t j = c0; j < c1; ++j)  // gate row j <- silu(gate) * up, in float32
            op.ik->swiglu_from_float[kF32](c.data() + j * op.n, c.data() + up + j * op.n, c.data() + j * op.n, op.n);
        });
        store_transposed(op, c.data(), cols, y, inter, j0);
      }
      return true;
    }
    const int64_t step = op.step(kTuning.skinny_block_cols);
    parallel_each((inter + step - 1) / step, [&](int64_t b) {  // as in linear()
      const int64_t j0 = b * step, cols = std::min(step, inter - j0);
      thread_local std::vector<float> c;
      c.resize(op.n * 2 * step);
      op.stream(w, j0, cols, c.data(), 2 * cols);
      op.stream(w, inter + j0, cols, c.data() + cols, 2 * cols);
      for (int64_t t = 0; t < op.n; ++t) epilogue(c.data(), 2 * cols, t, j0, cols);
    });
    return true;
  });
}

}  // namespace msw
