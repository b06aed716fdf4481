// The weight-streaming GEMM on AMX tiles: c[t, j] = sum_k x[t, k] w[j, k] in bfloat16 with the weights as the A
// operand, read in place (16 rows x 32 k per tile, row stride k), and the tokens as B, re-laid once per call
// (pairs of k interleaved, 16 tokens per tile). TDPBF16PS forms each bf16 x bf16 product exactly in float32 and
// sums in float32, as the other paths do; bf16 subnormals (below 1.2e-38) read as zero.
#include "amx.h"

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "tuning.h"

namespace msw::amx {

namespace {

constexpr int64_t kTok = 16, kK = 32;  // tokens per B tile, k per tile step
constexpr int64_t kPanelSteps = kTuning.amx_panel_steps;  // k steps per packed panel of 32 weight rows
constexpr int64_t kBlockRows = kTuning.amx_block_rows;    // rows whose panels share one chunk of the B tiles

bool request_tiles() {  // (Linux >= 5.16 grants the tile data on request)
  constexpr long kReqPerm = 0x1023, kXtileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
  static const bool granted = __builtin_cpu_supports("amx-tile") && syscall(SYS_arch_prctl, kReqPerm, kXtileData) == 0;
  return granted;
}

struct alignas(64) Config {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  Config() {
    for (int t = 0; t < 8; ++t) colsb[t] = 64, rows[t] = 16;  // every tile 16 x 64 bytes
  }
};

}  // namespace

bool available() {  // (every CPU with AMX-BF16 has AVX512-FP16, which the int8 widening uses)
  static const bool ok = __builtin_cpu_supports("amx-bf16") && __builtin_cpu_supports("avx512fp16") && request_tiles();
  return ok;
}

bool available_s8() {  // (its row kernel is AVX512-VNNI's: every CPU with AMX-INT8 has it)
  static const bool ok = __builtin_cpu_supports("amx-int8") && __builtin_cpu_supports("avx512vnni") && request_tiles();
  return ok;
}

int32_t pack_panel_s8(const int8_t *xq, int64_t n, int64_t k, int32_t o, std::vector<char> &buf, int64_t &np) {
  np = (n + kTok - 1) / kTok * kTok;
  const int64_t kp = (k + 63) / 64 * 64;
  buf.assign(np * kp, 0);
  for (int64_t t = 0; t < n; ++t) {  // token t of group g: byte e of quad q at g * 16 kp + q * 64 + (t % 16) * 4 + e
    char *g = buf.data() + t / kTok * kTok * kp + t % kTok * 4;
    for (int64_t i = 0; i < k; ++i) g[i / 4 * 64 + i % 4] = char(xq[t * k + i]);
  }
  return o;  // the tiles sum xq . w: the offset's o * sum(w) is taken off after
}

bool takes(int64_t k, int64_t m) { return k > 0 && k % kK == 0 && m % 16 == 0; }

int64_t vnni_elements(int64_t n, int64_t k) { return (n + kTok - 1) / kTok * kTok * k; }

void to_vnni(const uint16_t *x, int64_t n, int64_t k, uint16_t *xv, int64_t p0, int64_t p1) {
  const int64_t groups = (n + kTok - 1) / kTok;
  for (int64_t g = 0; g < groups; ++g) {  // a pair of bf16 is one uint32: a [16 tokens, k/2] transpose
    uint32_t *out = reinterpret_cast<uint32_t *>(xv + g * kTok * k);
    for (int64_t t = 0; t < kTok; ++t) {
      const int64_t tok = g * kTok + t;
      const uint32_t *in = reinterpret_cast<const uint32_t *>(x + tok * k);
      if (tok < n)
        for (int64_t p = p0; p < p1; ++p) out[p * kTok + t] = in[p];
      else
        for (int64_t p = p0; p < p1; ++p) out[p * kTok + t] = 0;
    }
  }
}

namespace {

// The tile instructions as Intel's pseudocode defines them, on plain arrays: the AMX-INT8 kernel's arithmetic on any
// CPU (tests compare it with the tiles where the CPU has them, and with NumPy everywhere).
struct ModelTiles {
  static inline thread_local int8_t tile[8][16 * 64];
  static void config() {}
  static void release() {}
  template <int I>
  static void zero() { std::memset(tile[I], 0, sizeof tile[I]); }
  template <int I>
  static void load(const void *p, int64_t stride) {
    for (int r = 0; r < 16; ++r) std::memcpy(tile[I] + r * 64, static_cast<const char *>(p) + r * stride, 64);
  }
  template <int I>
  static void store(void *p, int64_t stride) {
    for (int r = 0; r < 16; ++r) std::memcpy(static_cast<char *>(p) + r * stride, tile[I] + r * 64, 64);
  }
  template <int C, int A, int B>
  static void dp() {
    int32_t c[16][16];
    std::memcpy(c, tile[C], sizeof c);
    for (int r = 0; r < 16; ++r)
      for (int t = 0; t < 16; ++t)
        for (int q = 0; q < 16; ++q)
          for (int e = 0; e < 4; ++e) c[r][t] += int32_t(tile[A][r * 64 + 4 * q + e]) * tile[B][q * 64 + 4 * t + e];
    std::memcpy(tile[C], c, sizeof c);
  }
};

namespace model {
#include "amx_s8.inc"
}  // namespace model

}  // namespace

void i8_panel_model(const void *xp, int64_t np, int64_t k, const int8_t *w, int64_t m, int32_t *acc, int32_t c) {
  model::s8_rows<ModelTiles>(xp, np, k, w, m, acc, c);
}

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,amx-int8,avx512f,avx512bw,avx512bf16,avx512fp16")
namespace {

void load_config() {  // every tile 16 x 64 bytes, as each kernel here uses them
  static const Config config;
  _tile_loadconfig(&config);
}

// int8 weights go onto the tiles as q + kQ8Offset, in [1, 256]: every such integer has at most 8 significant
// bits, so it is exact in bfloat16, and the widening is one int16 -> float16 conversion and an exponent shift;
// the sums drop kQ8Offset * sum_k x[t, k] when they leave the tiles (q8_sums).
constexpr int kQ8Offset = 129;

// c[t, j0 + r] (t < nt) from a 16 x 16 float32 tile stored as [r][t], less kQ8Offset * xsum[t] for int8 weights.
inline void store_block(const float *tile, int64_t nt, float *c, int64_t ldc, const float *xsum) {
  for (int64_t t = 0; t < nt; ++t) {
    const float drop = xsum ? kQ8Offset * xsum[t] : 0.f;
    for (int r = 0; r < 16; ++r) c[t * ldc + r] = tile[r * 16 + t] - drop;
  }
}

// One 16-row block of w against one group of tokens: two accumulators over alternate k steps (the TDPBF16PS
// latency is several times its issue interval), summed at the end.
void block1(const uint16_t *xv, int64_t nt, int64_t k, const uint16_t *w, float *c, int64_t ldc) {
  alignas(64) float t0[256], t1[256];
  const int64_t ldw = k * 2;
  _tile_zero(0);
  _tile_zero(1);
  int64_t k0 = 0;
  for (; k0 + 2 * kK <= k; k0 += 2 * kK) {
    _tile_loadd(2, w + k0, ldw);
    _tile_loadd(4, xv + k0 * kTok, 64);
    _tile_loadd(3, w + k0 + kK, ldw);
    _tile_loadd(5, xv + (k0 + kK) * kTok, 64);
    _tile_dpbf16ps(0, 2, 4);
    _tile_dpbf16ps(1, 3, 5);
  }
  if (k0 < k) {
    _tile_loadd(2, w + k0, ldw);
    _tile_loadd(4, xv + k0 * kTok, 64);
    _tile_dpbf16ps(0, 2, 4);
  }
  _tile_stored(0, t0, 64);
  _tile_stored(1, t1, 64);
  for (int i = 0; i < 256; i += 16)
    _mm512_store_ps(t0 + i, _mm512_add_ps(_mm512_load_ps(t0 + i), _mm512_load_ps(t1 + i)));
  store_block(t0, nt, c, ldc, nullptr);
}

// A panel of RB x 16 weight rows against TG groups of 16 tokens over `steps` k steps of 32: C tiles 0-3 (row
// block r, group g -> tile 2r + g) start from acc (or zero) and end in acc; A tiles 4-5 from the packed panel
// a ([step][32 rows][32 k], contiguous: the weight rows themselves sit a multiple of 4 KiB apart, in one L1 set),
// B tiles 6-7 from xv (already at the panel's first k). Each A tile feeds TG products and each B tile RB.
template <int RB, int TG>
void panel(const uint16_t *a, int64_t steps, const uint16_t *xv, int64_t group, float *acc, bool first) {
  if (first) {
    _tile_zero(0);
    if constexpr (TG == 2) _tile_zero(1);
    if constexpr (RB == 2) _tile_zero(2);
    if constexpr (RB == 2 && TG == 2) _tile_zero(3);
  } else {
    _tile_loadd(0, acc, 64);
    if constexpr (TG == 2) _tile_loadd(1, acc + 256, 64);
    if constexpr (RB == 2) _tile_loadd(2, acc + 512, 64);
    if constexpr (RB == 2 && TG == 2) _tile_loadd(3, acc + 768, 64);
  }
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(4, a + s * 1024, 64);
    _tile_loadd(6, xv + s * kK * kTok, 64);
    if constexpr (TG == 2) _tile_loadd(7, xv + group + s * kK * kTok, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (TG == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (RB == 2) {
      _tile_loadd(5, a + s * 1024 + 512, 64);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (TG == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, acc, 64);
  if constexpr (TG == 2) _tile_stored(1, acc + 256, 64);
  if constexpr (RB == 2) _tile_stored(2, acc + 512, 64);
  if constexpr (RB == 2 && TG == 2) _tile_stored(3, acc + 768, 64);
}

template <int RB>
void panel_groups(const uint16_t *a, int64_t steps, const uint16_t *xv, int64_t k, int64_t groups, float *acc,
                  bool first) {
  const int64_t group = kTok * k;
  int64_t g = 0;
  for (; g + 2 <= groups; g += 2) panel<RB, 2>(a, steps, xv + g * group, group, acc + g * 2 * 256, first);
  if (g < groups) panel<RB, 1>(a, steps, xv + g * group, group, acc + g * 2 * 256, first);
}

// One panel row's `steps` x 32 k of w into the packed panel (row stride kK): bfloat16 copied, int8 widened to
// bfloat16 as it is packed (q + kQ8Offset, exactly), so int8 weights cost no pass of their own.
inline void pack_row(const uint16_t *w, int64_t steps, uint16_t *a) {
  for (int64_t s = 0; s < steps; ++s) std::memcpy(a + s * 1024, w + s * kK, 64);
}
// The int8 rows' next chunk is prefetched into L1 as this one is packed (not a burst of L2 prefetches for the next
// block of rows, which would hold the fill buffers the packing waits for).
inline void pack_row(const int8_t *w, int64_t steps, uint16_t *a) {
  for (int64_t s = 0; s < steps; s += 2)
    _mm_prefetch(reinterpret_cast<const char *>(w + (kPanelSteps + s) * kK), _MM_HINT_T0);
  const __m512i offset = _mm512_set1_epi16(kQ8Offset), exponent = _mm512_set1_epi16((127 - 15) << 7);
  for (int64_t s = 0; s < steps; ++s) {  // u = q + kQ8Offset -> float16 -> bfloat16: the exponent rebased
    const __m512i u = _mm512_add_epi16(
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(w + s * kK))), offset);
    const __m512i h = _mm512_castph_si512(_mm512_cvtepi16_ph(u));
    _mm512_store_si512(a + s * 1024, _mm512_add_epi16(_mm512_srli_epi16(h, 3), exponent));
  }
}

// One group of tokens against 16 * RB int8 weight rows over all of k: the C tiles stay in place from the first
// chunk of k to the last, and the rows' next chunk is widened into the other half of the panel buffer while the
// tiles multiply this one (the packing, not the tiles, bounds this case; issued between the tile ops it overlaps
// them). c[t * ldc + j] for t < nt.
template <int RB>
void one_group_q8(const uint16_t *xv, int64_t nt, int64_t k, const int8_t *w, float *c, int64_t ldc,
                  const float *xsum) {
  constexpr int rows = 16 * RB;
  alignas(64) uint16_t a[2][kPanelSteps * 1024];
  const int64_t chunk = kPanelSteps * kK, chunks = (k + chunk - 1) / chunk;
  auto steps_of = [&](int64_t ch) { return std::min(kPanelSteps, (k - ch * chunk) / kK); };
  for (int r = 0; r < rows; ++r) pack_row(w + r * k, steps_of(0), a[0] + r * kK);
  _tile_zero(0);
  if constexpr (RB == 2) _tile_zero(2);
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const uint16_t *ac = a[ch % 2], *bc = xv + ch * chunk * kTok;
    uint16_t *an = a[(ch + 1) % 2];
    const int64_t steps = steps_of(ch), next = ch + 1 < chunks ? steps_of(ch + 1) : 0;
    const int per = (rows + int(steps) - 1) / int(steps);  // rows of the next chunk packed per step
    for (int64_t s = 0; s < steps; ++s) {
      _tile_loadd(4, ac + s * 1024, 64);
      _tile_loadd(6, bc + s * kK * kTok, 64);
      _tile_dpbf16ps(0, 4, 6);
      if constexpr (RB == 2) {
        _tile_loadd(5, ac + s * 1024 + 512, 64);
        _tile_dpbf16ps(2, 5, 6);
      }
      if (next)
        for (int r = int(s) * per; r < std::min(rows, int(s + 1) * per); ++r)
          pack_row(w + r * k + (ch + 1) * chunk, next, an + r * kK);
    }
  }
  alignas(64) float t[2][256];
  _tile_stored(0, t[0], 64);
  if constexpr (RB == 2) _tile_stored(2, t[1], 64);
  for (int r = 0; r < RB; ++r) store_block(t[r], nt, c + 16 * r, ldc, xsum);
}

// Blocks of kBlockRows weight rows; per block, k in chunks of kPanelSteps steps: the tokens' B tiles of one chunk
// stay in L2 while every 32-row panel of the block passes over them (packed, in L1) with every pair of token
// groups. The accumulators wait in acc between chunks. pack(row, k0, steps, a): `steps` x 32 k of weight row `row`
// from k0 into a (row stride kK), as bfloat16. The caller configures the tiles; this releases them.
template <typename Pack>
void many_groups(const uint16_t *xv, int64_t n, int64_t k, int64_t m, float *c, int64_t ldc, const float *xsum,
                 const Pack &pack) {
  const int64_t groups = (n + kTok - 1) / kTok;
  const int64_t pairs = (groups + 1) / 2, panel_floats = pairs * 4 * 256;  // [pair][row block][group][16 x 16]
  TileVector<float> acc((std::min(kBlockRows, m) + 31) / 32 * panel_floats);
  alignas(64) uint16_t a[kPanelSteps * 1024];
  for (int64_t j0 = 0; j0 < m; j0 += kBlockRows) {
    const int64_t j1 = std::min(m, j0 + kBlockRows);
    for (int64_t k0 = 0; k0 < k; k0 += kPanelSteps * kK) {
      const int64_t steps = std::min(kPanelSteps, (k - k0) / kK);
      for (int64_t j = j0; j < j1; j += 32) {
        const bool two = j + 32 <= j1;
        for (int r = 0; r < (two ? 32 : 16); ++r) pack(j + r, k0, steps, a + r * kK);
        float *pa = acc.data() + (j - j0) / 32 * panel_floats;
        if (two)
          panel_groups<2>(a, steps, xv + k0 * kTok, k, groups, pa, k0 == 0);
        else
          panel_groups<1>(a, steps, xv + k0 * kTok, k, groups, pa, k0 == 0);
      }
    }
    for (int64_t j = j0; j < j1; j += 32)
      for (int64_t g = 0; g < groups; ++g)
        for (int r = 0; r < (j + 32 <= j1 ? 2 : 1); ++r)
          store_block(acc.data() + (j - j0) / 32 * panel_floats + (g / 2 * 4 + r * 2 + g % 2) * 256,
                      std::min(kTok, n - g * kTok), c + g * kTok * ldc + j + 16 * r, ldc,
                      xsum ? xsum + g * kTok : nullptr);
  }
  _tile_release();
}

// bfloat16 of each float32 lane in the low half of its uint32, to nearest even (NaN stays a quiet NaN): the
// rounding of the library's other bfloat16 stores (isa_swiglu.inc), so packed int4 rows equal dequantized ones.
inline __m512i bf16_lanes(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd)), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

// One int4 row's `steps` x 32 k from k0 into the panel as bfloat16((u - z) * scale), the values the dequantized
// path (isa_linear.inc: widen_q4) gives, formed as they are packed: no pass of their own. A step of 32 inputs is
// 16 bytes, inside one group (a group is 32 or more inputs: gemm.cc). The next chunk's bytes are prefetched.
inline void pack_row_q4(const uint8_t *w, const float *scale, const uint8_t *zero, int64_t g, int64_t k0,
                        int64_t steps, uint16_t *a) {
  for (int64_t s = 0; s < steps; s += 4)
    _mm_prefetch(reinterpret_cast<const char *>(w + (k0 + (kPanelSteps + s) * kK) / 2), _MM_HINT_T0);
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t i = k0 + s * kK, c = i / g;
    const __m512 sv = _mm512_set1_ps(scale[c]), zv = _mm512_set1_ps(zero ? float(zero[c]) : 8.0f);
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(w + i / 2)));
    const __m512 lo = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15))),
                                                  zv), sv);
    const __m512 hi = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), zv), sv);
    // byte b holds inputs 2b (low nibble) and 2b + 1: one uint32 lane of the two bfloat16, in input order
    _mm512_store_si512(a + s * 1024, _mm512_or_si512(bf16_lanes(lo), _mm512_slli_epi32(bf16_lanes(hi), 16)));
  }
}

