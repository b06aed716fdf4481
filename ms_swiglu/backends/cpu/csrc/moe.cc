// The routed experts: each expert's rows are one GEMM on the path its row count takes (gemm.cc: the skinny
// kernel for few rows, oneDNN above), over the stacked weights read in place; experts without rows are skipped,
// so a call reads the weights of the active experts only.
#include "moe.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "common.h"
#include "gemm.h"
#include "pool.h"
#include "tuning.h"

namespace msw {
namespace {

// The R = T * k rows grouped by expert, stably: row p of the grouped order is (token, slot) src[p] = t * k + j,
// expert e's rows are [start[e], start[e + 1]), and dst[t * k + j] = p is the inverse. An id of -1 marks a row
// this rank does not compute (its expert is another rank's, expert parallelism): it is in no group, dst -1.
struct Groups {
  std::vector<int64_t> start, src, dst;
};

bool group(const int32_t *ids, int64_t rows, int64_t experts, Groups *g) {
  g->start.assign(experts + 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    if (ids[r] < -1 || ids[r] >= experts) return false;
    if (ids[r] >= 0) ++g->start[ids[r] + 1];
  }
  for (int64_t e = 0; e < experts; ++e) g->start[e + 1] += g->start[e];
  std::vector<int64_t> next(g->start.begin(), g->start.end() - 1);
  g->src.resize(g->start[experts]);
  g->dst.assign(rows, -1);
  for (int64_t r = 0; r < rows; ++r) {
    if (ids[r] < 0) continue;
    const int64_t p = next[ids[r]]++;
    g->src[p] = r;
    g->dst[r] = p;
  }
  return true;
}

// Runs body(e) for every expert with rows: in parallel over the experts (each GEMM in one thread, the largest
// first) when there are enough of them to keep every thread busy (kTuning.experts_per_thread), else one after the
// other, each GEMM using every thread. Returns false when a body does.
template <typename Body>
bool for_experts(const Groups &g, int64_t experts, const Body &body) {
  std::vector<int64_t> active;
  for (int64_t e = 0; e < experts; ++e)
    if (g.start[e + 1] > g.start[e]) active.push_back(e);
  std::sort(active.begin(), active.end(), [&](int64_t a, int64_t b) {
    return g.start[a + 1] - g.start[a] > g.start[b + 1] - g.start[b];
  });
  std::atomic<bool> ok{true};
  auto each = [&](int64_t i) {
    if (!body(active[i])) ok = false;
  };
  if (int64_t(active.size()) >= kTuning.experts_per_thread * threads()) {
    parallel_each(active.size(), each);
  } else {
    for (size_t i = 0; i < active.size(); ++i) each(i);
  }
  return ok;
}

}  // namespace

bool moe_gate_up_swiglu(int d, const void *x, const int32_t *ids, int64_t tokens, int64_t k, const void *w,
                        int64_t experts, int64_t hidden, int64_t inter, void *h, const float *scale,
                        int64_t groups, int format, const uint8_t *zero, const float *in_scale,
                        const float *in_offset) {
  const int64_t rows = tokens * k;
  Groups g;
  if (!group(ids, rows, experts, &g)) return false;
  const size_t es = dtype_size(d), wbits = scale ? kFormatRows[format].bits : 8 * es;  // per activation, weight
  const int64_t grouped = g.start[experts];  // rows of this rank's experts; h's rows past them are zero
  std::memset(static_cast<char *>(h) + grouped * inter * es, 0, (rows - grouped) * inter * es);
  std::vector<char> xs(grouped * hidden * es);  // x's rows in grouped order: [R, H]
  parallel_ranges(grouped, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      std::memcpy(xs.data() + p * hidden * es, static_cast<const char *>(x) + g.src[p] / k * hidden * es, hidden * es);
  }, (1 << 16) / std::max<int64_t>(hidden, 1));
  return for_experts(g, experts, [&](int64_t e) {
    const Linear call{d, xs.data() + g.start[e] * hidden * es, g.start[e + 1] - g.start[e], hidden, -1, true,
                      scale ? scale + e * 2 * inter * groups : nullptr, groups, format,
                      zero ? zero + e * 2 * inter * groups : nullptr, in_scale ? in_scale + e : nullptr,
                      in_offset ? in_offset + e : nullptr};
    return gate_up_swiglu(call, static_cast<const char *>(w) + e * 2 * inter * hidden * wbits / 8, inter,
                          static_cast<char *>(h) + g.start[e] * inter * es);
  });
}

bool moe_down_combine(int d, const void *h, const int32_t *ids, const float *weights, int64_t tokens, int64_t k,
                      const void *w, int64_t experts, int64_t hidden, int64_t inter, void *out,
                      const float *scale, int64_t groups, int format, const uint8_t *zero, const float *in_scale,
                      const float *in_offset) {
  const int64_t rows = tokens * k;
  Groups g;
  if (!group(ids, rows, experts, &g)) return false;
  const size_t es = dtype_size(d), wbits = scale ? kFormatRows[format].bits : 8 * es;  // per activation, weight
  std::vector<float> y(g.start[experts] * hidden);  // each row's expert output in float32, grouped order: [R, H]
  const bool ok = for_experts(g, experts, [&](int64_t e) {
    const Linear call{d, static_cast<const char *>(h) + g.start[e] * inter * es, g.start[e + 1] - g.start[e], inter,
                      kF32, true, scale ? scale + e * hidden * groups : nullptr, groups, format,
                      zero ? zero + e * hidden * groups : nullptr, in_scale ? in_scale + e : nullptr,
                      in_offset ? in_offset + e : nullptr};
    return linear(call, static_cast<const char *>(w) + e * hidden * inter * wbits / 8, hidden,
                  y.data() + g.start[e] * hidden);
  });
  if (!ok) return false;
  const IsaKernels &ik = isa();
  parallel_ranges(tokens, [&](int64_t t0, int64_t t1) {
    std::vector<float> acc(hidden);
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        if (g.dst[t * k + j] < 0) continue;  // another rank's expert
        const float wt = weights[t * k + j], *row = y.data() + g.dst[t * k + j] * hidden;
        for (int64_t c = 0; c < hidden; ++c) acc[c] += wt * row[c];
      }
      ik.from_float[d](acc.data(), static_cast<char *>(out) + t * hidden * es, hidden);
    }
  }, (1 << 16) / std::max<int64_t>(hidden * k, 1));
  return true;
}

}  // namespace msw
