"""The C++ linear kernels alone (no MindSpore graph): each route per token count and dtype.

One MLP's worth of kernel calls (GateUpSwiglu [N,H]x[2I,H]^T, then Linear [N,I]x[H,I]^T) is timed with each
route forced, interleaved: the skinny kernel, oneDNN (y = x W^T) and oneDNN swapped (y^T = W x^T). The rows
show where each route pays (the kSkinnyMax / kSwap defaults in csrc/swiglu.cc come from this table) and how
close the decode path gets to the read bandwidth.

Usage: python -m ms_swiglu.tools.bench_linear [--preset llama-7b] [--tokens 1 4 8 16 32 64 128 256 512]
                                              [--dtype float32 float16 bfloat16] [--rounds 5] [--json F]
"""
import argparse
import sys

import numpy as np

from ms_swiglu import _cpu_kernel
from ms_swiglu.checkpoint import to_bf16_bits
from ms_swiglu.config import DTYPE_NAMES, PRESETS
from ms_swiglu.tools.timing import interleave, progress, write_json

def _cast(a, dtype):
    return to_bf16_bits(a) if dtype == "bfloat16" else a.astype(_cpu_kernel.NP_DTYPES[dtype])


def _mlp_call(x, w_gate_up, w_down, act, out, dtype, route):
    def call():
        with _cpu_kernel.forced_route(route):
            _cpu_kernel.linear(x, w_gate_up, act, dtype, swiglu=True)
            _cpu_kernel.linear(act, w_down, out, dtype)
    return call


def run(args):
    from ms_swiglu.tools.bench_mlp import bandwidth  # noqa: PLC0415

    hidden, inter = PRESETS[args.preset]
    read_bw, _ = bandwidth()
    print(f"{args.preset}: H={hidden} I={inter}; GEMM above the skinny range: {_cpu_kernel.gemm()}; "
          f"read ceiling {read_bw:.1f} GB/s")
    rng = np.random.default_rng(0)
    w_gate_up = rng.standard_normal((2 * inter, hidden), dtype=np.float32) * 0.02
    w_down = rng.standard_normal((hidden, inter), dtype=np.float32) * 0.02
    rows, done = [], 0
    for dtype in args.dtype:
        wg, wd = _cast(w_gate_up, dtype), _cast(w_down, dtype)
        for n in args.tokens:
            x = _cast(rng.standard_normal((n, hidden), dtype=np.float32), dtype)
            np_dtype = _cpu_kernel.NP_DTYPES[dtype]
            act, out = np.empty((n, inter), np_dtype), np.empty((n, hidden), np_dtype)
            st = interleave({r: _mlp_call(x, wg, wd, act, out, dtype, r) for r in _cpu_kernel.ROUTES},
                            args.rounds, warmup=1)
            row = {"dtype": dtype, "tokens": n, "route": _cpu_kernel.route(dtype, n)}
            for r, s in st.items():
                row[r] = dict(s, gflops=6 * n * hidden * inter / s["median_s"] / 1e9,
                              weight_gbps=(wg.nbytes + wd.nbytes) / s["median_s"] / 1e9)
            rows.append(row)
            done += 1
            progress("bench_linear", done, len(args.dtype) * len(args.tokens), "cells")
            best = min(_cpu_kernel.ROUTES, key=lambda r: row[r]["median_s"])
            cells = " | ".join(f"{r} {row[r]['median_s'] * 1e3:8.2f} ms {row[r]['gflops']:6.1f} GFLOP/s"
                               for r in _cpu_kernel.ROUTES)
            sk = row["skinny"]
            print(f"{dtype:>9} N={n:<4} {cells} | skinny {sk['weight_gbps']:5.1f} GB/s "
                  f"({sk['weight_gbps'] / read_bw:4.0%} of read) | fastest {best}, default {row['route']}", flush=True)
    return {"preset": args.preset, "read_gbps": read_bw, "rows": rows}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-7b", choices=sorted(PRESETS))
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 4, 8, 16, 32, 64, 128, 256, 512])
    parser.add_argument("--dtype", nargs="+", default=list(DTYPE_NAMES), choices=DTYPE_NAMES)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    data = run(args)
    if args.json:
        write_json(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