template <typename W>
void rows_of(const uint16_t *xv, int64_t n, int64_t k, const W *w, int64_t m, float *c, int64_t ldc,
             const float *xsum) {
  load_config();
  const int64_t groups = (n + kTok - 1) / kTok;
  if (groups == 1) {  // few tokens: bound by the weight read, one row block at a time
    if constexpr (std::is_same_v<W, uint16_t>) {  // read in place
      for (int64_t j = 0; j < m; j += 16) block1(xv, n, k, w + j * k, c + j, ldc);
    } else {
      int64_t j = 0;
      for (; j + 32 <= m; j += 32) one_group_q8<2>(xv, n, k, w + j * k, c + j, ldc, xsum);
      if (j < m) one_group_q8<1>(xv, n, k, w + j * k, c + j, ldc, xsum);
    }
    _tile_release();
    return;
  }
  many_groups(xv, n, k, m, c, ldc, xsum, [&](int64_t row, int64_t k0, int64_t steps, uint16_t *a) {
    pack_row(w + row * k + k0, steps, a);
  });
}

// (GCC's tile intrinsics take the tile's number as a literal: each index the kernel uses is spelled out)
#define MSW_TILE_CASE(op, ...) \
  if constexpr (I == 0) op(0 __VA_ARGS__); \
  else if constexpr (I == 1) op(1 __VA_ARGS__); \
  else if constexpr (I == 2) op(2 __VA_ARGS__); \
  else if constexpr (I == 3) op(3 __VA_ARGS__); \
  else if constexpr (I == 4) op(4 __VA_ARGS__); \
  else if constexpr (I == 5) op(5 __VA_ARGS__); \
  else if constexpr (I == 6) op(6 __VA_ARGS__); \
  else op(7 __VA_ARGS__);

