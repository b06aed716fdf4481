// Shared by the kernels of the cpu backend: 16-bit float types, dtypes by name, and the per-ISA kernel tables
// (one row of kernels per weight format).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "pool.h"

namespace msw {

struct f16 { uint16_t bits; };
struct bf16 { uint16_t bits; };

// The bytes from `buf` to its first address half a page (mod 4 KB) from `anchor`: rows a multiple of 4 KB apart
// share L1 sets, and two arrays of such rows read side by side, one so placed, do not meet in them.
inline size_t half_page_from(const void *anchor, const void *buf) {
  return (reinterpret_cast<uintptr_t>(anchor) + 2048 - reinterpret_cast<uintptr_t>(buf)) % 4096;
}

inline float half_to_float(uint16_t h) {
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

inline uint16_t float_to_half(float f) {  // round to nearest even
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
inline float to1(int8_t v) { return v; }
inline float to1(f16 v) { return half_to_float(v.bits); }
inline float to1(bf16 v) {
  uint32_t b = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Dtypes by the names MindSpore gives an aot op; every table below is indexed by Dtype.
enum Dtype { kF32, kF16, kBF16, kDtypes };
extern const char *const kDtypeNames[kDtypes];
int dtype_index(const char *name);  // -1 when unknown
inline size_t dtype_size(int d) { return d == kF32 ? 4 : 2; }

// Calls body(row, c0, c1) over [rows] x [0, inter) cut into column blocks, in parallel when large.
template <typename Body>
void for_tiles(int64_t rows, int64_t inter, const Body &body) {
  constexpr int64_t kBlock = 4096, kSerial = 1 << 15;
  const int64_t blocks = (inter + kBlock - 1) / kBlock, tiles = rows * blocks;
  parallel_ranges(tiles, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = t / blocks, c0 = (t % blocks) * kBlock;
      body(r, c0, c0 + kBlock < inter ? c0 + kBlock : inter);
    }
  }, rows * inter >= kSerial ? 1 : tiles + 1);
}

// One token x [k] in int16 parts for an integer dot product with int8 weights (WeightTraits::split_x): on
// AVX512-VNNI exactly, x[j] = (parts[j] * 2^15 + parts[k + j]) * unit plus res_val[i] at element res_idx[i]; on
// AVX2 rounded, x[j] ~ parts[j] * scale[j / 32] (a power of two per block of 32 elements; parts padded to whole
// blocks; isa_linear.inc bounds the rounding).
struct SplitX {
  std::vector<int16_t> parts;
  double unit = 0.0;
  std::vector<float> scale;
  std::vector<float> block_sums;  // int4 on AVX2: each block's sum of the rounded x (exact in float32)
  std::vector<int32_t> res_idx;
  std::vector<double> res_val;
};

// The weight formats of the linear kernels: float weights in each dtype (numbered as their Dtype), int8 with a
// scale per row, int8 with a scale per group of k / groups inputs.
enum WeightFormat { kWeightsF32 = kF32, kWeightsF16 = kF16, kWeightsBF16 = kBF16, kWeightsInt8, kWeightsInt8Group,
                    kWeightsInt4Group, kWeightsW8A8, kWeightFormats };
// The quantized weight formats the library computes, one row each (as ggml's type traits), by name: the Python
// side names a format's row (ms_swiglu.quant: QuantMethod.kernel) and calls the ops of that row's name; no format
// is guessed from a scale's presence. `grouped`: scales [rows, groups], each for k / groups inputs of its row (a
// row of one group computes as the per-row format: the same products and scale); else one scale per row.
// `int8_x`: the activations are quantized to int8 too (W8A8: per token, or with `act_params` == 2 per tensor by the
// float32 input scale and offset that follow the scales), and the products are int8 x int8 summed in int32.
enum FormatId { kFormatInt8, kFormatInt8Group, kFormatInt4Group, kFormatW8A8, kFormatW8A8Static, kFormats };
struct FormatRow {
  const char *name;
  int bits;
  bool grouped;
  WeightFormat weights;  // its kernels' row in IsaKernels::weights
  bool int8_x = false;
  int act_params = 0;
};
extern const FormatRow kFormatRows[kFormats];

// One ISA's linear kernels for one weight format (as ggml's type traits): w [m, k] in that format and
// y[t * ldy + j] = sum_k x[t, k] w[j, k], j < m, float32 sums. int8 per row: the unscaled sums (the scales are
// applied to them after); per group: each group's products times its scale (scale [m, groups]; nullptr and 1 for
// the other formats). nullptr: not on this ISA.
struct WeightTraits {
  template <typename X>
  using Skinny = void (*)(const X *x, int64_t n, int64_t k, const void *w, int64_t m, float *y, int64_t ldy,
                          const float *scale, int64_t groups);
  // the skinny kernel: each weight row read once for all (few) tokens; int8 per group: k / groups a multiple of
  // 16, from 2 tokens a power of two
  Skinny<float> skinny;
  // the same for bfloat16 x on VDPBF16PS (AVX512-BF16); int8 per group: k / groups a power of two, 32 or more
  Skinny<bf16> skinny_bf16;
  // one token of 16-bit x on an integer dot product (int8 per row; int4 on AVX2): x split for it (false: `skinny`
  // or `skinny_q4` takes it), then y [m]; `dot` names the instruction ("vpdpwssd" on AVX512-VNNI, exact;
  // "vpmaddwd" on AVX2, x rounded)
  bool (*split_x)(const float *x, int64_t k, SplitX &out);
  void (*skinny_parts)(const SplitX &x, int64_t k, const void *w, int64_t m, float *y);
  const char *dot;
  // the panel kernel, on x transposed by IsaKernels::panel_x ([k][np], np: n padded)
  void (*panel)(const float *xt, int64_t n, int64_t np, int64_t k, const void *w, int64_t m, float *y, int64_t ldy,
                const float *scale, int64_t groups);
  // [rows, k] of these weights in dtype d (for oneDNN), exactly; int8 per group times its scales, rounded once
  void (*widen[kDtypes])(const void *src, void *dst, int64_t rows, int64_t k, const float *scale, int64_t groups);
  // int4 (u in 0..15, two a byte along k, the even input in the low nibble; w = (u - z) * scale, scale and zero
  // [m, groups], zero nullptr: 8): the skinny kernel (k / groups a multiple of 32), on float32 x and, on
  // VDPBF16PS, bfloat16 x (k / groups a power of two, 32 or more); and [rows, k] in dtype d, rounded once
  // x as they read it, prepared once per call (prep_q4: x [n, k] -> [n, k] and each group's sum [n, groups])
  template <typename X>
  using SkinnyQ4 = void (*)(const X *xp, const float *sums, int64_t n, int64_t k, const void *w, int64_t m,
                            float *y, int64_t ldy, const float *scale, const uint8_t *zero, int64_t groups);
  SkinnyQ4<float> skinny_q4;
  SkinnyQ4<bf16> skinny_bf16_q4;
  // one token on split_x's parts
  void (*skinny_parts_q4)(const SplitX &x, int64_t k, const void *w, int64_t m, float *y, const float *scale,
                          const uint8_t *zero, int64_t groups);
  void (*prep_q4)(const float *x, int64_t n, int64_t k, int64_t groups, float *xp, float *sums);
  void (*prep_bf16_q4)(const bf16 *x, int64_t n, int64_t k, int64_t groups, bf16 *xp, float *sums);
  void (*widen_q4[kDtypes])(const void *src, void *dst, int64_t rows, int64_t k, const float *scale,
                            const uint8_t *zero, int64_t groups);
  // W8A8 (w8a8.cc): one token's row x [k] in dtype d to int8 xq [k]: per token (in_scale nullptr) s = max|x| / 127
  // (1 for a row of zeros), xq = round(x / s) in [-127, 127]; per tensor xq = clip(round(x / in_scale + offset),
  // -128, 127) and s = 1. Rounded half to even, as the graph's reference (ms_swiglu.quant.graph).
  void (*quantize_row[kDtypes])(const void *x, int64_t k, const float *in_scale, float offset, int8_t *xq, float *s);
  // xq [n, k] - o laid out as i8_rows (ldx: its row stride) or i8_panel (np: tokens padded) read it; returns the
  // shift c the kernel takes (VPDPBUSD reads x unsigned: xq + 128 = (xq - o) + c)
  int32_t (*pack_rows)(const int8_t *xq, int64_t n, int64_t k, int32_t o, std::vector<char> &buf, int64_t &ldx);
  int32_t (*pack_panel)(const int8_t *xq, int64_t n, int64_t k, int32_t o, std::vector<char> &buf, int64_t &np);
  // the exact integer sums acc = (xq - o) . w[j] of int8 rows w [m, k]: acc[t * lda + j] for few tokens (each row
  // read once for all of them), or acc[j * np + t] for many (the panel kernel: the weights broadcast against
  // tokens in the vector lanes; nullptr: i8_rows at every count); `i8_dot` names the instruction
  void (*i8_rows)(const void *xp, int64_t n, int64_t ldx, int64_t k, const int8_t *w, int64_t m, int32_t *acc,
                  int64_t lda, int32_t c);
  void (*i8_panel)(const void *xp, int64_t np, int64_t k, const int8_t *w, int64_t m, int32_t *acc, int32_t c);
  const char *i8_panel_dot;  // the panel kernel's instruction
  bool i8_rows_first;        // the row kernel below the panel's tokens (kTuning.w8a8_rows_max), else the panel's
  const char *i8_dot;
};

struct SkinnyTiles;

// What one ISA's build of isa_*.inc provides: elementwise kernels by dtype, linear kernels by weight format.
struct IsaKernels {
  const char *name;
  void (*swiglu_fwd[kDtypes])(const void *x, void *y, int64_t rows, int64_t inter);
  void (*swiglu_bwd[kDtypes])(const void *x, const void *dy, void *dx, int64_t rows, int64_t inter);
  void (*to_float[kDtypes])(const void *src, float *dst, int64_t n);
  void (*from_float[kDtypes])(const float *src, void *dst, int64_t n);
  void (*swiglu_from_float[kDtypes])(const float *gate, const float *up, void *dst, int64_t n);
  // y = x / sqrt(mean(x^2) + eps) * w over one row of h elements
  void (*rms_norm_row[kDtypes])(const void *x, const void *w, int64_t h, float eps, void *y);
  void (*add[kDtypes])(const void *a, const void *b, void *y, int64_t n);  // y = a + b
  WeightTraits weights[kWeightFormats];  // by WeightFormat
  // x [n, k] transposed into xt [k][np] for WeightTraits::panel; returns np. nullptr: no panel kernel.
  int64_t (*panel_x)(const float *x, int64_t n, int64_t k, std::vector<float> &xt);
  const SkinnyTiles *tiles;  // the skinny kernel's tile rows on this ISA (kTuning, tuning.h)
};

const IsaKernels &isa();        // the ISA in use
int set_isa(const char *name);  // 0, or -1 when unknown or not supported by this CPU
const char *isa_name(int i);    // the i-th ISA this CPU runs, best first; nullptr past the last

}  // namespace msw
