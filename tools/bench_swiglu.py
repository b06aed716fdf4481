"""Benchmark of the fused SwiGLU op: the C++ `cpu` kernel against `composite` and the machine's copy bandwidth.

All variants of one shape run interleaved in one process (timings here drift 20-40% between runs), and each
is reported as min / median over the rounds, as GB/s of bytes read + written, and as ratios:

    cpu / composite      speed-up of the fused op over split + silu + mul (both compiled MindSpore graphs)
    cpu / ceiling        fraction of the copy bandwidth measured in this run for the same number of bytes

Variants:
    kernel      the .so called directly through ctypes (no framework overhead), into one reused output
    kernel+new  the same into a freshly allocated output each call, as a graph output is (page faults)
    cpu         SwiGLU("cpu") in a GRAPH_MODE Cell
    composite   SwiGLU("composite") in a GRAPH_MODE Cell
    copy        NumPy copy of as many bytes as the op moves, in 1 and in 2 threads; the best is the ceiling

Usage: python -m ms_swiglu.tools.bench_swiglu [--rounds 30] [--json FILE]
"""
import argparse
import ctypes
import os
import sys
import threading

import mindspore as ms
import numpy as np

from ms_swiglu import SwiGLU
from ms_swiglu.backends.cpu.kernels import isa, library_path as kernel_path
from ms_swiglu.tools.timing import interleave, write_json

SHAPES = [(1, 22016), (128, 22016), (512, 22016)]
DTYPES = {"float32": (ms.float32, np.float32, 4), "bfloat16": (ms.bfloat16, np.uint16, 2)}


def _ctypes_call(x, y, dtype):
    """SwigluFwd(x -> y) on NumPy buffers, as MindSpore would call it."""
    fn = ctypes.CDLL(kernel_path()).SwigluFwd
    params = (ctypes.c_void_p * 2)(x.ctypes.data, y.ctypes.data)
    ndims = (ctypes.c_int * 2)(x.ndim, y.ndim)
    shp = [(ctypes.c_int64 * a.ndim)(*a.shape) for a in (x, y)]
    shapes = (ctypes.POINTER(ctypes.c_int64) * 2)(*[ctypes.cast(s, ctypes.POINTER(ctypes.c_int64)) for s in shp])
    dtypes = (ctypes.c_char_p * 2)(dtype.encode(), dtype.encode())

    keep = (x, y, shp)  # the kernel gets raw pointers: these must outlive every call

    def call():
        if fn(2, params, ndims, shapes, dtypes, None, None) != 0:
            raise RuntimeError("SwigluFwd failed")

    return call, keep


def _copy(nbytes, threads):
    """Copy nbytes/2 bytes (nbytes moved: read + write) split over `threads` threads."""
    src = np.ones(nbytes // 2 // 4 + 1, np.float32)
    dst = np.empty_like(src)
    parts = np.array_split(np.arange(src.size), threads)
    bounds = [(p[0], p[-1] + 1) for p in parts if p.size]

    def one(a, b):
        np.copyto(dst[a:b], src[a:b])

    def call():
        if threads == 1:
            one(*bounds[0])
            return
        ts = [threading.Thread(target=one, args=ab) for ab in bounds]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    return call


def bench_shape(rows, width, dtype, rounds):
    ms_dtype, np_dtype, size = DTYPES[dtype]
    inter = width // 2
    moved = rows * width * size + rows * inter * size  # read x, write y
    rng = np.random.default_rng(0)
    x32 = rng.standard_normal((rows, width)).astype(np.float32)
    xt = ms.Tensor(x32).astype(ms_dtype)
    x_np = x32 if dtype == "float32" else (x32.view(np.uint32) >> 16).astype(np.uint16)
    y_np = np.empty((rows, inter), np_dtype)
    kernel, _keep = _ctypes_call(x_np, y_np, dtype)

    def kernel_new():
        call, _keep = _ctypes_call(x_np, np.empty_like(y_np), dtype)
        call()

    cells = {"cpu": SwiGLU("cpu"), "composite": SwiGLU("composite")}
    variants = {
        "kernel": kernel,
        "kernel+new": kernel_new,
        "cpu": lambda: cells["cpu"](xt),  # CPU graphs run synchronously: the call returns when done
        "composite": lambda: cells["composite"](xt),
        "copy x1": _copy(moved, 1),
        "copy x2": _copy(moved, 2),
    }
    stats = interleave(variants, rounds)
    for s in stats.values():
        s["gbps_best"] = moved / s["min_s"] / 1e9
        s["gbps_median"] = moved / s["median_s"] / 1e9
    ceiling = max(stats["copy x1"]["gbps_best"], stats["copy x2"]["gbps_best"])
    return {
        "shape": [rows, width], "dtype": dtype, "bytes_moved": moved, "variants": stats,
        "ceiling_gbps": ceiling,
        "cpu_over_composite_median": stats["composite"]["median_s"] / stats["cpu"]["median_s"],
        "cpu_over_composite_min": stats["composite"]["min_s"] / stats["cpu"]["min_s"],
        "cpu_fraction_of_ceiling": stats["cpu"]["gbps_best"] / ceiling,
        "kernel_fraction_of_ceiling": stats["kernel"]["gbps_best"] / ceiling,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    print(f"kernel ISA {isa()}, {os.cpu_count()} cores, {args.rounds} interleaved rounds; GB/s = bytes read+written")
    head = f"{'shape':>14} {'dtype':>8} | {'kernel':>13} {'kernel+new':>13} {'cpu':>13} {'composite':>13} {'ceiling':>7} |" \
           f" {'cpu/comp':>13} {'cpu/ceil':>8} {'kern/ceil':>9}"
    print(head + "\n" + "-" * len(head))
    results = []
    for dtype in DTYPES:
        for rows, width in SHAPES:
            r = bench_shape(rows, width, dtype, args.rounds)
            results.append(r)
            v = r["variants"]

            def cell(k):
                return f"{v[k]['gbps_best']:5.1f}/{v[k]['gbps_median']:5.1f}"

            print(f"{str((rows, width)):>14} {dtype:>8} | {cell('kernel'):>13} {cell('kernel+new'):>13} {cell('cpu'):>13} "
                  f"{cell('composite'):>13} {r['ceiling_gbps']:7.1f} | "
                  f"{r['cpu_over_composite_min']:5.2f}x/{r['cpu_over_composite_median']:5.2f}x "
                  f"{r['cpu_fraction_of_ceiling']:8.0%} {r['kernel_fraction_of_ceiling']:9.0%}", flush=True)
    print("cells: best/median GB/s; cpu/comp: speed-up at min/median time")
    if args.json:
        write_json(args.json, {"isa": isa(), "rounds": args.rounds, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
