// The vector kernels, compiled for AVX-512 with and without AVX512-BF16 (with AVX512-VNNI, which every CPU with
// AVX512-BF16 has), AVX2 and a generic x86-64 baseline in one .so; the ISA is chosen at run time (the best this
// CPU has), so the .so loads on any x86-64. AMX-INT8 hosts run the AVX512-BF16 row with W8A8's panel kernel on
// the tiles (amx.cc).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "amx.h"
#include "common.h"
#include "tuning.h"

namespace msw {

const char *const kDtypeNames[kDtypes] = {"float32", "float16", "bfloat16"};
const FormatRow kFormatRows[kFormats] = {{"int8", 8, false, kWeightsInt8}, {"int8-group", 8, true, kWeightsInt8Group},
                                         {"int4-group", 4, true, kWeightsInt4Group},
                                         {"w8a8", 8, false, kWeightsW8A8, true, 0},
                                         {"w8a8-static", 8, false, kWeightsW8A8, true, 2}};

int dtype_index(const char *name) {
  const std::string d(name);
  if (d == "float") return kF32;  // MindSpore's other name for float32
  for (int i = 0; i < kDtypes; ++i)
    if (d == kDtypeNames[i]) return i;
  return -1;
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c,avx512bf16,avx512vnni")
namespace avx512bf16 {
#define MSW_W 16
#define MSW_DPBF16
#define MSW_VNNI
#include "isa_swiglu.inc"
#include "isa_linear.inc"
#include "isa_w8a8.inc"
#include "isa_norm.inc"
#include "isa_table.inc"
#undef MSW_VNNI
#undef MSW_DPBF16
#undef MSW_W
}  // namespace avx512bf16
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
namespace avx512 {
#define MSW_W 16
#include "isa_swiglu.inc"
#include "isa_linear.inc"
#include "isa_w8a8.inc"
#include "isa_norm.inc"
#include "isa_table.inc"
#undef MSW_W
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
#define MSW_W 8
#define MSW_MADD
#define MSW_PANEL
#include "isa_swiglu.inc"
#include "isa_linear.inc"
#include "isa_w8a8.inc"
#include "isa_norm.inc"
#include "isa_table.inc"
#undef MSW_PANEL
#undef MSW_MADD
#undef MSW_W
}  // namespace avx2
#pragma GCC pop_options

namespace generic {
#define MSW_W 4
#include "isa_swiglu.inc"
#include "isa_linear.inc"
#include "isa_w8a8.inc"
#include "isa_norm.inc"
#include "isa_table.inc"
#undef MSW_W
}  // namespace generic

namespace {
constexpr IsaKernels amx_kernels() {
  IsaKernels k = avx512bf16::kernels("avx512amx");
  WeightTraits &w8 = k.weights[kWeightsW8A8];
  w8.pack_panel = amx::pack_panel_s8;
  w8.i8_panel = amx::i8_panel;
  w8.i8_panel_dot = "tdpbssd";
  return k;
}

constexpr IsaKernels kIsas[] = {  // best first
    amx_kernels(), avx512bf16::kernels("avx512bf16"), avx512::kernels("avx512"), avx2::kernels("avx2"),
    generic::kernels("generic")};

int best_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512vnni")) return 2;
    return amx::available_s8() ? 0 : 1;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return 3;
  return 4;
}

const int kBestIsa = best_isa();
int g_isa = kBestIsa;
}  // namespace

const IsaKernels &isa() { return kIsas[g_isa]; }

const char *isa_name(int i) {
  const int j = kBestIsa + i, n = int(sizeof kIsas / sizeof kIsas[0]);
  return i >= 0 && j < n ? kIsas[j].name : nullptr;
}

int set_isa(const char *name) {
  for (int i = kBestIsa; i < int(sizeof kIsas / sizeof kIsas[0]); ++i) {
    if (name == std::string(kIsas[i].name)) {
      g_isa = i;
      return 0;
    }
  }
  return -1;
}

}  // namespace msw
