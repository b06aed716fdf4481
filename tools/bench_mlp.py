"""``ms-swiglu bench``: the MLP variants side by side in one run, as ratios, against this machine's ceilings.

Variants (same seeded weights; each also with jit_level O1 when asked):
    baseline          three Dense: gate, up, down (the seed article's SwiGLUMLP)
    packed-composite  one Dense 2I + split + silu + mul
    packed-cpu        one Dense 2I + the fused C++ kernel
    packed-akg        one Dense 2I + the AKG hybrid kernel (static shapes: compiled per token count)

Ceilings, measured in the same run: the GEMM ceiling (MindSpore MatMul [N,H]x[H,2I] and NumPy's matmul of the
same size; the faster one), the read bandwidth (a sum over 512 MiB) and the 2-read-1-write bandwidth (an add
of two 256 MiB arrays), each by NumPy in 1 and 2 threads and by the package's OpenMP probes in the .so
(NumPy's reductions hold the GIL, so its 2-thread read is no faster), the best kept.

With --layers L every call runs L MLPs with distinct weights, so that the weights do not sit in the L3 cache
between calls (a repeated single layer partly does: this machine has a 300 MiB L3).

Per cell: median, min and spread (p90-p10 over median) of the latency; GFLOP/s (6*N*H*I per call); for N=1 the
GB/s of weight bytes read; the fraction of the GEMM ceiling (N >= 16) or of the read bandwidth (N=1); with
--memory, the peak resident memory the call adds (each variant in its own process) and the activation bytes.

Usage: ms-swiglu bench [--preset llama-7b] [--tokens 1 16 128 512] [--dtype float32] [--jit O0 O1]
                       [--variants ...] [--rounds 7] [--memory] [--json F] [--plot F.png]
"""
import argparse
import os
import subprocess
import sys
import threading
import time

import numpy as np

from ms_swiglu.config import DTYPE_NAMES, PRESETS
from ms_swiglu.tools.timing import interleave, proc_status, progress, reset_peak_memory, write_json

VARIANTS = ("baseline", "packed-composite", "packed-cpu", "packed-akg")
SIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def activation_bytes(variant, n, hidden, inter, dtype):
    """Bytes of the intermediate tensors one call materialises (GEMM outputs, activation, copies)."""
    s = SIZE[dtype]
    if variant == "baseline":  # gate, up, silu(gate), product, out
        return (4 * n * inter + n * hidden) * s
    if variant == "packed-composite":  # gate_up, the float32 split halves, silu, product (f32), cast, out
        f32 = 4
        return 2 * n * inter * s + (4 * n * inter) * f32 + n * inter * s + n * hidden * s
    return 2 * n * inter * s + n * inter * s + n * hidden * s  # fused: gate_up, activation, out


def _build(variant, hidden, inter, dtype, jit, layers=1):
    """The variant as a chain of `layers` MLPs with distinct weights (layers > 1: weights larger than the
    L3 cache, as in a real model, where no layer's weights are still cached when it runs again)."""
    import mindspore as ms  # noqa: PLC0415
    from mindspore import nn  # noqa: PLC0415

    from ms_swiglu import SwiGLUMLP, to_packed  # noqa: PLC0415

    mlps = []
    for seed in range(layers):
        ms.set_seed(seed)
        base = SwiGLUMLP(hidden, inter, dtype=dtype)
        mlps.append(base if variant == "baseline" else to_packed(base, backend=variant.split("-", 1)[1]))
    net = mlps[0] if layers == 1 else nn.SequentialCell(mlps)
    if jit == "O1":
        net.set_jit_config(ms.JitConfig(jit_level="O1"))
    if variant != "packed-akg":
        net.set_inputs(ms.Tensor(shape=[None, hidden], dtype=getattr(ms, dtype)))
    return net


def _threads(fn, parts):
    ts = [threading.Thread(target=fn, args=p) for p in parts]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def bandwidth(rounds=5):
    """(read GB/s, 2-read-1-write GB/s), the best probe, over arrays far larger than the L3."""
    from ms_swiglu._cpu_kernel import add, read_sum  # noqa: PLC0415

    big = np.ones(128 * 2**20, np.float32)  # 512 MiB
    a, b = np.ones(64 * 2**20, np.float32), np.ones(64 * 2**20, np.float32)
    c = np.empty_like(a)
    half, q = big.size // 2, a.size // 2
    variants = {
        "read x1": lambda: big.sum(),
        "read x2": lambda: _threads(lambda i, j: big[i:j].sum(), [(0, half), (half, big.size)]),
        "add x1": lambda: np.add(a, b, out=c),
        "add x2": lambda: _threads(lambda i, j: np.add(a[i:j], b[i:j], out=c[i:j]), [(0, q), (q, a.size)]),
        "read omp": lambda: read_sum(big),
        "add omp": lambda: add(a, b, c),
    }
    st = interleave(variants, rounds, warmup=1)
    read = big.nbytes / min(st[k]["min_s"] for k in ("read x1", "read x2", "read omp")) / 1e9
    rw = 3 * a.nbytes / min(st[k]["min_s"] for k in ("add x1", "add x2", "add omp")) / 1e9
    return read, rw


