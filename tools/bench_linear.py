"""The C++ linear kernels alone (no MindSpore graph): each GEMM path per token count and dtype.

One MLP's worth of kernel calls (GateUpSwiglu [N,H]x[2I,H]^T, then Linear [N,I]x[H,I]^T) is timed with each
path forced, interleaved: the skinny kernel, oneDNN (y = x W^T) and oneDNN swapped (y^T = W x^T). The rows
show where each path pays (the library's tuning table, ``kernels.tuning()``, comes from this table) and how
close the decode path gets to the read bandwidth (never above 100% of it: tools/probes.py, Ceiling).

Usage: python -m ms_swiglu.tools.bench_linear [--preset llama-7b] [--tokens 1 4 8 16 32 64 128 256 512]
                                              [--dtype float32 float16 bfloat16] [--rounds 5] [--settle S] [--json F]
"""
import argparse
import sys

import numpy as np

from ms_swiglu.backends.cpu import kernels
from ms_swiglu.checkpoint import to_bf16_bits
from ms_swiglu.config import DTYPE_NAMES, PRESETS
from ms_swiglu.progress import progress
from ms_swiglu.tools.probes import Ceiling, ProbeError, read_rates
from ms_swiglu.tools.timing import add_settle_option, interleave, write_json

def _cast(a, dtype):
    return to_bf16_bits(a) if dtype == "bfloat16" else a.astype(kernels.NP_DTYPES[dtype])


def _mlp_call(x, w_gate_up, w_down, act, out, dtype, path):
    def call():
        with kernels.forced_path(path):
            kernels.linear(x, w_gate_up, act, dtype, swiglu=True)
            kernels.linear(act, w_down, out, dtype)
    return call


def run(args):
    from ms_swiglu.tools.bench_mlp import bandwidth  # noqa: PLC0415

    hidden, inter = PRESETS[args.preset]
    read_bw, _ = bandwidth(settle=args.settle)
    read = Ceiling("read bandwidth (the best probe at the start)", read_bw, "GB/s",
                   lambda: read_rates(np.ones(2**28, np.float32))["all_threads"])  # 1 GiB, as bandwidth()'s
    print(f"{args.preset}: H={hidden} I={inter}; GEMM above the skinny range: {kernels.onednn()}; "
          f"read ceiling {read_bw:.1f} GB/s")
    rng = np.random.default_rng(0)
    w_gate_up = rng.standard_normal((2 * inter, hidden), dtype=np.float32) * 0.02
    w_down = rng.standard_normal((hidden, inter), dtype=np.float32) * 0.02
    rows, done = [], 0
    for dtype in args.dtype:
        wg, wd = _cast(w_gate_up, dtype), _cast(w_down, dtype)
        for n in args.tokens:
            x = _cast(rng.standard_normal((n, hidden), dtype=np.float32), dtype)
            np_dtype = kernels.NP_DTYPES[dtype]
            act, out = np.empty((n, inter), np_dtype), np.empty((n, hidden), np_dtype)
            st = interleave({r: _mlp_call(x, wg, wd, act, out, dtype, r) for r in kernels.paths()},
                            args.rounds, warmup=1, settle=args.settle)
            row = {"dtype": dtype, "tokens": n, "path": kernels.path(dtype, n)}
            for r, s in st.items():
                row[r] = dict(s, gflops=6 * n * hidden * inter / s["median_s"] / 1e9,
                              weight_gbps=(wg.nbytes + wd.nbytes) / s["median_s"] / 1e9)
            rows.append(row)
            done += 1
            progress("bench_linear", done, len(args.dtype) * len(args.tokens), "cells")
            best = min(kernels.paths(), key=lambda r: row[r]["median_s"])
            cells = " | ".join(f"{r} {row[r]['median_s'] * 1e3:8.2f} ms {row[r]['gflops']:6.1f} GFLOP/s"
                               for r in kernels.paths())
            sk, what = row["skinny"], f"skinny {dtype} N={n}"
            of_read = read.fractions({what: sk["weight_gbps"]})[what]
            print(f"{dtype:>9} N={n:<4} {cells} | skinny {sk['weight_gbps']:5.1f} GB/s "
                  f"({of_read:4.0%} of read) | fastest {best}, default {row['path']}", flush=True)
    return {"preset": args.preset, "read_gbps": read.value, "remeasured": read.record(), "settle_s": args.settle,
            "rows": rows}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-7b", choices=sorted(PRESETS))
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 4, 8, 16, 32, 64, 128, 256, 512])
    parser.add_argument("--dtype", nargs="+", default=list(DTYPE_NAMES), choices=DTYPE_NAMES)
    parser.add_argument("--rounds", type=int, default=5)
    add_settle_option(parser)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    try:
        data = run(args)
    except ProbeError as e:  # a ceiling not measured, or a figure above it: no report rather than a wrong one
        print(f"bench_linear: refused: {e}", file=sys.stderr)
        return 1
    if args.json:
        write_json(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
