// The linear kernels: y = x w^T with w [m, k] as stored by Dense / HuggingFace, and the gate/up GEMM with SwiGLU
// as its epilogue. Each call takes one of the paths below, by dtype and token count (the tuning table, tuning.h).
#pragma once

#include <cstdint>
#include <string>

namespace msw {

// skinny: each weight row streamed once for all (few) tokens; onednn: c = x w^T; onednn-swapped: c^T = w x^T,
// the weights as oneDNN's source operand, each block transposed back; amx (bfloat16): the skinny kernel's
// blocks on AMX tiles (amx.cc), the weights as the A operand read in place; panel: the weights, a few rows at a
// time, broadcast against x transposed (tokens in the vector lanes), where the ISA has that kernel (AVX2).
enum Path { kSkinny, kOnednn, kSwapped, kAmx, kPanel, kPaths };
extern const char *const kPathNames[kPaths];

// the path n tokens of dtype d take (kSkinny when oneDNN cannot); q8: against int8 weights, which take the skinny
// kernel over its whole range, before the amx path
Path path(int d, int64_t n, bool expert = false, bool q8 = false);
// the path n tokens take against W8A8 weights: kSkinny (the row kernel; at every count on an ISA without VNNI,
// whose int8 x int8 kernel is the row kernel only), kPanel (the library's panel kernel), or oneDNN's int8 matmul
// (the panel kernel where oneDNN has none)
Path path_w8a8(int64_t n);
int force_path(int p);              // every call takes path p (-1: the automatic choice); returns the previous
std::string tuning_json();          // the tuning table, for the Python side and the benchmarks

// One call: x [n, k] and the weights in dtype d (or int8 with scales), on the path chosen for n; the output in
// dtype yd (d, or float32 for a caller that sums outputs further). `expert`: one expert's GEMM of a MoE block,
// which takes the experts' row of the tuning table.
struct Linear {
  int d;
  const void *x;
  int64_t n, k;
  int yd = -1;  // -1: d
  bool expert = false;
  // int8 weights (weight-only quantization): w [m, k] int8 with float32 scales [m, groups], each for k / groups
  // inputs of its row: w[j, i] = scale[j, i / (k / groups)] * q[j, i]; nullptr: w in dtype d. One group (a scale
  // per row): the int8 rows are widened in the kernel, exactly, and the scales applied to the float32 sums. More:
  // at one token each group's float32 sum is multiplied by its scale (exact products); elsewhere q * scale is
  // rounded once to the dtype the GEMM reads (as Ascend's antiquant does), in registers (bfloat16 x on
  // VDPBF16PS) or into a buffer first.
  const float *scale = nullptr;
  int64_t groups = 1;
  int format = -1;  // the weights' FormatId (common.h); -1: weights in dtype d
  // int4 (int4-group): w [m, k / 2], two a byte along k; w[j, i] = (u - zero[j, i / g]) * scale[j, i / g], g =
  // k / groups; zero nullptr: 8. At one token the skinny kernels take the nibbles in registers; elsewhere the rows
  // are dequantized a block at a time into the dtype the GEMM reads.
  const uint8_t *zero = nullptr;
  // W8A8 (a format row with int8_x) with static activations: the tensor's input scale and offset [1] (nullptr:
  // per token); the offset must be an integer
  const float *in_scale = nullptr, *in_offset = nullptr;
};

bool linear(const Linear &op, const void *w, int64_t m, void *y);               // y [n, m] = x w^T
bool gate_up_swiglu(const Linear &op, const void *w, int64_t inter, void *y);  // y [n, inter], w [2 inter, k]

// The same two for W8A8 (w8a8.cc): x quantized to int8 per token (or per tensor), int8 x int8 summed in int32,
// then y = sum * s_x[t] * scale[j] in float32, rounded once (with the SwiGLU first for gate/up).
bool linear_w8a8(const Linear &op, const void *w, int64_t m, void *y, bool swiglu);

}  // namespace msw
