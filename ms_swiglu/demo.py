"""The main job, end to end on the CPU: a LLaMA-7B-shaped packed MLP (H=4096, I=11008) with seeded
random weights, run in GRAPH_MODE for 1 and 512 tokens, checked against the unpacked three-Dense baseline
with the same weights, with the latencies of both; then exported as bfloat16 MindIR for Ascend (builtin
Swiglu, op types verified) and as its portable twin (reloaded in a fresh process and checked on the golden
inputs). The export folder (default out/demo) belongs to the demo and is replaced on each run.

Usage: python -m ms_swiglu.demo [--preset llama-7b] [--tokens 1 512] [--backend auto] [--repeat 7]
                                [--export-dir out/demo | --no-export]
"""
import argparse
import os
import statistics
import sys
import time

import mindspore as ms
import numpy as np

from ms_swiglu import BACKENDS, SwiGLUMLP, preset, to_packed
from ms_swiglu.config import PRESETS, TOLERANCE

ATOL, RTOL = TOLERANCE["float32"]


def _latency_ms(nets, x, repeat):
    """(min, median) ms of each net, calls interleaved so that drifts of the machine hit all alike."""
    times = [[] for _ in nets]
    for net in nets:
        net(x)  # warm-up (the first call of a shape also compiles)
    for _ in range(repeat):
        for net, t in zip(nets, times):
            t0 = time.perf_counter()
            net(x)
            t.append((time.perf_counter() - t0) * 1e3)
    return [(min(t), statistics.median(t)) for t in times]


def main(argv=None):
    parser = argparse.ArgumentParser(description="Run a 7B-shaped packed SwiGLU MLP against the baseline.")
    parser.add_argument("--preset", default="llama-7b", choices=sorted(PRESETS))
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 512])
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--export-dir", default=os.path.join("out", "demo"))
    parser.add_argument("--no-export", action="store_true")
    args = parser.parse_args(argv)

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    hidden, inter = preset(args.preset)
    ms.set_seed(0)
    baseline = SwiGLUMLP(hidden, inter)
    packed = to_packed(baseline, backend=args.backend)
    for net in (baseline, packed):
        net.set_inputs(ms.Tensor(shape=[None, hidden], dtype=ms.float32))  # dynamic tokens: one compile
    print(f"{args.preset}: H={hidden} I={inter}, backend {packed.backend.name}, float32, GRAPH_MODE on CPU")
    print(f"gate_up_proj {tuple(packed.gate_up_proj.weight.shape)}, down_proj {tuple(packed.down_proj.weight.shape)}")

    rng = np.random.default_rng(0)
    ok = True
    for tokens in args.tokens:
        x = ms.Tensor(rng.standard_normal((tokens, hidden)).astype(np.float32))
        got, want = packed(x).asnumpy(), baseline(x).asnumpy()
        err = np.abs(got - want)
        close = bool(np.all(err <= ATOL + RTOL * np.abs(want)))
        ok &= close
        (p_min, p_med), (b_min, b_med) = _latency_ms([packed, baseline], x, args.repeat)
        print(f"tokens={tokens:4d}  max|packed-baseline|={err.max():.2e} ({'ok' if close else 'MISMATCH'})  "
              f"packed {p_med:8.2f} ms (min {p_min:.2f})  baseline {b_med:8.2f} ms (min {b_min:.2f})  "
              f"speed-up {b_med / p_med:.2f}x")
    print("packed MLP matches the baseline" if ok else "packed MLP does NOT match the baseline")
    if ok and not args.no_export:
        ok = _export(args.preset, args.export_dir)
    return 0 if ok else 1


def _export(preset_name, folder):
    from ms_swiglu.export.exporter import ExportRequest, export  # noqa: PLC0415

    os.makedirs(folder, exist_ok=True)
    for target in ("ascend", "portable"):
        t0 = time.perf_counter()
        m = export(ExportRequest(output_dir=os.path.join(folder, target), target=target, preset=preset_name,
                                 dtype="bfloat16", force=True))
        cases = m["verification"].get("reloaded") or [f"case {c['case']}: {'pass' if c['ok'] else 'FAIL'}: mean e "
                                                        f"{c['mean']:.1e}" for c in m["verification"]["cpu_twin"]]
        print(f"exported {os.path.join(folder, target, m['model_file'])} in {time.perf_counter() - t0:.1f} s: "
              f"ops {', '.join(o for o in m['op_types'] if o in ('MatMul', 'Swiglu', 'Split', 'SiLU', 'Mul'))}; "
              f"golden outputs against the {m['checked']['golden']}: "
              f"{'; '.join(c.split(', max e')[0] for c in cases)}")
    return True  # an export whose check fails raises


if __name__ == "__main__":
    sys.exit(main())