struct AmxTiles {
  static void config() { load_config(); }
  static void release() { _tile_release(); }
  template <int I>
  static void zero() { MSW_TILE_CASE(_tile_zero) }
  template <int I>
  static void load(const void *p, int64_t stride) { MSW_TILE_CASE(_tile_loadd, , p, stride) }
  template <int I>
  static void store(void *p, int64_t stride) { MSW_TILE_CASE(_tile_stored, , p, stride) }
  template <int C, int A, int B>
  static void dp() {  // the products the kernel forms (amx_s8.inc)
    if constexpr (C == 0 && A == 4 && B == 6) _tile_dpbssd(0, 4, 6);
    else if constexpr (C == 1 && A == 4 && B == 7) _tile_dpbssd(1, 4, 7);
    else if constexpr (C == 2 && A == 5 && B == 6) _tile_dpbssd(2, 5, 6);
    else if constexpr (C == 3 && A == 5 && B == 7) _tile_dpbssd(3, 5, 7);
    else static_assert(C < 0, "a product amx_s8.inc does not form");
  }
};
#undef MSW_TILE_CASE

namespace hw {
#include "amx_s8.inc"
}  // namespace hw

}  // namespace

void i8_panel(const void *xp, int64_t np, int64_t k, const int8_t *w, int64_t m, int32_t *acc, int32_t c) {
  hw::s8_rows<AmxTiles>(xp, np, k, w, m, acc, c);
}

