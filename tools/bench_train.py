"""Training benchmark of the recompute modes: a stack of FFN blocks, batch 1, one optimizer step per call.

For each sequence length and mode, in a process of its own: the peak resident memory the first training step
adds (VmHWM reset through /proc/self/clear_refs just before it: compile plus the step's activations; MindSpore's
memory pool keeps what a step took, so a second step adds nothing) and the median time of the later steps. Reported against
`none`: memory saved and extra time, as the seed note on activation checkpointing tabulates them.

Modes: none (composite), none-fused (the cpu kernel, which graph-mode recompute cannot re-run), full, selective.

Usage: python -m ms_swiglu.tools.bench_train [--layers 4] [--preset small] [--seqs 1024 2048 4096 8192]
                                             [--steps 2] [--json F]
"""
import argparse
import json
import sys
import time

import numpy as np

from ms_swiglu.config import PRESETS
from ms_swiglu.tools.timing import probe_process, proc_status, reset_peak_memory, write_json

MODES = {"none": ("composite", "none"), "none-fused": ("cpu", "none"), "full": ("composite", "full"),
         "selective": ("composite", "selective")}


def probe(mode, preset, layers, seq, steps):
    """In this (fresh) process: {"peak_added_bytes", "step_s"} of one training step."""
    import mindspore as ms  # noqa: PLC0415
    from mindspore import nn  # noqa: PLC0415

    from ms_swiglu import FFNBlock, FFNStack  # noqa: PLC0415

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    hidden, inter = PRESETS[preset]
    backend, recompute = MODES[mode]
    ms.set_seed(0)
    stack = FFNStack([FFNBlock(hidden, inter, backend=backend, recompute=recompute) for _ in range(layers)])

    class Loss(nn.Cell):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def construct(self, x):
            return (self.net(x) ** 2).mean()

    step = nn.TrainOneStepCell(Loss(stack), nn.SGD(stack.trainable_params(), learning_rate=1e-3))
    x = ms.Tensor(np.random.default_rng(0).standard_normal((1, seq, hidden)).astype(np.float32))
    rss0 = reset_peak_memory()
    step(x).asnumpy()  # compiles, then runs: the pool grows to the step's peak
    peak = proc_status("VmHWM") - rss0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(x).asnumpy()
        times.append(time.perf_counter() - t0)
    return {"peak_added_bytes": peak, "step_s": float(np.median(times))}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--probe":
        mode, preset, layers, seq, steps = argv[1:]
        print(json.dumps(probe(mode, preset, int(layers), int(seq), int(steps))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    hidden, inter = PRESETS[args.preset]
    print(f"{args.layers} FFN blocks, H={hidden} I={inter}, float32, batch 1, SGD step; each cell its own process")
    print(f"{'seq':>5} {'mode':<11} {'step s':>8} {'peak MB':>9} {'mem saved':>9} {'extra time':>10}")
    results = []
    for seq in args.seqs:
        row = {}
        for mode in args.modes:
            row[mode] = json.loads(probe_process("ms_swiglu.tools.bench_train",
                                                 [mode, args.preset, args.layers, seq, args.steps],
                                                 f"{mode} seq={seq}", timeout=3600))
            base = row.get("none")
            saved = 1 - row[mode]["peak_added_bytes"] / base["peak_added_bytes"] if base else float("nan")
            extra = row[mode]["step_s"] / base["step_s"] - 1 if base else float("nan")
            row[mode].update(memory_saved=saved, extra_time=extra)
            print(f"{seq:5d} {mode:<11} {row[mode]['step_s']:8.2f} {row[mode]['peak_added_bytes'] / 2**20:9.0f} "
                  f"{saved:9.0%} {extra:10.0%}", flush=True)
        results.append({"seq": seq, "modes": row})
    if args.json:
        write_json(args.json, {"args": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
