// Shared by the kernels of the cpu backend: 16-bit float types, dtypes by name, and the per-ISA kernel tables.
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

// Weight rows the skinny kernel reads at once (one register tile, one read stream each): more streams per thread
// for decode, where the weight read is the whole cost, as many as the ISA's vector registers hold.
struct SkinnyTiles {
  int rows_16bit_1;  // float16/bfloat16 weights, 1 token
  int rows_int8_1;   // int8 weights, 1 token
  int rows_1_2;      // 1-2 tokens
  int rows;          // otherwise
  int rows_int8;     // otherwise, int8 weights with float32 x (widened in registers)
};
// 32 vector registers (AVX-512): 16-bit at one token read +10% over 8 rows with 12 (float16); int8 with the L2
// prefetch against 12 rows: 1.03-1.23x in 6 of 8 runs; 8 streams per thread are the read probe's best.
constexpr SkinnyTiles kSkinnyTiles32 = {12, 8, 8, 4, 4};
// 16 (AVX2, where those tiles spill): 3 cold llama-7b layers, bfloat16 x, direct calls interleaved, paired, AMD
// EPYC Zen 3: one token 1.13-1.21x faster with 6 bfloat16 rows than 12, 1.12-1.17x with 4 int8 rows than 8 (6:
// level with 4); two tokens 1.03-1.08x with 4 rows than 8. From 3 tokens int8 rows in tiles of 2 rows x 6 tokens
// (12 accumulators; 4 x 6 spill), against 4 rows: 1.11x / 0.98x / 1.26x / 1.13x at 3 / 4 / 6 / 8 tokens, int8
// then 0.99x / 1.10x / 1.09x / 1.12x of bfloat16 weights (whose 4-row tiles ran 0.89x / 0.94x with 2 at 6 / 8).
constexpr SkinnyTiles kSkinnyTiles16 = {6, 4, 4, 4, 2};

// One token x [k] in int16 parts for an integer dot product with int8 weights (IsaKernels::split_x): on
// AVX512-VNNI exactly, x[j] = (parts[j] * 2^15 + parts[k + j]) * unit plus res_val[i] at element res_idx[i]; on
// AVX2 rounded, x[j] ~ parts[j] * scale[j / 32] (a power of two per block of 32 elements; parts padded to whole
// blocks; isa_linear.inc bounds the rounding).
struct SplitX {
  std::vector<int16_t> parts;
  double unit = 0.0;
  std::vector<float> scale;
  std::vector<int32_t> res_idx;
  std::vector<double> res_val;
};

// The panel kernel of an ISA (isa_linear.inc): x transposed by pack_x into [k][np] (returns np, n padded), then
// y[t * ldy + j] = sum_k x[t, k] w[j, k], j < m, for weights of each dtype (rows) and int8 (q8: unscaled sums
// where scale is nullptr, else times group-wise scales [m, groups]).
struct PanelKernels {
  using Gemm = void (*)(const float *xt, int64_t n, int64_t np, int64_t k, const void *w, int64_t m, float *y,
                        int64_t ldy, const float *scale, int64_t groups);
  int64_t (*pack_x)(const float *x, int64_t n, int64_t k, std::vector<float> &xt);
  Gemm rows[kDtypes];
  Gemm q8;
};

// What one ISA's build of isa_*.inc provides.
struct IsaKernels {
  const char *name;
  void (*swiglu_fwd[kDtypes])(const void *x, void *y, int64_t rows, int64_t inter);
  void (*swiglu_bwd[kDtypes])(const void *x, const void *dy, void *dx, int64_t rows, int64_t inter);
  void (*to_float[kDtypes])(const void *src, float *dst, int64_t n);
  void (*from_float[kDtypes])(const float *src, void *dst, int64_t n);
  void (*swiglu_from_float[kDtypes])(const float *gate, const float *up, void *dst, int64_t n);
  // y[t * ldy + j] = sum_k x[t, k] w[j, k], j < m: the weight rows streamed once for all n (few) tokens
  void (*skinny[kDtypes])(const float *x, int64_t n, int64_t k, const void *w, int64_t m, float *y, int64_t ldy);
  // y = x / sqrt(mean(x^2) + eps) * w over one row of h elements
  void (*rms_norm_row[kDtypes])(const void *x, const void *w, int64_t h, float eps, void *y);
  void (*add[kDtypes])(const void *a, const void *b, void *y, int64_t n);  // y = a + b
  // int8 weights (weight-only quantization): skinny over w [m, k] int8, unscaled sums; and int8 [rows, k] ->
  // dtype, exact, or (scale [rows, groups], not nullptr) times each group's scale, rounded once
  void (*skinny_q8)(const float *x, int64_t n, int64_t k, const void *w, int64_t m, float *y, int64_t ldy);
  void (*widen_q8[kDtypes])(const int8_t *src, void *dst, int64_t rows, int64_t k, const float *scale,
                            int64_t groups);
  // float32 x, int8 w [m, k] with group-wise scales [m, groups] (k / groups a multiple of 16; from 2 tokens a power
  // of two), each product times its group's scale in float32
  void (*skinny_q8g)(const float *x, int64_t n, int64_t k, const void *w, int64_t m, float *y, int64_t ldy,
                     const float *scale, int64_t groups);
  // the skinny kernel for bfloat16 x on AVX512-BF16 (VDPBF16PS), bfloat16 and int8 weights; nullptr on other ISAs
  void (*skinny_bf16)(const bf16 *x, int64_t n, int64_t k, const void *w, int64_t m, float *y, int64_t ldy);
  void (*skinny_bf16_q8)(const bf16 *x, int64_t n, int64_t k, const void *w, int64_t m, float *y, int64_t ldy);
  // the same from 2 tokens with group-wise scales [m, groups] (k / groups a power of two, 32 or more)
  void (*skinny_bf16_q8g)(const bf16 *x, int64_t n, int64_t k, const void *w, int64_t m, float *y, int64_t ldy,
                          const float *scale, int64_t groups);
  // one token of 16-bit x with int8 weights on an integer dot product (int8_dot: "vpdpwssd" on AVX512-VNNI, exact;
  // "vpmaddwd" on AVX2, x rounded; nullptr: none): x split for it (false: the float kernel takes it), then y [m]
  const char *int8_dot;
  bool (*split_x)(const float *x, int64_t k, SplitX &out);
  void (*skinny_q8_parts)(const SplitX &x, int64_t k, const void *w, int64_t m, float *y);
  SkinnyTiles tiles;  // the skinny kernel's tile rows on this ISA
  const PanelKernels *panel;  // nullptr: none on this ISA
};

const IsaKernels &isa();        // the ISA in use
int set_isa(const char *name);  // 0, or -1 when unknown or not supported by this CPU
const char *isa_name(int i);    // the i-th ISA this CPU runs, best first; nullptr past the last

}  // namespace msw