void rows(const uint16_t *xv, int64_t n, int64_t k, const uint16_t *w, int64_t m, float *c, int64_t ldc) {
  rows_of(xv, n, k, w, m, c, ldc, nullptr);
}
void rows(const uint16_t *xv, int64_t n, int64_t k, const int8_t *w, int64_t m, float *c, int64_t ldc,
          const float *xsum) {
  rows_of(xv, n, k, w, m, c, ldc, xsum);
}

void rows_q4(const uint16_t *xv, int64_t n, int64_t k, const uint8_t *w, int64_t m, float *c, int64_t ldc,
             const float *scale, const uint8_t *zero, int64_t groups) {
  load_config();
  const int64_t g = k / groups, h = k / 2;
  many_groups(xv, n, k, m, c, ldc, nullptr, [&](int64_t row, int64_t k0, int64_t steps, uint16_t *a) {
    pack_row_q4(w + row * h, scale + row * groups, zero ? zero + row * groups : nullptr, g, k0, steps, a);
  });
}

void q8_sums(const uint16_t *x, int64_t n, int64_t k, float *xsum, int64_t t0, int64_t t1) {
  const __m512bh ones = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));
  for (int64_t t = t0; t < t1; ++t) {  // each pair of bfloat16 times (1, 1): exact products, float32 sums
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 32)
      acc = _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + t * k + i)), ones);
    xsum[t] = _mm512_reduce_add_ps(acc);
  }
}
#pragma GCC pop_options

}  // namespace msw::amx
