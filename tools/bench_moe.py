"""Benchmark of the MoE block: does a layer of E experts cost what its k active experts cost?

Variants, interleaved in one loop per (shape, T), every dtype in the same loop (min / median ms):
    moe      PackedMoE(H, I, E, k): router, the two grouped GEMMs of the backend, the weighted sum
    dense    PackedSwiGLUMLP(H, k*I): the same useful FLOPs in one dense MLP (the goal: moe/dense <= 1.3)
    read     at T=1, the streaming read of 1 GiB (tools/probes.py): the decode ceiling, in the same rounds

At T=1 a call must read the k active experts' weights and the router: moe reports those bytes per second and
their fraction of the read probe (median against median; never above 100%: tools/probes.py, Ceiling). At large
T every expert is active (P(unused) = (1 - k/E)^T), so a call reads all E experts' weights once: the table gives
that floor (weight bytes / read bandwidth) beside the times. Each (shape, dtype) also reports, each in a fresh
process: build + first call of the block, and the peak resident memory one call adds against T*k*(H+I)
(activations) and the stacked weights (a copy of which would show as a peak that large).

Usage: python -m ms_swiglu.tools.bench_moe [--shape qwen3-30b-a3b mixtral-8x7b] [--tokens 1 16 256 1024]
                                           [--dtype float32 bfloat16] [--backend cpu] [--rounds 7] [--json F]
"""
import argparse
import datetime
import sys
import time

import numpy as np

from ms_swiglu.progress import progress
from ms_swiglu.tools.probes import Ceiling, ProbeError, read_rates, read_sum
from ms_swiglu.tools.timing import interleave, probe_process, proc_status, reset_peak_memory, write_json

# (hidden_size, moe_intermediate_size, num_experts, top_k, default token counts)
SHAPES = {
    "qwen3-30b-a3b": (2048, 768, 128, 8, (1, 16, 256, 1024)),
    "mixtral-8x7b": (4096, 14336, 8, 2, (1, 512)),
    "tiny": (64, 32, 16, 4, (1, 8)),
}
SIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
READ_PROBE_FLOATS = 256 * 2**20  # 1 GiB


def _blocks(shape, dtype, backend, experts=None):
    """(moe, dense) with seeded random weights: the MoE block and the dense MLP of its active size."""
    import mindspore as ms  # noqa: PLC0415

    from ms_swiglu import PackedMoE, PackedSwiGLUMLP  # noqa: PLC0415

    hidden, inter, e, k, _ = SHAPES[shape]
    ms.set_seed(0)
    moe = PackedMoE(hidden, inter, experts or e, k, dtype=getattr(ms, dtype), backend=backend)
    dense = PackedSwiGLUMLP(hidden, k * inter, dtype=getattr(ms, dtype), backend=backend)
    for net in (moe, dense):
        net.set_inputs(ms.Tensor(shape=[None, hidden], dtype=getattr(ms, dtype)))
    return moe, dense


def probe(kind, shape, dtype, backend, arg):
    """In a fresh process: ``build`` (arg = E): seconds to build the block as the checkpoint loaders do (Cells and
    placeholder Parameters, ``ms_swiglu.initial.empty_weights``), to load its weights from float32 arrays already in
    memory (as read from a checkpoint; proportional to E) and to compile and run its first call, comma-separated;
    ``memory`` (arg = T): the peak resident bytes one call at T tokens adds (after one at T=1)."""
    import mindspore as ms  # noqa: PLC0415

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    hidden = SHAPES[shape][0]
    if kind == "build":
        from ms_swiglu.initial import empty_weights  # noqa: PLC0415
        from ms_swiglu.mlp import load_weights  # noqa: PLC0415

        t0 = time.perf_counter()
        with empty_weights():
            moe, _ = _blocks(shape, dtype, backend, experts=arg)
        build = time.perf_counter() - t0
        state = {name: np.full(p.shape, 0.01, np.float32) for name, p in moe.parameters_and_names()}
        t0 = time.perf_counter()
        load_weights(moe, state)
        load = time.perf_counter() - t0
        t0 = time.perf_counter()
        moe(ms.Tensor(np.ones((1, hidden), np.float32)).astype(getattr(ms, dtype))).asnumpy()
        return f"{build},{load},{time.perf_counter() - t0}"
    moe, _ = _blocks(shape, dtype, backend)
    moe(ms.Tensor(np.ones((1, hidden), np.float32)).astype(getattr(ms, dtype))).asnumpy()
    x = ms.Tensor(np.random.default_rng(0).standard_normal((arg, hidden)).astype(np.float32)).astype(getattr(ms, dtype))
    rss0 = reset_peak_memory()
    moe(x).asnumpy()
    return proc_status("VmHWM") - rss0