def gemm_ceiling(n, hidden, inter, rounds):
    """GFLOP/s of [N,H]x[H,2I] in MindSpore (float32 MatMul, as the CPU runs every dtype) and in NumPy."""
    import mindspore as ms  # noqa: PLC0415
    from mindspore import nn, ops  # noqa: PLC0415

    class MatMul(nn.Cell):
        def __init__(self, w):
            super().__init__()
            self.w, self.mm = ms.Parameter(ms.Tensor(w), name="w"), ops.MatMul(transpose_b=True)

        def construct(self, x):
            return self.mm(x, self.w)

    rng = np.random.default_rng(0)
    w = rng.standard_normal((2 * inter, hidden)).astype(np.float32)
    x = rng.standard_normal((n, hidden)).astype(np.float32)
    cell, xt, wt = MatMul(w), ms.Tensor(x), np.ascontiguousarray(w.T)
    st = interleave({"mindspore": lambda: cell(xt), "numpy": lambda: x @ wt}, rounds)
    flops = 2 * n * hidden * 2 * inter
    return {k: flops / v["min_s"] / 1e9 for k, v in st.items()}


def memory_probe(variant, hidden, inter, dtype, n):
    """In a fresh process: the peak resident bytes one call at N tokens adds, after compiling at N=1."""
    import mindspore as ms  # noqa: PLC0415

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    net = _build(variant, hidden, inter, dtype, "O0")
    x1 = ms.Tensor(np.ones((1, hidden), np.float32)).astype(getattr(ms, dtype))
    xn = ms.Tensor(np.ones((n, hidden), np.float32)).astype(getattr(ms, dtype))
    if variant != "packed-akg":
        net(x1)
    x = xn  # built before the reset: the input is not an activation
    rss0 = reset_peak_memory()
    net(x)
    return proc_status("VmHWM") - rss0




