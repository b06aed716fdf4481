"""Do the cpu kernels' threads slow the MindSpore ops that run right after them?

Times a MindSpore-only Cell (an RMSNorm and a MatMul of the hidden size, as the attention block that follows an
FFN would run) in two ways, interleaved over many rounds: right after a call of the cpu MLP (`after`), and right
after the same MLP on the composite backend, MindSpore's own ops over the same weights (`alone`: the same caches
left behind, no thread of the package's). Worker threads that keep spinning after a kernel take a core from the
MindSpore op that follows; `after / alone` says by how much.

Usage: python -m ms_swiglu.tools.bench_neighbour [--preset small] [--tokens 1 128] [--rounds 200]
"""
import argparse
import statistics
import sys
import time

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from ms_swiglu import PackedSwiGLUMLP, RMSNorm
from ms_swiglu.config import PRESETS


class Neighbour(nn.Cell):
    """RMSNorm, then x W^T with W [H, H]: MindSpore's own kernels only."""

    def __init__(self, hidden):
        super().__init__()
        self.norm = RMSNorm(hidden)
        self.w = ms.Parameter(ms.Tensor(np.random.default_rng(0).standard_normal((hidden, hidden)).astype(np.float32)))
        self.mm = ops.MatMul(transpose_b=True)

    def construct(self, x):
        return self.mm(self.norm(x), self.w)


def measure(preset, tokens, rounds):
    hidden, inter = PRESETS[preset]
    mlp, neighbour = PackedSwiGLUMLP(hidden, inter, backend="cpu"), Neighbour(hidden)
    filler = PackedSwiGLUMLP(hidden, inter, backend="composite")
    filler.gate_up_proj.weight.set_data(mlp.gate_up_proj.weight.value())
    filler.down_proj.weight.set_data(mlp.down_proj.weight.value())
    x = ms.Tensor(np.random.default_rng(1).standard_normal((tokens, hidden)).astype(np.float32))
    for _ in range(3):
        mlp(x).asnumpy(), neighbour(x).asnumpy(), filler(x).asnumpy()
    times = {"after": [], "alone": []}
    for _ in range(rounds):
        for kind, before in (("after", mlp), ("alone", filler)):
            before(x).asnumpy()  # synchronised: the next op starts right after it
            t0 = time.perf_counter()
            neighbour(x).asnumpy()
            times[kind].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    low = {k: min(v) for k, v in times.items()}
    return {"preset": preset, "tokens": tokens, "median_ms": {k: v * 1e3 for k, v in med.items()},
            "min_ms": {k: v * 1e3 for k, v in low.items()}, "after_over_alone": med["after"] / med["alone"],
            "after_over_alone_min": low["after"] / low["alone"]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 128])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args(argv)
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    for n in args.tokens:
        r = measure(args.preset, n, args.rounds)
        print(f"{args.preset} N={n}: MindSpore op after the cpu MLP {r['median_ms']['after']:.3f} ms, alone "
              f"{r['median_ms']['alone']:.3f} ms (median of {args.rounds}); after/alone {r['after_over_alone']:.2f} "
              f"(min {r['after_over_alone_min']:.2f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