def _probe(kind, shape, dtype, backend, arg):
    out = probe_process("ms_swiglu.tools.bench_moe", [kind, shape, dtype, backend, arg], f"{kind} probe {shape} {dtype}",
                        timeout=3600)
    return [float(v) for v in out.split(",")] if kind == "build" else float(out)


def run(args):
    import mindspore as ms  # noqa: PLC0415

    from ms_swiglu.tools.bench_mlp import bandwidth  # noqa: PLC0415

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    read_bw, _ = bandwidth()
    print(f"read bandwidth {read_bw:.1f} GB/s (best probe, at the start); backend {args.backend}")
    big, results = None, []
    for shape in args.shape:
        hidden, inter, e, k, default_tokens = SHAPES[shape]
        tokens = args.tokens or default_tokens
        nets = {d: _blocks(shape, d, args.backend) for d in args.dtype}
        print(f"\n{shape}: H={hidden} I={inter} E={e} k={k}; dense = PackedSwiGLUMLP(H, k*I={k * inter})")
        head = (f"{'T':>5} {'dtype':>9} | {'moe ms':>15} {'dense ms':>15} | {'moe/dense':>9} {'(min)':>6} | "
                f"{'floor ms':>8} {'moe GB/s':>8} {'of read':>7}")
        print(head + "\n" + "-" * len(head))
        for n in tokens:
            x32 = np.random.default_rng(n).standard_normal((n, hidden)).astype(np.float32)
            calls = {}
            for d, (moe, dense) in nets.items():
                x = ms.Tensor(x32).astype(getattr(ms, d))
                calls[f"moe/{d}"] = lambda moe=moe, x=x: moe(x).asnumpy()
                calls[f"dense/{d}"] = lambda dense=dense, x=x: dense(x).asnumpy()
            if n == 1:
                big = np.ones(READ_PROBE_FLOATS, np.float32) if big is None else big
                calls["read"] = lambda: read_sum(big)
            st = interleave(calls, args.rounds)
            read = {"median": 4 * READ_PROBE_FLOATS / st["read"]["median_s"] / 1e9,
                    "best": 4 * READ_PROBE_FLOATS / st["read"]["min_s"] / 1e9} if n == 1 else None
            cells, floors = [], []
            for d in args.dtype:
                s = SIZE[d]
                moe_st, dense_st = st[f"moe/{d}"], st[f"dense/{d}"]
                active = min(e, n * k)  # experts a call can touch at most
                weight_bytes = 3 * hidden * inter * s * active + e * hidden * s  # + the router
                cell = {"shape": shape, "dtype": d, "tokens": n, "hidden": hidden, "inter": inter, "experts": e,
                        "top_k": k, "moe": moe_st, "dense": dense_st,
                        "moe_over_dense": moe_st["median_s"] / dense_st["median_s"],
                        "moe_over_dense_min": moe_st["min_s"] / dense_st["min_s"],
                        "expected_active_experts": e * (1 - (1 - k / e) ** n),
                        "all_experts_read_floor_ms": 3 * hidden * inter * s * e / (read_bw * 1e9) * 1e3,
                        "read_gbps_in_rounds": read}
                if n == 1:
                    cell["weight_gbps"] = weight_bytes / moe_st["median_s"] / 1e9
                cells.append(cell)
                floors.append(cell["all_experts_read_floor_ms"] if n * k >= e else weight_bytes / (read_bw * 1e9) * 1e3)
            if n == 1:  # every dtype's fraction of the same ceiling (measured again where one is above it)
                ceiling = Ceiling("read probe's median in the same rounds", read["median"], "GB/s",
                                  lambda: read_rates(big)["all_threads"])
                fractions = ceiling.fractions({f"{shape} moe {c['dtype']} T=1": c["weight_gbps"] for c in cells})
                for c in cells:
                    c["fraction_of_read"] = fractions[f"{shape} moe {c['dtype']} T=1"]
                    c["remeasured"] = {ceiling.name: ceiling.record()} if ceiling.record() else {}
            for cell, floor in zip(cells, floors):
                results.append(cell)
                moe_st, dense_st = cell["moe"], cell["dense"]
                of_read = f"{cell['fraction_of_read']:7.0%}" if n == 1 else f"{'-':>7}"
                gbps = f"{cell['weight_gbps']:8.1f}" if n == 1 else f"{'-':>8}"
                print(f"{n:5d} {cell['dtype']:>9} | {moe_st['min_s'] * 1e3:6.1f}/{moe_st['median_s'] * 1e3:8.1f} "
                      f"{dense_st['min_s'] * 1e3:6.1f}/{dense_st['median_s'] * 1e3:8.1f} | "
                      f"{cell['moe_over_dense']:9.2f} {cell['moe_over_dense_min']:6.2f} | {floor:8.1f} {gbps} {of_read}",
                      flush=True)
        del nets
        for d in args.dtype:
            if args.no_probes:
                continue
            build = {ex: _probe("build", shape, d, args.backend, ex) for ex in sorted({8, e})}
            mem = {n: _probe("memory", shape, d, args.backend, n) for n in (max(tokens),)}
            n = max(tokens)
            act = n * k * (hidden + inter) * SIZE[d]
            weights = 3 * e * hidden * inter * SIZE[d]
            results.append({"shape": shape, "dtype": d, "build_and_first_call_s": build,
                            "peak_added_bytes": mem, "activation_bytes_tk_h_plus_i": act, "stacked_weight_bytes": weights})
            builds = ", ".join(f"E={ex}: build {b:.1f} s + load {w:.1f} s + compile and first call {c:.1f} s"
                               for ex, (b, w, c) in build.items())
            print(f"{shape} {d}: {builds}; one call at T={n} adds {mem[n] / 2**20:.1f} MiB "
                  f"(T*k*(H+I) = {act / 2**20:.1f} MiB; the stacked weights are {weights / 2**20:.0f} MiB)", flush=True)
        progress("bench_moe", args.shape.index(shape) + 1, len(args.shape), "shapes")
    print("times: min/median ms; ratios at the median (and at the min); floor: the weight bytes a call must read "
          "(all experts once when T*k >= E) at the read bandwidth")
    return {"read_gbps": read_bw, "backend": args.backend, "results": results}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--probe":
        kind, shape, dtype, backend, arg = argv[1:]
        print(probe(kind, shape, dtype, backend, int(arg)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", nargs="+", default=["qwen3-30b-a3b"], choices=sorted(SHAPES))
    parser.add_argument("--tokens", nargs="+", type=int, help="default: the shape's own list")
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=sorted(SIZE))
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-probes", action="store_true", help="skip the build and memory probes")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        data = run(args)
    except ProbeError as e:  # a ceiling not measured, or a figure above it: no report rather than a wrong one
        print(f"bench_moe: refused: {e}", file=sys.stderr)
        return 1
    data["args"] = vars(args)
    data["date"] = started  # when the run started, UTC (tools/docs.py keeps the latest run per machine kind)
    if args.json:
        write_json(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
