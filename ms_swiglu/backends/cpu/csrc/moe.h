// The routed experts of a mixture-of-experts block, as two grouped GEMMs over stacked expert weights.
//
// Shape legend: T tokens, H hidden, I intermediate (per expert), E experts, k experts per token, R = T * k rows.
// The R (token, slot) rows are grouped by expert, stably (in t * k + j order): a counting sort of the ids.
#pragma once

#include <cstdint>

namespace msw {

// h [R, I] (rows grouped by expert) = SwiGLU of x[t] [gate_e; up_e]^T for each row (t, j), e = ids[t, j]:
// x [T, H], ids [T, k] int32, w [E, 2I, H] (each expert [gate_e; up_e]), all but ids in dtype d. An id -1 is a row
// another rank computes (expert parallelism): it is skipped, and h's rows past the grouped ones are zero. False on
// an id outside [-1, E) or when a GEMM fails.
// scale, format: quantized weights' scales [E, 2I, groups] and their FormatId (Linear; nullptr, -1: w in dtype d);
// zero: int4's zero points [E, 2I, groups] (nullptr: 8); in_scale, in_offset: static W8A8's per expert [E].
bool moe_gate_up_swiglu(int d, const void *x, const int32_t *ids, int64_t tokens, int64_t k, const void *w,
                        int64_t experts, int64_t hidden, int64_t inter, void *h, const float *scale = nullptr,
                        int64_t groups = 1, int format = -1, const uint8_t *zero = nullptr,
                        const float *in_scale = nullptr, const float *in_offset = nullptr);

// out [T, H] = sum_j weights[t, j] * (h[row(t, j)] down_e^T) over the slots with an id other than -1, summed in
// float32 in slot order and rounded once:
// h [R, I] as moe_gate_up_swiglu wrote it, weights [T, k] float32, w [E, H, I]; h, w and out in dtype d.
// scale, format: quantized weights' scales [E, H, groups] and their FormatId (Linear; nullptr, -1: w in dtype d);
// zero: int4's zero points [E, H, groups] (nullptr: 8); in_scale, in_offset: static W8A8's per expert [E].
bool moe_down_combine(int d, const void *h, const int32_t *ids, const float *weights, int64_t tokens, int64_t k,
                      const void *w, int64_t experts, int64_t hidden, int64_t inter, void *out,
                      const float *scale = nullptr, int64_t groups = 1, int format = -1,
                      const uint8_t *zero = nullptr, const float *in_scale = nullptr,
                      const float *in_offset = nullptr);

}  // namespace msw
