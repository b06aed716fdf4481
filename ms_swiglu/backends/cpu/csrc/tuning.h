// The tuning table: the token counts at which a linear call changes path, the blocks its kernels work in and the
// skinny kernel's tiles, as data the kernels read (gemm.cc, isa_linear.inc, amx.cc, moe.cc); msw_tuning reports
// the path ranges as JSON. Measured at llama-7b shapes (tools/bench_linear.py, direct calls paired against the
// alternative); each entry says why in one line.
#pragma once

#include <cstdint>

#include "common.h"

namespace msw {

// Token counts lo..hi; {1, 0}: none.
struct Tokens {
  int64_t lo, hi;
  constexpr bool has(int64_t n) const { return n >= lo && n <= hi; }
};

// Weight rows the skinny kernel reads at once (one register tile, one read stream each), by case.
struct SkinnyTiles {
  int rows_16bit_1;  // float16/bfloat16 weights, 1 token
  int rows_int8_1;   // int8 weights, 1 token
  int rows_int4_1;   // int4 weights, 1 token
  int rows_1_2;      // 1-2 tokens
  int rows;          // otherwise
  int rows_int8;     // otherwise, int8 weights with float32 x (widened in registers)
};

struct Tuning {
  // Paths, by the dtype of x (float32, float16, bfloat16), in the order path() checks them (gemm.cc).
  int64_t skinny_max_int8[kDtypes];  // per-row int8 weights: the skinny kernel up to this many tokens
  Tokens amx[kDtypes];               // bfloat16 on AMX tiles, where the CPU has them
  Tokens panel[kDtypes];             // the panel kernel, 16-bit weights that oneDNN takes only widened
  Tokens panel_int8[kDtypes];        // the panel kernel, int8 weights that oneDNN would read with float32 x
  int64_t skinny_max[kDtypes];       // the skinny kernel up to this many tokens
  int64_t skinny_max_widened;        // the same, 16-bit weights that oneDNN takes only widened to float32
  int64_t skinny_max_bf16_dot;       // the same, bfloat16 x on VDPBF16PS (AVX512-BF16)
  int64_t skinny_max_bf16_dot_expert;  // the same, one expert's GEMM of a MoE block
  int64_t bf16_dot_int8_from;        // int8 weights take the VDPBF16PS kernel from this many tokens
  Tokens swapped[kDtypes];           // oneDNN with the weights as its source operand
  Tokens swapped_expert[kDtypes];    // the same, one expert's GEMM of a MoE block
  int64_t onednn_int8_max;           // per-row int8 through oneDNN's weight decompression up to this many tokens
  // Blocks.
  int64_t onednn_block_rows;   // weight rows per oneDNN call whose output goes through a float32 block
  int64_t widened_block_rows;  // the same where the rows are widened to float32 for oneDNN first
  int64_t skinny_block_rows;   // linear(): the skinny kernel's output rows per thread step
  int64_t skinny_block_cols;   // gate_up_swiglu(): the same, columns of gate and of up
  int64_t dequant_bytes;       // int8 rows with group-wise scales dequantized at a time (Op::stream_grouped)
  int64_t amx_call_rows;       // weight rows per call of the amx path above one tile of tokens
  int64_t amx_dequant_x_bytes;  // the amx path dequantizes a call's rows at once where x is larger than this
  int64_t serial_elements;     // a widening pass below this many elements runs in the calling thread
  int64_t experts_per_thread;  // MoE: each expert's GEMM in one thread from this many active experts per thread
  // W8A8 (w8a8.cc, isa_w8a8.inc).
  int64_t w8a8_rows_max;        // the row kernel to this many tokens where it runs first (WeightTraits::i8_rows_first)
  int64_t w8a8_panel_max;       // then the library's panel kernel up to this many, oneDNN's int8 matmul above
  int64_t w8a8_block_rows;      // panel: weight rows per thread step, their int32 sums [rows, tokens] in L2
  // The skinny kernel (isa_linear.inc).
  SkinnyTiles tiles_32_registers;  // AVX-512
  SkinnyTiles tiles_16_registers;  // AVX2 and the generic build
  int tile_tokens;                 // tokens per register tile
  int64_t prefetch_bytes;          // how far ahead each read stream is prefetched into L1
  int64_t prefetch_far_bytes;      // how far ahead int8 rows at one token are also prefetched into L2
  int64_t widen_streams;           // int8 rows widened at once (IsaKernels widen), each a read stream
  int64_t widen_span;              // elements of each of those rows per step
  // The panel kernel (isa_linear.inc, AVX2).
  int panel_rows;         // weight rows per register tile
  int64_t panel_chunk;    // elements of k widened into L1 at a time
  int64_t panel_block;    // weight rows over which a chunk of x is reused
  // The amx kernel (amx.cc).
  int64_t amx_panel_steps;  // k steps of 32 (int8: 64, the same bytes) per packed panel of 32 weight rows
  int64_t amx_block_rows;   // weight rows whose panels share one chunk of the tokens' tiles
};

constexpr Tuning kTuning = {
    // widened in registers, in the skinny ranges; bfloat16: amx from 5 tokens (6: 9.6-10.0 ms against 8.9-9.3)
    .skinny_max_int8 = {8, 12, 4},
    // 1.2-1.9x the skinny kernel at 4 tokens and oneDNN at 8-16, 1.3x oneDNN at 512, level at 1024
    .amx = {{1, 0}, {1, 0}, {3, 512}},
    // AVX2: 1.05-1.25x what those counts took before at 16-128 tokens, 0.74-0.86x at 8-12, 0.90x at 256
    .panel = {{1, 0}, {13, 128}, {13, 128}},
    // AVX2: 1.04-1.40x oneDNN's weight decompression and the skinny kernel at 8-128 tokens, 0.90x at 256
    .panel_int8 = {{9, 128}, {9, 128}, {9, 128}},
    // one read of the weights beats oneDNN's packing (bfloat16 without AMX, 6-16 tokens: 16-28 ms against 36-53)
    .skinny_max = {8, 12, 16},
    // oneDNN on float32 rows wins from 16 tokens (12: 39.6 ms against 48.3 swapped; 16: 49.7 against 45.4)
    .skinny_max_widened = 12,
    // level with or ahead of oneDNN up to 96 tokens (64: 46-48 ms against 50), behind at 256 (179 against 169)
    .skinny_max_bf16_dot = 64,
    // one thread per expert: 1.22x the swapped path at 48 rows per expert, 0.82x at 64
    .skinny_max_bf16_dot_expert = 48,
    // at one token the float32 FMA kernel on widened x ran faster (median 1.04x)
    .bf16_dot_int8_from = 2,
    // float32: the swapped path above the skinny range; bfloat16 plain ran 1.02-1.06x faster, float16 level
    .swapped = {{9, 192}, {1, 0}, {1, 0}},
    // bfloat16 experts of few rows: 121 ms swapped against 232 plain (16 rows per expert, Qwen3-30B-A3B)
    .swapped_expert = {{9, 192}, {1, 0}, {5, 192}},
    // 1.13x the rows widened to float32 at 192 tokens, 0.95x at 256
    .onednn_int8_max = 192,
    // 256-1024 rows ran level (0.98-1.02x); fewer calls
    .onednn_block_rows = 1024,
    // the block's float32 rows stay in L3: 1.08-1.17x over 1024 rows at 32-128 tokens, 0.97x at 512
    .widened_block_rows = 256,
    // long runs for each read stream: 64 and 32 rows ran 1.06-1.1x slower at one token
    .skinny_block_rows = 256,
    .skinny_block_cols = 128,
    // in L2
    .dequant_bytes = 256 << 10,
    // the panels of a call share the tokens' tiles (amx.cc)
    .amx_call_rows = 256,
    // (group-wise int8 rows; int4 goes into the tiles as they are packed) L2: x's tiles beyond it pass once per call,
    // not once per piece: llama-7b gate/up 1.30-1.45x at 512 tokens, down (k 11008) 1.19-1.92x at 128-512 (int8-g128
    // and int4, before int4 was packed directly); at every count 0.82-0.92x where x fits L2
    .amx_dequant_x_bytes = 2 << 20,
    // waking the pool costs more than the pass
    .serial_elements = 1 << 15,
    // one GEMM per thread ran 2x faster at 1 and 16 tokens (Qwen3-30B-A3B experts), level at 256-1024
    .experts_per_thread = 2,
    // gate_up (llama-7b), one call each: 5 tokens 4.8 ms on the row kernel against 5.2-5.8 on the others; 16 and
    // 32: 6.0 and 9.2 on the panel kernel against 7.4 and 10.8 on oneDNN; 64: oneDNN 18.6 against 29.5. On
    // AMX-INT8 tiles: 6-128 tokens level with oneDNN's AMX matmul (32: 5.4 ms against 5.9), 0.94x at 512
    .w8a8_rows_max = 5,
    .w8a8_panel_max = 32,
    .w8a8_block_rows = 96,
    // 16-bit at one token +10% with 12 rows over 8; 8 int8 read streams per thread are the read probe's best; int4
    // on VDPBF16PS spills at 8 rows: 4 ran 1.09-1.10x (3 cold llama-7b layers, Xeon)
    .tiles_32_registers = {12, 8, 4, 8, 4, 4},
    // the 32-register tiles spill: one token 1.13-1.21x with 6 bfloat16 rows than 12, 1.12-1.17x with 4 int8 than 8
    .tiles_16_registers = {6, 4, 4, 4, 4, 2},
    // 4 rows x 6 tokens = 24 accumulators: 4 loads of w and 6 of x feed 24 FMAs
    .tile_tokens = 6,
    // 1.09-1.16x faster at one token than without; 256 and 768 no better
    .prefetch_bytes = 512,
    // int8 rows at one token 1.01-1.15x faster; 16-bit rows and more tokens ran slower, so they do not
    .prefetch_far_bytes = 2048,
    // one read stream reaches a fraction of the read bandwidth; 8, as the skinny kernel's, reach it
    .widen_streams = 8,
    .widen_span = 256,
    // 6 rows x 2 vectors of tokens: 12 accumulators, 2 loads of x and 6 broadcasts per step
    .panel_rows = 6,
    // 128-512 ran level at 16 tokens
    .panel_chunk = 256,
    // 48 rows ran 0.93-0.97x at 16-64 tokens
    .panel_block = 96,
    // 32 rows x 12 steps = 24 KiB stays in the 48 KiB L1 while every pair of token groups passes over it
    .amx_panel_steps = 12,
    // the tokens' tiles of one chunk stay in L2 while the block's panels pass over them
    .amx_block_rows = 256,
};

}  // namespace msw
