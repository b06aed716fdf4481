// oneDNN's matmul primitive, bound at run time (dlopen + dlsym) to a libdnnl.so.3 built with the THREADPOOL
// runtime (MindSpore's), through the types of the real oneDNN headers (onednn-devel). See onednn.cc.
#pragma once

#include <cstdint>

namespace msw::onednn {

// Binds `path` (dlopen'ed when given; otherwise the libdnnl.so.3 already loaded in the process). The first call
// decides; returns a one-line description: "oneDNN 3.10.1 (threadpool) at <path>", or "unavailable: <why>".
const char *bind(const char *path);
bool available();

// c [na, nb] (row stride ldc) = a [na, k] b^T with b [nb, k]; a and b row-major. Each operand has its own dtype
// (a msw::Dtype). False when oneDNN cannot run it (the caller takes another kernel).
bool gemm(int a_d, const void *a, int64_t na, int b_d, const void *b, int64_t nb, int64_t k, int c_d, void *c,
          int64_t ldc);

// The same with int8 weights and per-row scales, b[j] = b_scale[j] * q[j]: oneDNN's weight decompression (the
// int8 rows widened inside its GEMM, exactly; computed in a's dtype, float32 sums). False when this oneDNN or
// CPU has no such matmul for a_d.
bool gemm_q8(int a_d, const void *a, int64_t na, const int8_t *b, const float *b_scale, int64_t nb, int64_t k,
             int c_d, void *c, int64_t ldc);

// c [na, nb] int32 (row stride ldc) = a b^T with a [na, k] and b [nb, k] int8, exact sums. False when oneDNN
// cannot run it.
bool gemm_s8(const int8_t *a, int64_t na, const int8_t *b, int64_t nb, int64_t k, int32_t *c, int64_t ldc);

// Whether oneDNN runs dtype d on this CPU, both ways round: x (float32 for float16) by w, and swapped.
bool takes(int d);
bool takes_q8(int a_d);  // whether gemm_q8 runs a in dtype a_d
bool takes_s8();         // whether gemm_s8 runs
// oneDNN's name for the implementation of its int8 matmul on this CPU (its ISA: avx512_core_vnni, or
// avx512_core_amx on AMX-INT8 tiles); nullptr without one
const char *s8_impl();

}  // namespace msw::onednn
