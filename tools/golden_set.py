"""A behaviour snapshot for refactors: outputs of every block kind, backend, dtype, quantization and tensor-parallel
rank split (on every instruction set the CPU kernels can be forced to), the op types and manifest fields of
exports, and the CLI's error lines for bad input. Record before a change, compare after: every output must be
bit-identical and every op list, field and line the same.

    python -m ms_swiglu.tools.golden_set record DIR      (DIR/golden.npz, DIR/golden.json)
    python -m ms_swiglu.tools.golden_set compare DIR     (exit 1 and one line per difference)
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

H, I, E, K = 128, 256, 8, 2  # multiples of 128: int8-g128 on every rank split
FAMILIES = {  # PackedMoE keyword arguments of each family's block (mixtral's is qwen3_moe's)
    "mixtral": {},
    "qwen2_moe": {"renormalize": False, "shared_intermediate_size": 256, "shared_expert_gate": True},
    "deepseek_v3": {"scoring": "sigmoid", "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
                    "shared_intermediate_size": 256},
}
BAD_INPUT = [  # argv -> the one error line
    ["run", "--checkpoint", "/nonexistent", "--layer", "0"],
    ["run", "--checkpoint", "CKPT", "--layer", "9"],
    ["run", "--checkpoint", "CKPT", "--layer", "0", "--tokens", "0"],
    ["run", "--checkpoint", "CKPT", "--layer", "0", "--quantize", "int4"],
    ["convert", "--checkpoint", "CKPT", "--output", "OUT/c.safetensors", "--tp-size", "5"],
    ["convert", "--checkpoint", "CKPT", "--output", "OUT/c.safetensors", "--layers", "2-1"],
    ["export", "--preset", "tiny", "--output-dir", "OUT/e", "--static-shape", "0,1"],
    ["export", "--preset", "tiny", "--output-dir", "OUT/e", "--quantize", "int8"],
    ["export", "--checkpoint", "CKPT", "--output-dir", "OUT/e"],
]


def _blocks():
    """(name, Cell, dtype name) of every block kind x backend x dtype x quantization x tp rank split."""
    import mindspore as ms  # noqa: PLC0415

    from ms_swiglu.mlp import PackedSwiGLUMLP, load_weights  # noqa: PLC0415
    from ms_swiglu.moe import PackedMoE  # noqa: PLC0415
    from ms_swiglu.errors import InputError  # noqa: PLC0415
    from ms_swiglu.quant import quantize_state_dict  # noqa: PLC0415

    out = []
    for kind in ("dense", *FAMILIES):
        for backend in ("cpu", "composite"):
            for dtype in ("float32", "float16", "bfloat16"):
                for quant in (None, "int8", "int8-g128"):
                    for tp in (1, 2):
                        kw = dict(dtype=getattr(ms, dtype), backend=backend, quant=quant, tp_size=tp)
                        try:
                            cell = (PackedSwiGLUMLP(H, I, **kw) if kind == "dense" else
                                    PackedMoE(H, I, E, K, **kw, **FAMILIES[kind]))
                        except InputError:  # a combination the package refuses (int8-g128 needs whole groups)
                            continue
                        if tp > 1:
                            cell.reduce = ms.nn.Identity()  # rank 0's part, in one process
                        rng = np.random.default_rng(len(out))
                        state = {n: (rng.standard_normal(p.shape) / np.sqrt(p.shape[-1])).astype(np.float32)
                                 for n, p in cell.parameters_and_names() if not n.endswith("_scale")}
                        load_weights(cell, quantize_state_dict(state, quant) if quant else state)
                        out.append((f"{kind}/{backend}/{dtype}/{quant or 'float'}/tp{tp}", cell, dtype))
    return out


def outputs():
    """{name: output array} of every block on every instruction set the kernels can be forced to."""
    import mindspore as ms  # noqa: PLC0415

    from ms_swiglu.backends.cpu import kernels  # noqa: PLC0415

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    x = np.random.default_rng(7).standard_normal((2, 5, H)).astype(np.float32)
    found, best = {}, kernels.isa()
    blocks = _blocks()
    try:
        for isa in kernels.isas():
            kernels.set_isa(isa)
            for name, cell, dtype in blocks:
                if isa != best and not name.split("/")[1] == "cpu":
                    continue  # the instruction set moves only the cpu kernels
                y = cell(ms.Tensor(x).astype(getattr(ms, dtype)))
                found[f"{isa}/{name}"] = y.astype(ms.float32).asnumpy()  # bf16/fp16 widen exactly
    finally:
        kernels.set_isa(best)
    return found


def _cli(argv, cwd):
    exe = os.path.join(os.path.dirname(sys.executable), "ms-swiglu")
    r = subprocess.run([exe, *argv], capture_output=True, text=True, timeout=600, cwd=cwd)
    return r.returncode, [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("[")]


def facts():
    """Export op types and manifest fields per target (dense, MoE, int8), and the CLI's bad-input lines."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    from hf_checkpoint import make_checkpoint  # noqa: PLC0415

    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "ck")
        make_checkpoint(ckpt, layers=2, seed=3)
        moe = os.path.join(tmp, "moe")
        make_checkpoint(moe, model_type="qwen2_moe", hidden=32, inter=40, moe_inter=24, experts=8, top_k=2, layers=1,
                        shared_inter=32, seed=12, dtype="bfloat16",
                        config_extra={"norm_topk_prob": False, "shared_expert_intermediate_size": 32})
        exports = [("dense", ["--checkpoint", ckpt, "--layer", "1"]), ("moe", ["--checkpoint", moe, "--layer", "0"]),
                   ("int8", ["--preset", "tiny", "--quantize", "int8", "--dtype", "bfloat16"])]
        for what, args in exports:
            for target in ("ascend", "portable", "cpu"):
                out = os.path.join(tmp, f"{what}-{target}")
                status, lines = _cli(["export", *args, "--target", target, "--output-dir", out], tmp)
                key = f"export/{what}/{target}"
                if status:
                    found[key] = {"status": status, "stderr": lines}
                    continue
                with open(os.path.join(out, "manifest.json")) as f:
                    m = json.load(f)
                found[key] = {k: m.get(k) for k in ("op_types", "inputs", "outputs", "dtype", "weights", "branches",
                                                    "runtime_paths", "checked", "deployable", "name", "golden")}
        for argv in BAD_INPUT:
            argv = [a.replace("CKPT", ckpt).replace("OUT", tmp) for a in argv]
            status, lines = _cli(argv, tmp)
            found["cli/" + " ".join(argv).replace(tmp, "T")] = {"status": status,
                                                                 "stderr": [s.replace(tmp, "T") for s in lines]}
    return found


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("record", "compare"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, folder = argv
    arrays, info = outputs(), facts()
    if mode == "record":
        os.makedirs(folder, exist_ok=True)
        np.savez(os.path.join(folder, "golden.npz"), **arrays)
        with open(os.path.join(folder, "golden.json"), "w") as f:
            json.dump(info, f, indent=1, sort_keys=True)
        print(f"recorded {len(arrays)} outputs and {len(info)} facts in {folder}")
        return 0
    old = np.load(os.path.join(folder, "golden.npz"))
    with open(os.path.join(folder, "golden.json")) as f:
        old_info = json.load(f)
    bad = [f"output {k}: missing" for k in old.files if k not in arrays]
    bad += [f"output {k}: differs (max {np.max(np.abs(arrays[k] - old[k])):.3e})" for k in old.files
            if k in arrays and not np.array_equal(arrays[k], old[k], equal_nan=True)]
    bad += [f"output {k}: new" for k in arrays if k not in old.files]
    info = json.loads(json.dumps(info, sort_keys=True))
    bad += [f"fact {k}: {old_info.get(k)!r} -> {info.get(k)!r}" for k in sorted(set(old_info) | set(info))
            if old_info.get(k) != info.get(k)]
    for line in bad:
        print(line)
    print(f"compared {len(old.files)} outputs and {len(old_info)} facts: {len(bad)} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
