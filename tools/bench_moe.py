"""Benchmark of the sparse MoE block: its cost should grow with top_k, not with num_experts.

Variants (same weights, float32, GRAPH_MODE, interleaved rounds; min / median ms):
    moe        PackedMoE: each expert computes only its routed tokens (T * k expert rows in all)
    dense-all  every expert on every token, weighted by the same routing (T * E expert rows)
    mlp        one packed expert MLP on the T tokens (the cost of one dense expert pass)

FLOPs executed per call: moe 6*H*I*T*k + 2*H*E*T, dense-all 6*H*I*T*E + 2*H*E*T, mlp 6*H*I*T.
Goal: moe <= 1.5 * k * mlp (the cost of k dense expert passes over the same tokens).

Usage: python -m ms_swiglu.tools.bench_moe [--preset small] [--experts 8] [--top-k 2] [--tokens 16 128 512]
"""
import argparse
import sys

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from ms_swiglu import PackedMoE, PackedSwiGLUMLP, SwiGLU, preset, route
from ms_swiglu.config import PRESETS
from ms_swiglu.tools.timing import interleave, write_json


class DenseAllExperts(nn.Cell):
    """Every expert on every token: [T, H] -> [E, T, 2I] -> [E, T, I] -> [E, T, H], then the routed sum."""

    def __init__(self, moe):
        super().__init__()
        self.moe, self.act = moe, SwiGLU("cpu")
        stack = [np.stack([getattr(x, name).weight.asnumpy().T for x in moe.experts]) for name in
                 ("gate_up_proj", "down_proj")]
        self.gate_up_t = ms.Parameter(ms.Tensor(stack[0]), name="gate_up_t")  # [E, H, 2I]
        self.down_t = ms.Parameter(ms.Tensor(stack[1]), name="down_t")  # [E, I, H]

    def construct(self, x):
        weights, experts = route(self.moe.router(x), self.moe.top_k, self.moe.renormalize)  # [T, k]
        dense = ops.zeros((x.shape[0], self.moe.num_experts), ms.float32)
        dense = ops.tensor_scatter_elements(dense, experts, weights, 1)  # [T, E], zero off the top-k
        y = ops.matmul(self.act(ops.matmul(x, self.gate_up_t)), self.down_t)  # [E, T, 2I] -> [E, T, I] -> [E, T, H]
        return (y * dense.T.reshape(self.moe.num_experts, -1, 1)).sum(0)  # [T, H]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 128, 512])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    hidden, inter = preset(args.preset)
    e, k = args.experts, args.top_k
    moe = PackedMoE(hidden, inter, e, k, backend="cpu")
    dense_all = DenseAllExperts(moe)
    mlp = PackedSwiGLUMLP(hidden, inter, backend="cpu")
    mlp.gate_up_proj.weight.set_data(moe.experts[0].gate_up_proj.weight.value())
    mlp.down_proj.weight.set_data(moe.experts[0].down_proj.weight.value())
    for net in (moe, dense_all, mlp):
        net.set_inputs(ms.Tensor(shape=[None, hidden], dtype=ms.float32))
    print(f"{args.preset}: H={hidden} I={inter}, E={e}, top-k={k}, float32, {args.rounds} interleaved rounds")
    head = (f"{'T':>5} | {'moe ms':>15} {'dense-all ms':>15} {'mlp ms':>15} | {'moe GFLOP':>9} {'all GFLOP':>9} | "
            f"{'moe/(k*mlp)':>11} {'all/moe':>7} {'goal <=1.5':>10}")
    print(head + "\n" + "-" * len(head))
    results = []
    for tokens in args.tokens:
        x = ms.Tensor(np.random.default_rng(tokens).standard_normal((tokens, hidden)).astype(np.float32))
        np.testing.assert_allclose(moe(x).asnumpy(), dense_all(x).asnumpy(), rtol=1e-4, atol=1e-4)
        stats = interleave({"moe": lambda: moe(x), "dense-all": lambda: dense_all(x), "mlp": lambda: mlp(x)},
                           args.rounds)
        router = 2 * hidden * e * tokens
        flops = {"moe": 6 * hidden * inter * tokens * k + router, "dense-all": 6 * hidden * inter * tokens * e + router,
                 "mlp": 6 * hidden * inter * tokens}
        ratio = stats["moe"]["median_s"] / (k * stats["mlp"]["median_s"])
        ratio_min = stats["moe"]["min_s"] / (k * stats["mlp"]["min_s"])
        results.append({"tokens": tokens, "stats": stats, "flops": flops, "moe_over_k_mlp_median": ratio,
                        "moe_over_k_mlp_min": ratio_min,
                        "dense_all_over_moe": stats["dense-all"]["median_s"] / stats["moe"]["median_s"]})

        def ms_(name):
            return f"{stats[name]['min_s'] * 1e3:6.1f}/{stats[name]['median_s'] * 1e3:7.1f}"

        print(f"{tokens:5d} | {ms_('moe'):>15} {ms_('dense-all'):>15} {ms_('mlp'):>15} | "
              f"{flops['moe'] / 1e9:9.2f} {flops['dense-all'] / 1e9:9.2f} | {ratio:11.2f} "
              f"{results[-1]['dense_all_over_moe']:7.2f} {'met' if ratio <= 1.5 else 'MISSED':>10}", flush=True)
    print("times: min/median ms; ratios at the median")
    if args.json:
        write_json(args.json, {"preset": args.preset, "experts": e, "top_k": k, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
