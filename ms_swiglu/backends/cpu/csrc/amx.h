// The AMX bfloat16 path: the weight-streaming GEMM on tiles (amx.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace msw::amx {

// Storage that tiles load from and store to, on 64-byte boundaries: tile rows that straddle two cache lines
// (std::vector's heap blocks sit 16 bytes past one) slow the panel loop down to half.
template <typename T>
struct TileAllocator {
  using value_type = T;
  TileAllocator() = default;
  template <typename U>
  TileAllocator(const TileAllocator<U> &) {}
  T *allocate(std::size_t n) { return static_cast<T *>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T *p, std::size_t) { ::operator delete(p, std::align_val_t(64)); }
  bool operator==(const TileAllocator &) const { return true; }
  bool operator!=(const TileAllocator &) const { return false; }
};
template <typename T>
using TileVector = std::vector<T, TileAllocator<T>>;

bool available();                        // the CPU has AMX-BF16 and Linux gave this process the tile data
bool takes(int64_t k, int64_t m);        // shapes the tiles cover: k % 32 == 0, m % 16 == 0
int64_t vnni_elements(int64_t n, int64_t k);  // size of to_vnni's output (uint16)
// xv = x [n, k] as B tiles: per group of 16 tokens, pairs of k interleaved ([k/2][16 tokens][2]); tokens past
// n are zero. Writes the pairs [p0, p1) of every group (callers split the work by pairs).
void to_vnni(const uint16_t *x, int64_t n, int64_t k, uint16_t *xv, int64_t p0, int64_t p1);
// c[t * ldc + j] = sum_k x[t, k] w[j, k] for j < m, t < n: w [m, k] bfloat16 read in place, xv from to_vnni.
void rows(const uint16_t *xv, int64_t n, int64_t k, const uint16_t *w, int64_t m, float *c, int64_t ldc);
// The same with int8 weights [m, k], widened to bfloat16 exactly as they are packed; the sums are unscaled.
// xsum[t] = sum_k x[t, k] from q8_sums.
void rows(const uint16_t *xv, int64_t n, int64_t k, const int8_t *w, int64_t m, float *c, int64_t ldc,
          const float *xsum);
// The same with int4 rows [m, k / 2] (scale, zero [m, groups]; zero nullptr: 8), more than 16 tokens, groups of 32
// or more: each weight packed as bfloat16((u - z) * scale), rounded to nearest even, as the dequantized rows hold it.
void rows_q4(const uint16_t *xv, int64_t n, int64_t k, const uint8_t *w, int64_t m, float *c, int64_t ldc,
             const float *scale, const uint8_t *zero, int64_t groups);
// xsum[t] for tokens [t0, t1) of x [n, k] bfloat16 (k % 32 == 0), which rows() with int8 weights needs.
void q8_sums(const uint16_t *x, int64_t n, int64_t k, float *xsum, int64_t t0, int64_t t1);

// W8A8 on AMX-INT8 (TDPBSSD: int8 x int8 summed in int32, exactly): WeightTraits' pack_panel and i8_panel for the
// avx512amx row (isa.cc). x as B tiles: per group of 16 tokens [k / 4][16][4] bytes, k padded to 64 by zeros, np:
// n padded to 16; returns c = o, and acc[j * np + t] = xq[t] . w[j] - c * sum_k w[j, k] = (xq[t] - o) . w[j].
bool available_s8();  // the CPU has AMX-INT8 and Linux gave this process the tile data
int32_t pack_panel_s8(const int8_t *xq, int64_t n, int64_t k, int32_t o, std::vector<char> &buf, int64_t &np);
void i8_panel(const void *xp, int64_t np, int64_t k, const int8_t *w, int64_t m, int32_t *acc, int32_t c);
// the same sums from a scalar model of the tiles, on any CPU
void i8_panel_model(const void *xp, int64_t np, int64_t k, const int8_t *w, int64_t m, int32_t *acc, int32_t c);

}  // namespace msw::amx
