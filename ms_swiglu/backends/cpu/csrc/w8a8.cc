// W8A8: x quantized to int8 (per token, or per tensor by the checkpoint's scale and offset), the int8 x int8
// products summed exactly in int32 (isa_w8a8.inc), and y = sum * s_x[t] * scale[j] in float32, rounded once; the
// gate/up call applies the SwiGLU to the float32 values first, so [n, 2 inter] never exists. Few tokens: each
// weight row read once for all of them (the row kernel); more: oneDNN's int8 matmul (or the library's panel
// kernel), a block of rows at a time, its int32 sums in L2 for the epilogue.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "common.h"
#include "gemm.h"
#include "onednn.h"
#include "pool.h"
#include "tuning.h"

namespace msw {

bool linear_w8a8(const Linear &call, const void *w, int64_t m, void *y, bool swiglu) {
  const IsaKernels &ik = isa();
  const WeightTraits &wk = ik.weights[kWeightsW8A8];
  const int d = call.d, yd = call.yd < 0 ? call.d : call.yd;
  const int64_t n = call.n, k = call.k;
  const size_t es = dtype_size(d), yes = dtype_size(yd);
  int32_t o = 0;
  if (call.in_scale) {  // a static offset is an integer on the int8 grid (its products stay exact)
    const float of = *call.in_offset;
    if (!(std::fabs(of) <= 255.0f) || of != std::nearbyint(of) || !(*call.in_scale > 0.0f)) return false;
    o = int32_t(of);
  }
  std::vector<int8_t> xq(n * k);
  std::vector<float> sx(n);
  parallel_ranges(n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      wk.quantize_row[d](static_cast<const char *>(call.x) + t * k * es, k, call.in_scale, float(o), &xq[t * k],
                         &sx[t]);
  }, (1 << 15) / std::max<int64_t>(k, 1));

  const Path path = path_w8a8(n);
  const bool panel = path == kPanel, dnn = path == kOnednn;
  std::vector<char> xp;
  int64_t ld = 0;  // rows: x's row stride; panel: the tokens padded
  const int32_t c = dnn ? 0 : panel ? wk.pack_panel(xq.data(), n, k, o, xp, ld) : wk.pack_rows(xq.data(), n, k, o, xp, ld);
  const int parts = swiglu ? 2 : 1;  // gate and up: rows j and m + j
  const int64_t step = panel || dnn ? kTuning.w8a8_block_rows : swiglu ? kTuning.skinny_block_cols
                                                                       : kTuning.skinny_block_rows;
  const int8_t *q = static_cast<const int8_t *>(w);
  std::atomic<bool> ok{true};
  parallel_each((m + step - 1) / step, [&](int64_t b) {
    const int64_t j0 = b * step, cols = std::min(step, m - j0);
    thread_local std::vector<int32_t> acc;  // per part: [cols][np] (panel), else [n][cols]
    thread_local std::vector<float> f;      // per part: one token's float32 values
    const int64_t per = panel ? cols * ld : n * cols;
    acc.resize(parts * per);
    f.resize(parts * cols);
    for (int p = 0; p < parts; ++p) {
      const int8_t *rows = q + (p * m + j0) * k;
      int32_t *a = acc.data() + p * per;
      if (panel) {
        wk.i8_panel(xp.data(), ld, k, rows, cols, a, c);
      } else if (!dnn) {
        wk.i8_rows(xp.data(), n, ld, k, rows, cols, a, cols, c);
      } else if (!onednn::gemm_s8(xq.data(), n, rows, cols, k, a, cols)) {
        ok = false;
        return;
      } else if (o) {  // oneDNN took xq: (xq - o) . w = xq . w - o sum(w)
        for (int64_t j = 0; j < cols; ++j) {
          int32_t ws = 0;
          for (int64_t i = 0; i < k; ++i) ws += rows[j * k + i];
          for (int64_t t = 0; t < n; ++t) a[t * cols + j] -= o * ws;
        }
      }
    }
    for (int64_t t = 0; t < n; ++t) {
      for (int p = 0; p < parts; ++p) {
        const int32_t *a = acc.data() + p * per;
        const float *scale = call.scale + p * m + j0;
        float *fp = f.data() + p * cols;
        const float s = sx[t];
        if (panel)
          for (int64_t j = 0; j < cols; ++j) fp[j] = float(a[j * ld + t]) * s * scale[j];
        else
          for (int64_t j = 0; j < cols; ++j) fp[j] = float(a[t * cols + j]) * s * scale[j];
      }
      char *out = static_cast<char *>(y) + (t * m + j0) * yes;
      if (swiglu)
        ik.swiglu_from_float[yd](f.data(), f.data() + cols, out, cols);
      else
        ik.from_float[yd](f.data(), out, cols);
    }
  });
  return ok;
}

}  // namespace msw
