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

namespace msw {

const char *const kPathNames[kPaths] = {"skinny", "onednn", "onednn-swapped", "amx", "panel"};

namespace {

// The tuning table, by dtype (float32, float16, bfloat16), measured with tools/bench_linear.py at llama-7b
// shapes: the skinny kernel up to kSkinnyMax tokens, the swapped oneDNN path within kSwap, plain oneDNN above.
// bfloat16 there only where the amx path does not take it first (a CPU without AMX): at 6-16 tokens the skinny
// kernel ran 16-28 ms against oneDNN's 36-53 ms (AMD EPYC, llama-7b gate_up + down, bench_linear), at 24 37 against 27.
constexpr int64_t kSkinnyMax[kDtypes] = {8, 12, 16};
// bfloat16 x where the skinny kernel has VDPBF16PS (AVX512-BF16, IsaKernels::skinny_bf16): it ran level with
// or ahead of oneDNN up to 96 tokens (AMD EPYC, llama-7b gate_up + down, bench_linear: 32 tokens 26 ms against 33-37,
// 64 46-48 against 50, 96 70 against 71; 128 level, 256 179 against 169); int8 weights with bfloat16 x likewise
// (32 / 64 tokens 28 / 49 ms against oneDNN's weight decompression 30 / 51, measured with the earlier widening into
// an L2 buffer, which the in-register one beat by 1.14-1.33x at 32-64 tokens). A MoE block's experts (one thread each)
// to 48 rows: Qwen3-30B-A3B MoeGateUpSwiglu against the swapped path, 1.95x / 1.22x faster at 32 / 48 rows per
// expert on average, 0.82x at 64.
constexpr int64_t kSkinnyMaxDot = 64, kSkinnyMaxDotExpert = 48;
// int8 weights take the skinny kernel (which widens them in registers) within this range before the amx path:
// bfloat16 at 3-4 tokens skinny 6.4-7.5 ms against amx 8.4-8.9 (llama-7b gate_up + down, interleaved), at 6
// 9.6-10.0 against 8.9-9.3.
constexpr int64_t kSkinnyMaxQ8[kDtypes] = {8, 12, 4};
// float16: swapping gained nothing measurable; bfloat16: plain oneDNN ran 1.02-1.06x faster than swapped at 128-512
// tokens (AMD EPYC, two runs), and the skinny kernel takes fewer tokens.
constexpr int64_t kSwap[kDtypes][2] = {{9, 192}, {1, 0}, {1, 0}};
// The experts' GEMMs of a MoE block (one thread each when there are many, few rows each): the swapped path
// from the skinny range on for bfloat16 (measured at 16 rows per expert on the Qwen3-30B-A3B shape: 121 ms
// against 232 ms plain, one call of T=256).
constexpr int64_t kSwapExpert[kDtypes][2] = {{9, 192}, {1, 0}, {5, 192}};
// bfloat16 on AMX tiles, where the CPU has them, within this range of tokens (checked before the others): at
// llama-7b shapes the amx path ran 1.2-1.9x faster than the skinny kernel at 4 tokens and than oneDNN at 8-16,
// level with or ahead of oneDNN up to 256 (tools/bench_linear.py), and 1.3x faster at 512 (gate_up + down,
// interleaved, three runs: medians 100-110 ms against 130-150); at 1024 level (1.02x median, 1.24x min). int8
// weights too, past their skinny range: oneDNN's weight decompression ran 0.55x as fast at 8 and 16 tokens
// (3 cold llama-7b layers, Intel Xeon VM, direct calls paired).
constexpr int64_t kAmxTokens[kDtypes][2] = {{1, 0}, {1, 0}, {3, 512}};
// The panel kernel (an ISA's PanelKernels: AVX2) within these ranges of tokens, by dtype: 16-bit weights where
// oneDNN takes them only widened to float32, int8 weights where oneDNN's weight decompression would read float32 x
// (the configurations measured; checked after the int8 skinny range and the amx path, before the others; not for a
// MoE block's experts, not measured there). 3 cold llama-7b layers (gate_up + down), bfloat16 x, direct calls
// interleaved, ratios of medians (5-7 rounds; 3 at 64 (second run), 256 and 512), AVX2 AMD EPYC; against what
// those token counts took before (skinny / oneDNN / its int8 weight decompression), and int8 against bfloat16:
//   tokens                    8      12     16     32     64          128    256    512
//   bfloat16 weights (panel)  0.74x  0.86x  1.08x  1.05x  0.94-1.19x  1.25x  0.90x  0.62x
//   int8 weights (panel)      1.04x  1.20x  1.40x  1.27x  0.99-1.09x  1.12x  0.90x  0.70x
//   int8 (panel) / bfloat16   0.88x  0.91x  1.21x  1.14x  1.00-1.26x  1.30x
// (float32 weights: not measured, oneDNN's float32 matmul keeps them.)
constexpr int64_t kPanelTokens[kDtypes][2] = {{1, 0}, {13, 128}, {13, 128}};
constexpr int64_t kPanelTokensQ8[kDtypes][2] = {{9, 128}, {9, 128}, {9, 128}};
// Weight rows per oneDNN call when its output goes through a float32 block first (the SwiGLU epilogue, and
// the swapped path's transpose). bfloat16 llama-7b MLP, AMD EPYC (AVX512-BF16), direct calls paired against 1024:
// 512 and 256 rows 0.98-1.02x at 128 / 512 tokens; the whole [n, 2 inter] in one float32 call, then the epilogue,
// level too. oneDNN's plain GEMM with bfloat16 output ran 1.03x faster at 512 tokens than either: the float32
// block costs that much, and rounding gate and up to bfloat16 before the SwiGLU (as PyTorch's MLP does) is not taken.
// Nor is the SwiGLU as oneDNN post-ops (gate with eltwise swish into float32, up with a binary mul by it, y rounded
// once): gate_up alone, direct calls paired against this, 0.99-1.00x at 128 / 512 tokens; and a binary post-op
// into a strided y (a block of its columns) runs on oneDNN 3.10's reference kernel: 35 s for one bfloat16 block
// of 512 tokens x 1024 columns, k = 4096. Nor gate and up of a block in one call, a batch of 2 weight blocks
// against x broadcast (x packed once, 11 calls instead of 22; oneDNN's brg_matmul took it): gate_up alone, 3 layers,
// paired against the two calls with a bfloat16-output GEMM as the yardstick in the same rounds, 0.96x of it both
// ways at 128 tokens and 0.95x at 192 (21 rounds; shorter runs had moved between -2% and +17%).
constexpr int64_t kBlockRows = 1024;
// The same where 16-bit weights are widened to float32 for oneDNN first (Op::w_d), so that a block's float32 rows
// stay in the L3 (11 MB at k = 11008). bfloat16 llama-7b MLP on an AVX2 AMD EPYC (L3 32 MB), direct calls
// interleaved, paired against 1024 rows: 1.17x / 1.10x / 1.08x / 1.00x / 0.97x at 32 / 64 / 128 / 256 / 512 tokens
// (512 rows: 1.12x at 64, 0.95x at 512).
constexpr int64_t kWideRows = 256;
// int8 weights with per-row scales through oneDNN's weight decompression up to this many tokens (Op::decompress);
// above, widened to float32 a block of kWideRows rows at a time, as 16-bit weights are, on the plain (not swapped)
// path. 2 cold llama-7b layers, bfloat16 x, AVX2 AMD EPYC, direct calls interleaved, paired against bfloat16
// weights (bfloat16 against its copy 0.99-1.08x): the decompression / the widened rows 1.13x / 1.12x at 192
// tokens, 0.95x / 0.99x at 256, 0.97x / 1.00x and 0.96x / 1.01x at 512 (two runs), 1.03x / 1.09x at 1024.
constexpr int64_t kQ8DecompressMax = 192;
// Rows of the skinny kernel's output block per thread step (linear, gate_up_swiglu): long enough for its decode
// read streams (isa_linear.inc) to run through several rows each (64 and 32 ran 1.06-1.1x slower at one token).
// The blocks are handed out one at a time rather than split in halves, so that a thread that starts late (a worker
// woken from its futex) or runs slower does not leave the other waiting at the end (llama-7b MLP, direct calls,
// interleaved, paired by round, 4 runs each: bfloat16 1.01-1.10x at 16 tokens and 1.04-1.05x at 32, int8 weights
// 1.00-1.11x and 0.97-1.06x; one token 0.97-1.16x; float32 at 8 tokens 0.95x in one run).
constexpr int64_t kSkinnyRows = 256, kSkinnyCols = 128;
// Bytes of int8 rows with group-wise scales dequantized at a time for the skinny kernel (Op::stream_grouped): in L2.
constexpr int64_t kDequantBytes = 256 << 10;
// Rows per call of the amx path above 16 tokens, where it shares the tokens' tiles between panels (amx.cc).
constexpr int64_t kAmxRows = 256;
// Elements below which a widening pass runs in the calling thread alone (waking the pool costs more).
constexpr int64_t kSerialElements = 1 << 15;

std::atomic<int> g_forced{-1};

// The dtype oneDNN multiplies weights of dtype d in: d itself or, where this oneDNN and CPU have no matmul for d
// (16-bit without AVX-512: oneDNN 3.10.1 on an AVX2 AMD EPYC has neither bfloat16 nor float16), float32, with x
// and each block of weight rows widened first (exactly); -1: none. bfloat16 llama-7b gate_up + down on that host
// (bench_linear), the skinny kernel (FMA on widened rows) 84-87 GFLOP/s at 16-256 tokens, oneDNN float32 141-152.
int w_dtype(int d) { return onednn::takes(d) ? d : d != kF32 && onednn::takes(kF32) ? kF32 : -1; }

// The dtype oneDNN reads x in: float32 where the weights are widened to it, and float16 goes in widened
// (float32 x float16 weights ran 1.05-1.4x faster than float16 x float16 here at 64-128 tokens; every product is
// exact either way)
int a_dtype(int d) { return d == kF16 || w_dtype(d) == kF32 ? kF32 : d; }

// Whether oneDNN takes 16-bit weights of dtype d only widened to float32: then the float32 rows of the tuning
// table's swapped ranges hold, and the skinny kernel keeps kSkinnyMaxWidened tokens (bench_linear, 5 rounds,
// AVX2 AMD EPYC, llama-7b gate_up + down, bfloat16 / float16: 12 tokens skinny 39.6 / 39.1 ms against swapped
// 48.3 / 47.7, 16 49.7 / 47.9 against 45.4 / 44.3, 24 77.6 / 76.4 against 60.4 / 61.6, 48 150 / 155 against
// 97 / 100).
bool widened(int d) { return d != kF32 && w_dtype(d) == kF32; }
constexpr int64_t kSkinnyMaxWidened = 12;

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
  // one token of 16-bit x with int8 weights: x split in int16 parts for the ISA's integer dot (IsaKernels::split_x:
  // two parts for VPDPWSSD, 3 cold llama-7b layers, bfloat16 x, direct calls interleaved with the float32 FMA
  // kernel, paired by round, 5 runs on an Intel Xeon with AMX: 1.05-1.10x, int8 read at 26-31 GB/s against 22-28,
  // the read probe 30-34; on AVX2 for VPMADDWD one part per block of 32, rounded below 2^-15 of the block's max
  // |x|). Not float32 x: its 24-bit significands leave residuals wherever |x| < max |x| / 64 on VPDPWSSD, and
  // would round past float32's own precision on VPMADDWD.
  const SplitX *split = nullptr;
  // the panel path: x transposed, [k][np] (PanelKernels::pack_x)
  const float *xt = nullptr;
  int64_t np = 0;
  int a_d() const { return a_dtype(d); }  // x as oneDNN's source operand
  int w_d() const { return w_dtype(d); }  // the weights as oneDNN's operand (int8: widened to it)
  int sx_d() const { return w_d() == d ? d : kF32; }  // x as the swapped path's weights operand
  bool grouped() const { return scale && groups > 1; }  // int8 weights with group-wise scales
  bool decompress() const { return scale && !grouped() && n <= kQ8DecompressMax && onednn::takes_q8(a_d()); }
  int64_t block_rows() const { return widened(d) && !grouped() && !decompress() ? kWideRows : kBlockRows; }
  // the skinny kernel reads x as it is: bfloat16 x on VDPBF16PS (int8 weights widened to bfloat16 in registers,
  // from 2 tokens: at one the float32 FMA kernel ran faster in 8 of 11 interleaved runs, 0.92-1.21x, median 1.04x,
  // llama-7b gate_up + down, AMD EPYC)
  bool bf16_dot() const { return d == kBF16 && ik->skinny_bf16 && (!scale || n > 1); }
  const void *as(int xd) const { return xd == d ? x : static_cast<const void *>(xf); }  // x in dtype xd
  const void *a() const { return as(a_d()); }
  size_t es() const { return dtype_size(d); }
  size_t yes() const { return dtype_size(yd); }
  size_t ws() const { return scale ? 1 : es(); }  // bytes per weight
  const char *row(const void *w, int64_t r) const { return static_cast<const char *>(w) + r * k * ws(); }
  // c[t * ldc + j] *= scale[r0 + j]: int8 weights' per-row scales, applied to the float32 sums
  void rescale(int64_t r0, int64_t rows, float *c, int64_t ldc, bool transposed = false) const {
    if (!scale || grouped()) return;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < rows; ++j) (transposed ? c[j * ldc + t] : c[t * ldc + j]) *= scale[r0 + j];
  }
  // weight rows per call of stream(): the amx path blocks its rows itself (amx.cc), in larger blocks
  int64_t step(int64_t skinny_rows) const { return path == kAmx && n > 16 ? kAmxRows : skinny_rows; }
  // c[t * ldc + j] = sum_k x[t, k] w[r0 + j, k], j < rows: the weight-streaming kernel of the path
  void stream(const void *w, int64_t r0, int64_t rows, float *c, int64_t ldc) const {
    // group-wise scales: in the kernel on the skinny path (one token: each group's float32 sum times its scale;
    // more: float32 x the same in the tiles, bfloat16 x on VDPBF16PS each weight times its scale) and on the panel
    // path (the int8 rows widened times their scales); else the rows dequantized first (stream_grouped). The panel
    // path, 3 cold llama-7b layers, bfloat16 x, direct calls interleaved: 1.55x / 1.45x faster at 16 / 128 tokens
    // than on the rows dequantized first, 0.96x / 1.13x of per-row int8 weights.
    // llama-7b, 3 layers, bfloat16, against bfloat16 weights: 1.84-1.92x at one token, where dequantizing first
    // ran 0.79x; 0.80-0.89x at 16 tokens (dequantized first 0.68-0.70x).
    const int64_t g = grouped() ? k / groups : 0;
    const bool pow2 = (g & (g - 1)) == 0;
    if (grouped() && path == kSkinny && bf16_dot() && g >= 32 && pow2)
      return ik->skinny_bf16_q8g(static_cast<const bf16 *>(x), n, k, row(w, r0), rows, c, ldc, scale + r0 * groups,
                                 groups);
    if (grouped() && path == kSkinny && !bf16_dot() && g % 16 == 0 && (n == 1 || pow2))
      return ik->skinny_q8g(xf, n, k, row(w, r0), rows, c, ldc, scale + r0 * groups, groups);
    if (grouped() && path == kPanel)  // (the scales multiplied in as the kernel widens the rows)
      return ik->panel->q8(xt, n, np, k, row(w, r0), rows, c, ldc, scale + r0 * groups, groups);
    if (grouped()) return stream_grouped(w, r0, rows, c, ldc);
    const void *w_rows = row(w, r0);
    if (path == kAmx && scale) {  // int8 on tiles: widened to bfloat16 as the panels are packed
      amx::rows(xv, n, k, static_cast<const int8_t *>(w_rows), rows, c, ldc, xsum);
    } else if (path == kAmx) {
      amx::rows(xv, n, k, static_cast<const uint16_t *>(w_rows), rows, c, ldc);
    } else if (path == kPanel) {
      (scale ? ik->panel->q8 : ik->panel->rows[d])(xt, n, np, k, w_rows, rows, c, ldc, nullptr, 1);
    } else if (split) {
      ik->skinny_q8_parts(*split, k, w_rows, rows, c);
    } else if (scale && bf16_dot()) {
      ik->skinny_bf16_q8(static_cast<const bf16 *>(x), n, k, w_rows, rows, c, ldc);
    } else if (scale) {
      ik->skinny_q8(xf, n, k, w_rows, rows, c, ldc);
    } else if (bf16_dot()) {
      ik->skinny_bf16(static_cast<const bf16 *>(x), n, k, w_rows, rows, c, ldc);
    } else {
      ik->skinny[d](xf, n, k, w_rows, rows, c, ldc);
    }
    rescale(r0, rows, c, ldc);
  }
  // stream() over int8 rows with group-wise scales: dequantized to dtype d a few rows at a time into a buffer of the
  // calling thread (in L2, half a page from the x the kernel reads), each piece streamed as weights of dtype d
  void stream_grouped(const void *w, int64_t r0, int64_t rows, float *c, int64_t ldc) const {
    Op f = *this;
    f.scale = nullptr;
    const int64_t piece = std::max<int64_t>(16, kDequantBytes / (k * es()) / 16 * 16);  // (amx: m % 16 == 0)
    thread_local std::vector<char> buf;  // grown once per calling thread
    buf.resize(std::max(buf.size(), size_t(piece * k * es() + 4096)));
    char *to = buf.data() + half_page_from(f.bf16_dot() ? x : static_cast<const void *>(xf), buf.data());
    for (int64_t i0 = 0; i0 < rows; i0 += piece) {
      const int64_t p = std::min(piece, rows - i0);
      ik->widen_q8[d](reinterpret_cast<const int8_t *>(row(w, r0 + i0)), to, p, k, scale + (r0 + i0) * groups,
                      groups);
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
// float32. int8 weights: not swapped, through oneDNN's weight decompression where it has it, to kQ8DecompressMax
// tokens (Op::decompress; path() keeps them off the swapped path); else, and 16-bit weights oneDNN has no matmul
// for, widened (exactly) to the dtype oneDNN takes (Op::w_d), the whole block of rows at once.
bool gemm_block(const Op &op, bool swap, const void *w, int64_t r0, int64_t rows, float *c, int64_t ldc) {
  const int wd = op.w_d();
  auto gemm = [&](const void *w_rows, int64_t m, float *cm) {
    return swap ? onednn::gemm(wd, w_rows, m, op.sx_d(), op.as(op.sx_d()), op.n, op.k, kF32, cm, op.n)
                : onednn::gemm(op.a_d(), op.a(), op.n, wd, w_rows, m, op.k, kF32, cm, ldc);
  };
  if (!op.scale && wd == op.d) return gemm(op.row(w, r0), rows, c);
  // (group-wise scales through oneDNN's weight decompression with grouped scales, [groups, rows] per block:
  // llama-7b, 3 layers, bfloat16, 0.90x / 0.91x of bfloat16 weights at 128 / 512 tokens paired, against 0.84-0.88x
  // for the block dequantized here first at 128: no gain that the noise shows, not kept)
  if (op.decompress() && !swap)
    return onednn::gemm_q8(op.a_d(), op.a(), op.n, reinterpret_cast<const int8_t *>(op.row(w, r0)), op.scale + r0,
                           rows, op.k, kF32, c, ldc);
  thread_local std::vector<char> wide;  // grown once per calling thread (no page faults per call)
  const size_t wes = dtype_size(wd);
  wide.resize(std::max(wide.size(), size_t(rows * op.k * wes)));
  char *buf = wide.data();  // (the pool's threads have their own `wide`)
  parallel_ranges(rows, [&](int64_t i0, int64_t i1) {
    char *to = buf + i0 * op.k * wes;
    if (op.scale)
      op.ik->widen_q8[wd](reinterpret_cast<const int8_t *>(op.row(w, r0 + i0)), to, i1 - i0, op.k,
                          op.grouped() ? op.scale + (r0 + i0) * op.groups : nullptr, op.groups);
    else
      op.ik->to_float[op.d](op.row(w, r0 + i0), reinterpret_cast<float *>(to), (i1 - i0) * op.k);
  }, kSerialElements / std::max<int64_t>(op.k, 1));
  if (!gemm(buf, rows, c)) return false;
  op.rescale(r0, rows, c, swap ? op.n : ldc, swap);
  return true;
}

// x [n, k] (`bytes`) copied to a buffer of the calling thread that starts half a page from w (mod 4 KB). The skinny
// kernel's tiles load R weight rows and several rows of x at the same offset i; where k's rows are a multiple of
// 4 KB (k = 4096 in bfloat16) every weight row falls in one L1 set, and x's rows with them wherever x starts at w's
// offset in its page. MindSpore's allocator gave that to one layer in three of a llama-7b chain (both at 16 bytes
// into a page); with every x so placed a 3-layer chain ran 1.08-1.17x slower at 16-64 tokens (direct calls,
// bfloat16, AMD EPYC).
const void *placed(const void *x, size_t bytes, const void *w) {
  thread_local std::vector<char> buf;  // grown once per calling thread
  buf.resize(std::max(buf.size(), bytes + 4096));
  const size_t at = half_page_from(w, buf.data());
  std::memcpy(buf.data() + at, x, bytes);
  return buf.data() + at;
}

// Runs body(op) with x widened where the path reads float32, or laid out as B tiles for the amx path (which
// falls back to the skinny kernel where the tiles do not cover k or the `rows` it streams), and for the skinny
// kernel's multi-token tiles placed against the weights w.
// (int8 with group-wise scales takes the paths of weights of dtype d: each path forced, llama-7b, 3 layers,
// bfloat16, against bfloat16 weights, the skinny kernel ran 0.99x / 0.88x / 0.81x / 0.80x at 64 / 128 / 256 / 512
// tokens and the rows dequantized for oneDNN 0.66x / 0.85x / 0.86x / 0.90x.)
template <typename Body>
bool run(const Linear &call, const void *w, int64_t rows, const Body &body) {
  Op op{call.d, call.yd < 0 ? call.d : call.yd, call.x, nullptr, nullptr, nullptr, call.n, call.k,
        path(call.d, call.n, call.expert, call.scale && call.groups == 1), &isa(), call.scale, call.groups};
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
    op.np = op.ik->panel->pack_x(op.xf, op.n, op.k, xt);
    op.xt = xt.data();
  }
  if (op.path == kSkinny && op.n > 1) {  // (one token's tiles read one row of x)
    if (op.bf16_dot())
      op.x = placed(op.x, op.n * op.k * op.es(), w);
    else
      op.xf = static_cast<const float *>(placed(op.xf, op.n * op.k * sizeof(float), w));
  }
  SplitX split;
  if (op.path == kSkinny && op.scale && !op.grouped() && op.n == 1 && op.d != kF32 && op.ik->split_x &&
      op.ik->split_x(op.xf, op.k, split))
    op.split = &split;
  return body(op);
}

// The skinny kernel's range of tokens for dtype d on this CPU (the VDPBF16PS one's where it is in use).
int64_t skinny_max(int d, bool expert) {
  if (widened(d)) return kSkinnyMaxWidened;
  if (d != kBF16 || !isa().skinny_bf16) return kSkinnyMax[d];
  return expert ? kSkinnyMaxDotExpert : kSkinnyMaxDot;
}

// The panel path's range of tokens for dtype d (int8 weights: q8) on this CPU; {1, 0} (none) where its ISA has no
// panel kernel.
const int64_t *panel_range(int d, bool expert, bool q8) {
  static constexpr int64_t kNone[2] = {1, 0};
  if (!isa().panel || expert) return kNone;
  if (q8) return a_dtype(d) == kF32 ? kPanelTokensQ8[d] : kNone;
  return widened(d) ? kPanelTokens[d] : kNone;
}

// The swapped path's range of tokens for dtype d: float32's where oneDNN takes d widened to float32.
const int64_t *swap_range(int d, bool expert) {
  const int t = widened(d) ? kF32 : d;
  return expert ? kSwapExpert[t] : kSwap[t];
}

}  // namespace

Path path(int d, int64_t n, bool expert, bool q8) {
  const int forced = g_forced;
  const int64_t *swap = swap_range(d, expert), *panel = panel_range(d, expert, q8);
  const Path p = forced >= 0 ? Path(forced)
                 : q8 && n <= kSkinnyMaxQ8[d] ? kSkinny
                 : n >= kAmxTokens[d][0] && n <= kAmxTokens[d][1] && amx::available() ? kAmx
                 : n >= panel[0] && n <= panel[1] ? kPanel
                 : n <= skinny_max(d, expert) ? kSkinny
                 : n >= swap[0] && n <= swap[1] ? kSwapped : kOnednn;
  if (p == kAmx) return d == kBF16 && amx::available() ? kAmx : kSkinny;
  if (p == kPanel) return isa().panel ? kPanel : kSkinny;
  if (p == kSkinny || w_dtype(d) < 0) return kSkinny;
  // int8 weights: not swapped. oneDNN's weight decompression takes them as the weights operand only (to
  // kQ8DecompressMax tokens), and beat the int8 rows swapped and widened (llama-7b gate_up, 16 / 128 / 512 tokens,
  // AMD EPYC, 2 threads: float32 22.3 / 111 / 431 ms against 34.5 / 148 / 568; bfloat16 1.15x / 1.07x / 1.01x
  // faster than its bfloat16 weights in bench_quant, against 0.89x / 0.90x / 0.93x)
  if (q8 && (p == kOnednn || forced < 0) && onednn::takes_q8(a_dtype(d))) return kOnednn;
  return p;
}

int force_path(int p) { return g_forced.exchange(p >= 0 && p < kPaths ? p : -1); }

std::string tuning_json() {
  std::string s = "{\"paths\": [";
  for (int p = 0; p < kPaths; ++p) s += std::string(p ? ", " : "") + "\"" + kPathNames[p] + "\"";
  s += "]";
  int64_t skinny[kDtypes], skinny_expert[kDtypes];  // as path() takes them on this CPU
  for (int d = 0; d < kDtypes; ++d) skinny[d] = skinny_max(d, false), skinny_expert[d] = skinny_max(d, true);
  const std::pair<const char *, const int64_t *> most[] = {{"skinny_max_tokens", skinny},
                                                            {"skinny_max_tokens_expert", skinny_expert},
                                                            {"skinny_max_tokens_int8", kSkinnyMaxQ8}};
  for (const auto &[key, tokens] : most) {
    s += std::string(", \"") + key + "\": {";
    for (int d = 0; d < kDtypes; ++d)
      s += std::string(d ? ", " : "") + "\"" + kDtypeNames[d] + "\": " + std::to_string(tokens[d]);
    s += "}";
  }
  int64_t swapped[kDtypes][2], swapped_expert[kDtypes][2];  // as path() takes them on this CPU
  for (int d = 0; d < kDtypes; ++d)
    for (int i = 0; i < 2; ++i) swapped[d][i] = swap_range(d, false)[i], swapped_expert[d][i] = swap_range(d, true)[i];
  int64_t panel[kDtypes][2], panel_q8[kDtypes][2];  // as path() takes them on this CPU
  for (int d = 0; d < kDtypes; ++d)
    for (int i = 0; i < 2; ++i)
      panel[d][i] = panel_range(d, false, false)[i], panel_q8[d][i] = panel_range(d, false, true)[i];
  const std::pair<const char *, const int64_t(*)[2]> rows[] = {
      {"amx_tokens", kAmxTokens}, {"swapped_tokens", swapped}, {"swapped_tokens_expert", swapped_expert},
      {"panel_tokens", panel}, {"panel_tokens_int8", panel_q8}};
  for (const auto &[key, swap] : rows) {
    s += std::string(", \"") + key + "\": {";
    for (int d = 0; d < kDtypes; ++d) {
      s += std::string(d ? ", " : "") + "\"" + kDtypeNames[d] + "\": ";
      s += swap[d][0] <= swap[d][1] ? "[" + std::to_string(swap[d][0]) + ", " + std::to_string(swap[d][1]) + "]"
                                    : "null";
    }
    s += "}";
  }
  s += ", \"onednn_int8_weights\": {";  // oneDNN's weight decompression, by the dtype of x
  for (int d = 0; d < kDtypes; ++d)
    s += std::string(d ? ", " : "") + "\"" + kDtypeNames[d] + "\": " +
         (onednn::takes_q8(a_dtype(d)) ? "true" : "false");
  s += "}, \"onednn_int8_weights_max_tokens\": " + std::to_string(kQ8DecompressMax);  // (above: widened)
  s += ", \"onednn_float32_for\": {";  // 16-bit weights oneDNN takes only widened to float32, by dtype
  for (int d = 0; d < kDtypes; ++d)
    s += std::string(d ? ", " : "") + "\"" + kDtypeNames[d] + "\": " + (widened(d) ? "true" : "false");
  s += std::string("}, \"amx_available\": ") + (amx::available() ? "true" : "false");
  s += ", \"block_rows\": " + std::to_string(kBlockRows);
  const SkinnyTiles &tiles = isa().tiles;
  s += ", \"skinny_tile_rows\": {\"16bit_1_token\": " + std::to_string(tiles.rows_16bit_1) +
       ", \"int8_1_token\": " + std::to_string(tiles.rows_int8_1) + ", \"1_2_tokens\": " +
       std::to_string(tiles.rows_1_2) + ", \"other\": " + std::to_string(tiles.rows) + ", \"int8_other\": " +
       std::to_string(tiles.rows_int8) + "}";
  const auto quoted = [](const char *name) { return name ? "\"" + std::string(name) + "\"" : std::string("null"); };
  s += ", \"int8_one_token_dot\": " + quoted(isa().int8_dot);
  // bfloat16 x read as it is by the skinny kernel (int8 rows with group-wise scales: widened times them to bfloat16)
  s += ", \"bfloat16_x_dot\": " + quoted(isa().skinny_bf16 ? "vdpbf16ps" : nullptr);
  return s + "}";
}

bool linear(const Linear &call, const void *w, int64_t m, void *y) {
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
    const int64_t step = op.step(kSkinnyRows);
    parallel_each((m + step - 1) / step, [&](int64_t b) {  // blocks handed out one at a time (kSkinnyRows)
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
    const int64_t step = op.step(kSkinnyCols);
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