def _memory(variant, hidden, inter, dtype, n):
    cmd = [sys.executable, "-m", "ms_swiglu.tools.bench_mlp", "--probe", variant, str(hidden), str(inter), dtype,
           str(n)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"memory probe {variant} N={n}: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return int(r.stdout.strip().splitlines()[-1])


def run(args):
    import mindspore as ms  # noqa: PLC0415

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    read_bw, rw_bw = bandwidth()
    print(f"ceilings: read {read_bw:.1f} GB/s, 2-read-1-write {rw_bw:.1f} GB/s (best of NumPy and OpenMP probes)")
    results, total, done = [], len(args.preset) * len(args.dtype) * len(args.tokens), 0
    for preset in args.preset:
        hidden, inter = PRESETS[preset]
        for dtype in args.dtype:
            nets = {(v, j): _build(v, hidden, inter, dtype, j, args.layers) for v in args.variants
                    for j in args.jit}
            for n in args.tokens:
                ceil = gemm_ceiling(n, hidden, inter, args.rounds)
                x = ms.Tensor(np.random.default_rng(n).standard_normal((n, hidden)).astype(np.float32)).astype(
                    getattr(ms, dtype))
                stats = interleave({f"{v}/{j}": (lambda net=net: net(x)) for (v, j), net in nets.items()},
                                   args.rounds)
                flops = 6 * n * hidden * inter * args.layers
                weight_bytes = 3 * hidden * inter * SIZE[dtype] * args.layers
                best_gemm = max(ceil.values())
                cell = {"preset": preset, "dtype": dtype, "tokens": n, "hidden": hidden, "inter": inter,
                        "gemm_ceiling_gflops": ceil, "read_gbps": read_bw, "rw_gbps": rw_bw, "variants": {}}
                base_med = stats[f"baseline/{args.jit[0]}"]["median_s"] if "baseline" in args.variants else None
                for key, st in stats.items():
                    v = key.split("/")[0]
                    gflops = flops / st["median_s"] / 1e9
                    entry = dict(st, gflops=gflops, activation_bytes=activation_bytes(v, n, hidden, inter, dtype),
                                 speedup_vs_baseline=base_med / st["median_s"] if base_med else None)
                    if n == 1:
                        entry["weight_gbps"] = weight_bytes / st["median_s"] / 1e9
                        entry["fraction_of_ceiling"] = entry["weight_gbps"] / read_bw
                    else:
                        entry["fraction_of_ceiling"] = gflops / best_gemm
                    if args.memory and key.endswith("/" + args.jit[0]):
                        entry["peak_added_bytes"] = _memory(v, hidden, inter, dtype, n)
                    cell["variants"][key] = entry
                results.append(cell)
                done += 1
                progress("bench", done, total, "cells")
                _print_cell(cell)
    return {"read_gbps": read_bw, "rw_gbps": rw_bw, "results": results}


def _print_cell(cell):
    ceil = cell["gemm_ceiling_gflops"]
    print(f"\n{cell['preset']} {cell['dtype']} N={cell['tokens']}: GEMM ceiling MindSpore {ceil['mindspore']:.0f}, "
          f"NumPy {ceil['numpy']:.0f} GFLOP/s")
    print(f"  {'variant':<24} {'median ms':>10} {'min ms':>9} {'spread':>7} {'GFLOP/s':>8} {'vs base':>8} "
          f"{'of ceil':>8} {'act MB':>8} {'peak MB':>8}")
    for key, e in cell["variants"].items():
        peak = f"{e['peak_added_bytes'] / 2**20:8.1f}" if "peak_added_bytes" in e else f"{'-':>8}"
        vs = f"{e['speedup_vs_baseline']:7.2f}x" if e["speedup_vs_baseline"] else f"{'-':>8}"
        print(f"  {key:<24} {e['median_s'] * 1e3:10.2f} {e['min_s'] * 1e3:9.2f} {e['spread']:7.2f} "
              f"{e['gflops']:8.1f} {vs} {e['fraction_of_ceiling']:8.0%} {e['activation_bytes'] / 2**20:8.1f} {peak}",
              flush=True)


def plot(data, path):
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    groups = sorted({(c["preset"], c["dtype"]) for c in data["results"]})
    fig, axes = plt.subplots(len(groups), 2, figsize=(12, 4 * len(groups)), squeeze=False)
    for row, (preset, dtype) in enumerate(groups):
        cells = [c for c in data["results"] if (c["preset"], c["dtype"]) == (preset, dtype)]
        ns = [c["tokens"] for c in cells]
        for key in cells[0]["variants"]:
            axes[row][0].plot(ns, [c["variants"][key]["gflops"] for c in cells], marker="o", label=key)
            axes[row][1].plot(ns, [c["variants"][key]["activation_bytes"] / 2**20 for c in cells], marker="o",
                              label=key + " (activations)")
            if "peak_added_bytes" in cells[0]["variants"][key]:
                axes[row][1].plot(ns, [c["variants"][key]["peak_added_bytes"] / 2**20 for c in cells], ls="--",
                                  marker="x", label=key + " (peak added)")
        axes[row][0].plot(ns, [max(c["gemm_ceiling_gflops"].values()) for c in cells], "k--", label="GEMM ceiling")
        axes[row][0].set(xscale="log", xlabel="tokens N", ylabel="GFLOP/s", title=f"{preset} {dtype}: throughput")
        axes[row][1].set(xscale="log", yscale="log", xlabel="tokens N", ylabel="MiB", title="memory")
        axes[row][0].legend(fontsize=7)
        axes[row][1].legend(fontsize=7)
    fig.tight_layout()
    tmp = f"{path}.tmp{os.getpid()}.png"
    fig.savefig(tmp, dpi=80)
    os.replace(tmp, path)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--probe":
        variant, hidden, inter, dtype, n = argv[1:]
        print(memory_probe(variant, int(hidden), int(inter), dtype, int(n)))
        return 0
    parser = argparse.ArgumentParser(prog="ms-swiglu bench", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", nargs="+", default=["llama-7b"], choices=sorted(PRESETS))
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 16, 128, 512])
    parser.add_argument("--dtype", nargs="+", default=["float32"], choices=DTYPE_NAMES)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--jit", nargs="+", default=["O0"], choices=("O0", "O1"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--layers", type=int, default=1,
                        help="chain this many MLPs with distinct weights per call (> 1: cold caches, as in a model)")
    parser.add_argument("--memory", action="store_true", help="peak memory per variant, each in its own process")
    parser.add_argument("--json")
    parser.add_argument("--plot")
    args = parser.parse_args(argv)
    t0 = time.time()
    data = run(args)
    data["args"] = vars(args)
    data["seconds"] = time.time() - t0
    if args.json:
        write_json(args.json, data)
    if args.plot:
        plot(data, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
