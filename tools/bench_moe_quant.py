"""Quantized experts at decode: a MoE layer's experts in one weight format against another, several cold layers per
call (the k experts one token reaches in one layer fit in the L3; a chain of layers does not), interleaved in one
process, as ratios.

    python -m ms_swiglu.tools.bench_moe_quant [--shape qwen3-30b-a3b] [--quant int8 int4-g128] [--layers 3]
                                              [--tokens 1] [--rounds 7] [--json F]

Each chain is ``layers`` PackedMoE blocks (bfloat16 activations, the cpu backend) with random weights written in
their format as the blocks hold them (random bytes for the quantized weights, scales in [0.5, 1.5) / 64: their
speed does not depend on the values), the router random: a token reaches k experts per layer. Reported: min and
median ms per call, each format's time against the first one's (at the median and paired by round), and the
weight bytes a call reads (the router, and k experts per layer and token) per second.
"""
import argparse
import datetime
import sys

import numpy as np

from ms_swiglu.tools.bench_moe import SHAPES
from ms_swiglu.tools.timing import interleave, paired, write_json


def _chain(shape, quant, layers, seed):
    """``layers`` bfloat16 PackedMoE blocks with experts in ``quant``, weights set as the blocks hold them."""
    import mindspore as ms  # noqa: PLC0415
    from mindspore import nn  # noqa: PLC0415

    from ms_swiglu import PackedMoE  # noqa: PLC0415
    from ms_swiglu.initial import empty_weights  # noqa: PLC0415
    from ms_swiglu.mlp import load_weights  # noqa: PLC0415

    hidden, inter, e, k, _ = SHAPES[shape]
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(layers):
        with empty_weights():
            moe = PackedMoE(hidden, inter, e, k, dtype=ms.bfloat16, backend="cpu", quant=quant)
        state = {}
        for name, p in moe.parameters_and_names():
            shape_, kind = tuple(p.shape), str(p.dtype)
            if kind in ("Int8", "UInt8"):
                state[name] = rng.integers(0, 256, shape_, np.uint8).view(np.int8 if kind == "Int8" else np.uint8)
            elif name.endswith("_scale"):
                state[name] = rng.uniform(0.5, 1.5, shape_).astype(np.float32) / 64
            else:
                state[name] = (rng.standard_normal(shape_) / np.sqrt(shape_[-1])).astype(np.float32)
        blocks.append(load_weights(moe, state))
    net = nn.SequentialCell(blocks)
    net.set_inputs(ms.Tensor(shape=[None, hidden], dtype=ms.bfloat16))
    return net


def _read_bytes(shape, quant, layers, tokens):
    """The weight bytes one call reads: per layer the router and k experts per token (at most all of them)."""
    from ms_swiglu import quant as formats  # noqa: PLC0415

    hidden, inter, e, k, _ = SHAPES[shape]
    method = formats.get(quant)
    per_weight = method.bits / 8 if method.quantized else 2
    scales = 3 * hidden * inter / method.group * 4 if method.quantized and method.group else (
        (2 * inter + hidden) * 4 if method.quantized else 0)
    expert = 3 * hidden * inter * per_weight + scales
    return layers * (e * hidden * 2 + min(e, tokens * k) * expert)


def run(args):
    import mindspore as ms  # noqa: PLC0415

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    hidden = SHAPES[args.shape][0]
    chains = {q: _chain(args.shape, q, args.layers, seed=i) for i, q in enumerate(args.quant)}
    results = []
    for n in args.tokens:
        x = ms.Tensor(np.random.default_rng(n).standard_normal((n, hidden)).astype(np.float32)).astype(ms.bfloat16)
        calls = {q: (lambda net=net: net(x).asnumpy()) for q, net in chains.items()}
        st = interleave(calls, args.rounds)
        base = args.quant[0]
        for q in args.quant:
            s = st[q]
            ratio = st[base]["median_s"] / s["median_s"]
            pr = paired(st, base, q) if q != base else None
            gbps = _read_bytes(args.shape, q, args.layers, n) / s["median_s"] / 1e9
            results.append({"tokens": n, "quant": q, "min_ms": s["min_s"] * 1e3, "median_ms": s["median_s"] * 1e3,
                            f"speedup_vs_{base}": ratio, "paired": pr, "weights_gbps": gbps})
            extra = "" if pr is None else f", paired by round {pr['median']:.2f}x (p10-p90 {pr['p10']:.2f}-{pr['p90']:.2f}x)"
            print(f"T={n:4d} {q:>10}: {s['min_s'] * 1e3:8.2f} / {s['median_s'] * 1e3:8.2f} ms (min / median), "
                  f"{ratio:.2f}x {base}{extra}; reads {gbps:.1f} GB/s", flush=True)
    return {"shape": args.shape, "layers": args.layers, "results": results}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    parser.add_argument("--quant", nargs="+", default=["int8", "int4-g128"])
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--tokens", nargs="+", type=int, default=[1])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    data = run(args)
    data.update(args=vars(args), date=started)
    if args.json:
        write_json(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
