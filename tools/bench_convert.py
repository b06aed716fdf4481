"""Memory of ``convert`` on FP8 checkpoints: does the peak depend on the number of experts?

Writes synthetic DeepSeek-V3-shaped FP8 checkpoints (e4m3 weights, float32 block scales of 128 x 128, one dense
layer then MoE layers with a shared expert) with E and 2E routed experts, and converts each in a fresh process
(to bfloat16, and requantized to int8), reporting the process's peak resident memory against the float32 bytes of
one expert and of the whole checkpoint. Streaming holds a few experts' float32 weights, whatever E.

Usage: python -m ms_swiglu.tools.bench_convert [--hidden 1024] [--inter 512] [--experts 32] [--layers 4]
                                               [--json F]
"""
import argparse
import datetime
import json
import os
import sys
import tempfile
import time

import numpy as np

from ms_swiglu.tools.timing import probe_process, proc_status, write_json

BLOCK = 128


def write_fp8_checkpoint(folder, hidden, inter, experts, layers, seed=0):
    """A DeepSeek-V3-shaped FP8 checkpoint (layer 0 dense, the others MoE); returns its bytes on disk."""
    from safetensors import TensorSpec, serialize_file  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    codes = np.concatenate([np.arange(0x00, 0x7F), np.arange(0x80, 0xFF)]).astype(np.uint8)  # no NaN
    weight_map, total = {}, 0
    for layer in range(layers):
        p = f"model.layers.{layer}.mlp."
        shapes = {}
        if layer == 0:
            shapes.update({p + "gate_proj.weight": (4 * inter, hidden), p + "up_proj.weight": (4 * inter, hidden),
                           p + "down_proj.weight": (hidden, 4 * inter)})
        else:
            for e in range(experts):
                q = f"{p}experts.{e}."
                shapes.update({q + "gate_proj.weight": (inter, hidden), q + "up_proj.weight": (inter, hidden),
                               q + "down_proj.weight": (hidden, inter)})
            shapes.update({p + "shared_experts.gate_proj.weight": (inter, hidden),
                           p + "shared_experts.up_proj.weight": (inter, hidden),
                           p + "shared_experts.down_proj.weight": (hidden, inter)})
        arrays = {}
        for name, shape in shapes.items():
            arrays[name] = ("float8_e4m3fn", rng.choice(codes, shape))
            scale = (rng.random((-(-shape[0] // BLOCK), -(-shape[1] // BLOCK))) * 1e-3 + 1e-4).astype(np.float32)
            arrays[name + "_scale_inv"] = ("float32", scale)
        if layer:
            arrays[p + "gate.weight"] = ("float32", rng.standard_normal((experts, hidden)).astype(np.float32))
            arrays[p + "gate.e_score_correction_bias"] = ("float32", np.zeros(experts, np.float32))
        shard = f"model-{layer:05d}.safetensors"
        serialize_file({n: TensorSpec(dtype=d, shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
                        for n, (d, a) in arrays.items()}, os.path.join(folder, shard))
        weight_map.update(dict.fromkeys(arrays, shard))
        total += sum(a.nbytes for _, a in arrays.values())
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    config = {"model_type": "deepseek_v3", "hidden_size": hidden, "intermediate_size": 4 * inter,
              "moe_intermediate_size": inter, "num_hidden_layers": layers, "n_routed_experts": experts,
              "num_experts_per_tok": 8, "n_shared_experts": 1, "n_group": 8, "topk_group": 4,
              "first_k_dense_replace": 1, "torch_dtype": "bfloat16",
              "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [BLOCK, BLOCK]}}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return total


def probe(folder, output, quant):
    """In a fresh process: convert, then 'seconds,peak resident bytes'."""
    from ms_swiglu.checkpoint.converted import convert  # noqa: PLC0415

    t0 = time.perf_counter()
    convert(folder, output, quant=quant or None, force=True)
    return f"{time.perf_counter() - t0},{proc_status('VmHWM')}"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--probe":
        print(probe(*argv[1:]))
        return 0
    p = argparse.ArgumentParser(prog="ms_swiglu.tools.bench_convert", description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--inter", type=int, default=512)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--json")
    args = p.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    expert_f32 = 3 * args.hidden * args.inter * 4
    results = []
    with tempfile.TemporaryDirectory() as root:
        for experts in (args.experts, 2 * args.experts):
            folder = os.path.join(root, f"e{experts}")
            disk = write_fp8_checkpoint(folder, args.hidden, args.inter, experts, args.layers)
            for quant in ("", "int8"):
                out = os.path.join(root, f"e{experts}{quant}.safetensors")
                seconds, peak = map(float, probe_process("ms_swiglu.tools.bench_convert", [folder, out, quant],
                                                         f"convert E={experts}", timeout=3600).split(","))
                row = {"experts": experts, "layers": args.layers, "quant": quant or "bfloat16",
                       "checkpoint_bytes": disk, "float32_bytes": disk * 4, "expert_float32_bytes": expert_f32,
                       "output_bytes": os.path.getsize(out), "seconds": seconds, "peak_resident_bytes": peak}
                results.append(row)
                print(f"E={experts:4d} {row['quant']:>8}: peak {peak / 2**20:7.1f} MiB, {seconds:6.1f} s; checkpoint "
                      f"{disk / 2**20:.0f} MiB (float32 {disk * 4 / 2**20:.0f} MiB), one expert in float32 "
                      f"{expert_f32 / 2**20:.1f} MiB", flush=True)
                os.remove(out)
    if args.json:
        options = {k: v for k, v in vars(args).items() if k != "json"}
        write_json(args.json, {"tool": "bench_convert", "date": started, "args": options, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
