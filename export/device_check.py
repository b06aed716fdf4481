"""``ms-swiglu export --device-check DIR``: one folder of kits that a person with an Atlas A2 (910B) or A3 NPU runs
with one command, and the script that runs them.

    DIR/dense-bfloat16/        the dense MLP, bfloat16, dynamic batch and sequence (Swiglu)
    DIR/dense-int8-g128/       the same MLP with int8 weights, a scale per 128 inputs, bfloat16 activations
    DIR/moe-bfloat16/          a DeepSeek-V3-style MoE layer, bfloat16 (MoeInitRoutingV2, GroupedMatmulV4, ...)
    DIR/moe-ge-bfloat16-2x8/   the same MoE layer through GE's sparse MoE ops, at a static [2, 8, H] input
    DIR/dense-float32/         the dense MLP in float32
    DIR/run_device_check.py    this file: runs every kit's verify_on_device.py, one line per kit
    DIR/README.txt             what to run and what to send back
    DIR/manifest.json          the kits and their ids (sha256 of each kit's manifest.json), sha256 of every file

Every kit is an ordinary export (``export.exporter.export``) of one layer of a synthetic DeepSeek-V3-style
checkpoint written to a temporary folder and removed after: layer 0 dense (as DeepSeek-V3's first three are),
layer 1 MoE with a shared expert, seeded random weights in bfloat16. The set is one ``ms_swiglu.outputs.FolderSet``: the
kits are exported into its staging folder and put in place together, ``manifest.json`` last.

As ``run_device_check.py`` it needs Python alone (each kit's ``verify_on_device.py`` needs MindSpore and NumPy):

    python run_device_check.py [--device-id N] [--device Ascend|CPU]

It runs each kit's ``verify_on_device.py`` in turn (``--device Ascend``; ``--device CPU`` only to try the runner
off the device, where every kit of this set exits 3: their ops have no CPU kernel), keeps each one's whole output
in ``device-check-results/<kit>.log``, and prints one line per kit: its name, the ``kit <id>`` line, the verdict
its exit status gives (0 pass, 1 numeric failure, 2 not whole, 3 cannot run) and the measured/predicted time
ratios. Then what to send back. Its exit status: 0 when every kit passes, 1 otherwise, 2 for bad arguments or a
folder that is not a whole device check.
"""
import argparse
import dataclasses
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

KIND = "ms-swiglu device check"
SCRIPT = "run_device_check.py"
RESULTS = "device-check-results"
# llama-7b: a 7B model's MLP, large enough that the measured/predicted time ratio speaks of the runtime (a tiny
# layer's time is launch overhead), with sizes of whole int8-g128 groups; its set takes ~2 minutes on two cores.
DEFAULT_PRESET = "llama-7b"
GROUP = 128  # int8-g128's scale group: the dense sizes are rounded up to whole groups (tiny, small)
# The MoE layer: DeepSeek-V3's routing (sigmoid scores, correction bias, group-limited top-k, a shared expert) with
# 16 experts, not 256, so that each MoE kit exports in under a minute at llama-7b's hidden size; an expert is a
# quarter of the hidden size, about DeepSeek-V3's ratio (2048 of 7168).
EXPERTS, TOP_K, N_GROUP, TOPK_GROUP, SHARED = 16, 4, 4, 2, 1
GE_SHAPE = (2, 8)  # GE fixes MoeInitRouting's token count when it compiles: a static [B, S, H] input
KIT_TIMEOUT = 1800  # seconds for one kit on the device; the first call compiles


@dataclasses.dataclass(frozen=True)
class Kit:
    """One kit of the set: its folder name, what it exercises, and the export that makes it."""

    name: str
    what: str
    layer: int  # of the synthetic checkpoint: 0 dense, 1 MoE
    dtype: str
    target: str = "ascend"
    quant: str = None
    static_shape: tuple = None


KITS = (
    Kit("dense-bfloat16", "dense MLP, bfloat16, dynamic shape: MatMul, Swiglu", 0, "bfloat16"),
    Kit("dense-int8-g128", "dense MLP, int8 weights (a scale per 128 inputs), bfloat16: WeightQuantBatchMatmul",
        0, "bfloat16", quant="int8-g128"),
    Kit("moe-bfloat16", "DeepSeek-V3-style MoE layer, bfloat16: MoeInitRoutingV2, GroupedMatmulV4, "
        "MoeTokenUnpermute", 1, "bfloat16"),
    Kit(f"moe-ge-bfloat16-{GE_SHAPE[0]}x{GE_SHAPE[1]}", f"the same MoE layer through GE's sparse MoE ops "
        f"(MoeInitRouting, GroupedMatmul, MoeFinalizeRouting), static input [{GE_SHAPE[0]}, {GE_SHAPE[1]}, H]",
        1, "bfloat16", target="ge", static_shape=GE_SHAPE),
    Kit("dense-float32", "dense MLP, float32: MatMul, Swiglu", 0, "float32"),
)
OTHER = (SCRIPT, "README.txt", "manifest.json")  # the set's files beside the kits' folders

# verify_on_device.py's exit status -> the verdict (docs/ascend.md, "Device check")
VERDICTS = {0: "pass", 1: "NUMERIC FAILURE", 2: "NOT WHOLE", 3: "CANNOT RUN"}


def _round_up(n, group=GROUP):
    return -(-n // group) * group


def model_shape(preset):
    """The synthetic checkpoint's sizes for the dense shape of ``preset`` (rounded up to whole scale groups)."""
    from ms_swiglu.config import preset as preset_shape  # noqa: PLC0415

    hidden, inter = (_round_up(n) for n in preset_shape(preset))
    return {"hidden_size": hidden, "intermediate_size": inter, "moe_intermediate_size": hidden // 4,
            "n_routed_experts": EXPERTS, "num_experts_per_tok": TOP_K, "n_group": N_GROUP,
            "topk_group": TOPK_GROUP, "n_shared_experts": SHARED}


def peak_bytes(shape):
    """About the most memory writing the set takes: 32 bytes per weight of its larger layer (the layer, its float32
    golden network, its twin and the MindIR's copies; llama-7b's set peaks at 6.5 GB, its MoE layer 214M weights)."""
    h, experts = shape["hidden_size"], shape["n_routed_experts"]
    moe = 3 * h * shape["moe_intermediate_size"]
    return 32 * max(3 * h * shape["intermediate_size"], experts * (moe + h + 1) + shape["n_shared_experts"] * moe)


def write_checkpoint(folder, shape, seed):
    """A HuggingFace checkpoint folder as DeepSeek-V3 publishes it (config.json, model.safetensors, HF names), of
    two layers, 0 dense and 1 MoE, FFN tensors only (an export of one layer reads nothing else): seeded random
    weights in bfloat16 (fan-in scaled), ``e_score_correction_bias`` in float32 as on the Hub."""
    import numpy as np  # noqa: PLC0415

    from ms_swiglu.checkpoint.files import dump_safetensors  # noqa: PLC0415

    h, inter, moe_inter = shape["hidden_size"], shape["intermediate_size"], shape["moe_intermediate_size"]
    experts, shared = shape["n_routed_experts"], shape["n_shared_experts"] * moe_inter
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 2,
              "hidden_act": "silu", "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
              "first_k_dense_replace": 1, "moe_layer_freq": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
              "norm_topk_prob": True, "routed_scaling_factor": 2.5, **shape}
    rng = np.random.default_rng(seed)
    shapes = {"model.layers.0.mlp.gate_proj.weight": (inter, h), "model.layers.0.mlp.up_proj.weight": (inter, h),
              "model.layers.0.mlp.down_proj.weight": (h, inter), "model.layers.1.mlp.gate.weight": (experts, h)}
    for e in range(experts):
        shapes.update({f"model.layers.1.mlp.experts.{e}.{p}_proj.weight": s for p, s in
                       (("gate", (moe_inter, h)), ("up", (moe_inter, h)), ("down", (h, moe_inter)))})
    shapes.update({f"model.layers.1.mlp.shared_experts.{p}_proj.weight": s for p, s in
                   (("gate", (shared, h)), ("up", (shared, h)), ("down", (h, shared)))})
    tensors = {name: rng.standard_normal(s, dtype=np.float32) / np.float32(np.sqrt(s[-1]))
               for name, s in shapes.items()}
    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    tensors[bias] = rng.standard_normal(experts, dtype=np.float32) * np.float32(0.1)
    os.makedirs(folder)
    dump_safetensors(os.path.join(folder, "model.safetensors"), tensors, "bfloat16", {"format": "pt"},
                     float32=(bias,))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return config


def check_earlier(folder, label="--device-check"):
    """Refuse a folder whose manifest.json is not an earlier device check's: --force replaces only such a set."""
    path = os.path.join(folder, "manifest.json")
    if not os.path.lexists(path):
        return
    try:
        with open(path) as f:
            kind = json.load(f).get("kind")
    except (OSError, ValueError, AttributeError):
        kind = None
    if kind != KIND:
        raise _input_error(f"{label}: expected a new folder or an earlier device check's, got {folder} whose "
                           f"manifest.json is another export's; choose another folder")


def _input_error(message):
    from ms_swiglu.errors import InputError  # noqa: PLC0415

    return InputError(message)


def write_set(folder, preset=DEFAULT_PRESET, seed=0, chip="atlas-a2", force=False, progress=None):
    """Export every kit of :data:`KITS` into ``folder`` with the runner, README.txt and manifest.json, all put in
    place together; returns the set's manifest. ``progress(done, total)`` is called as kits are written."""
    from ms_swiglu.export.exporter import ExportRequest, export, write_manifest  # noqa: PLC0415
    from ms_swiglu.export.verify_on_device import kit_id  # noqa: PLC0415
    from ms_swiglu.outputs import FolderSet  # noqa: PLC0415

    folder = os.path.abspath(folder)
    check_earlier(folder)
    shape = model_shape(preset)
    names = [k.name + "/" for k in KITS] + list(OTHER)
    # noun "export": the exporter's lock, so that an export into the same folder meanwhile is refused, not raced
    with FolderSet(folder, names, force, label="--device-check", noun="export", manifest="manifest.json") as out:
        check_earlier(folder)  # again under the lock
        kits = []
        with tempfile.TemporaryDirectory(prefix="ms-swiglu-device-check-") as tmp:
            checkpoint = os.path.join(tmp, "deepseek-v3-synthetic")
            config = write_checkpoint(checkpoint, shape, seed)
            for i, kit in enumerate(KITS):
                if progress:
                    progress(i, len(KITS))
                req = ExportRequest(output_dir=os.path.join(out.stage, kit.name), target=kit.target,
                                    checkpoint=checkpoint, seed=seed, layers=(kit.layer, kit.layer), dtype=kit.dtype,
                                    static_shape=kit.static_shape, chip=chip, quant=kit.quant)
                m = export(req)
                kits.append({"name": kit.name, "folder": kit.name + "/", "what": kit.what,
                             "id": kit_id(os.path.join(out.stage, kit.name)), "model_file": m["model_file"],
                             "target": m["target"], "dtype": m["dtype"], "quant": m["weights"]["quant"],
                             "layer": kit.layer, "input": m["inputs"][0]["shape"], "op_types": m["op_types"]})
            if progress:
                progress(len(KITS), len(KITS))
        shutil.copyfile(os.path.abspath(__file__), os.path.join(out.stage, SCRIPT))
        with open(os.path.join(out.stage, "README.txt"), "w") as f:
            f.write(readme(kits, chip))
        manifest = {"kind": KIND, "version": 1, "chip": chip, "preset": preset, "seed": seed,
                    "checkpoint": {k: config[k] for k in ("model_type", *shape, "first_k_dense_replace",
                                                          "routed_scaling_factor", "torch_dtype")},
                    "kits": kits, "run_command": f"python {SCRIPT} [--device-id N]", "results": RESULTS + "/",
                    "files": {}}
        write_manifest(out.stage, manifest)
        out.commit()
    return manifest


def readme(kits, chip):
    lines = [f"ms-swiglu device check: {len(kits)} kits for {chip} (ms-swiglu export --device-check).", "",
             "On the NPU host (MindSpore 2.10 for Ascend, NumPy), in this folder:", "",
             f"    python {SCRIPT}              # --device-id N: the NPU (default DEVICE_ID or 0)", "",
             "It runs each kit's verify_on_device.py and prints one line per kit:",
             "    pass             exit 0: every golden case within the acceptance criterion",
             "    NUMERIC FAILURE  exit 1: the graph ran, a case is outside the criterion",
             "    NOT WHOLE        exit 2: a file differs from its manifest.json (copy the folder again)",
             "    CANNOT RUN       exit 3: no NPU, a MindIR that does not load or run, or another chip family",
             "", f"Send back: the lines it prints and the folder {RESULTS}/ (each kit's whole output <kit>.log,",
             "what MindSpore left of a failed kit in <kit>-work/, summary.txt, npu-smi.txt).", "", "Kits:"]
    lines += [f"    {k['name']:<24} {k['what']}" for k in kits]
    return "\n".join(lines) + "\n"


# ---- run_device_check.py: Python's standard library only from here on ----------------------------------------

def verdict(status, printed_id, listed_id):
    """The verdict of one kit's run: its exit status's (VERDICTS), NOT WHOLE when the kit id it printed is not the
    set's, else CRASHED for any other status."""
    if printed_id and printed_id != listed_id:
        return f"NOT WHOLE (its kit id is not the set's {listed_id})"
    if status == 0:
        return VERDICTS[0]
    if status in VERDICTS:
        return f"{VERDICTS[status]} (exit {status})"
    if status is None:
        return f"TIMED OUT (after {KIT_TIMEOUT} s)"
    return f"CRASHED (signal {-status})" if status < 0 else f"CRASHED (exit {status})"


def summary_line(name, status, output, listed_id):
    """(the one line of a kit: its name, the verdict, its ``kit <id>`` line, the measured/predicted ratios of its
    time lines and, for a kit that did not pass, the line saying why; whether it passed)."""
    kit = next((line.strip() for line in output.splitlines() if line.startswith("kit ")), None)
    printed = kit.split()[1] if kit and len(kit.split()) > 1 else None
    words = verdict(status, printed, listed_id)
    parts = [f"{name}: {words}", kit or "no kit line"]
    ratios = re.findall(r"measured/predicted ([0-9.eE+-]+(?:\.\.[0-9.eE+-]+)?)", output)
    if ratios:
        parts.append(f"measured/predicted {', '.join(ratios)}")
    ok = words == VERDICTS[0]
    if not ok:
        why = [line.strip() for line in output.splitlines()
               if line.startswith("verify_on_device") or re.search(r"cases pass \(", line)]
        if why:
            parts.append(why[-1])
    return "; ".join(parts), ok


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _capture(args, timeout, cwd=None):
    """(exit status or None on timeout, stdout and stderr interleaved) of a command; (127, why) if it cannot
    start."""
    try:
        proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                              timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        out = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else exc.output or ""
        return None, out
    except OSError as exc:
        return 127, f"{args[0]}: {exc.strerror}\n"
    return proc.returncode, proc.stdout


def run(folder, device="Ascend", device_id=None, out=print):
    """Run every kit of the set in ``folder``; the exit status (0: every kit passes)."""
    try:
        with open(os.path.join(folder, "manifest.json")) as f:
            manifest = json.load(f)
        if manifest.get("kind") != KIND:
            raise ValueError(f"kind {manifest.get('kind')!r}")
        kits = [(k["name"], k["folder"].rstrip("/"), k["id"]) for k in manifest["kits"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"{SCRIPT}: expected the manifest.json of a device check in {folder}, got {type(exc).__name__}: "
              f"{exc}", file=sys.stderr)
        return 2
    results = os.path.join(folder, RESULTS)
    os.makedirs(results, exist_ok=True)
    where = f"{device}" + (f" (device id {device_id})" if device_id is not None else "")
    out(f"checking {len(kits)} kits on {where}; each kit's whole output goes to {RESULTS}/<kit>.log")
    lines, passed = [], 0
    for name, kit, listed in kits:
        args = [sys.executable, os.path.join(folder, kit, "verify_on_device.py"), os.path.join(folder, kit),
                "--device", device] + ([] if device_id is None else ["--device-id", str(device_id)])
        kept = os.path.join(results, f"{name}-work")
        shutil.rmtree(kept, ignore_errors=True)  # an earlier run's
        work = tempfile.mkdtemp(prefix="device-check-")  # MindSpore's compile files and logs go to the cwd
        status = None
        try:
            status, text = _capture(args, KIT_TIMEOUT, cwd=work)
        finally:
            if status != 0 and os.listdir(work):  # what MindSpore left of a failure (analyze_fail.ir, logs)
                shutil.move(work, kept)
            shutil.rmtree(work, ignore_errors=True)
        with open(os.path.join(results, f"{name}.log"), "w") as f:
            f.write(f"$ {' '.join(args)}\n{text}exit status: {status}\n")
        line, ok = summary_line(name, status, text, listed)
        passed += ok
        lines.append(line)
        out(line)
    smi_status, smi = _capture(["npu-smi", "info"], 60)
    with open(os.path.join(results, "npu-smi.txt"), "w") as f:
        f.write(smi if smi_status == 0 else f"npu-smi info: not available (exit {smi_status})\n{smi}")
    _, version = _capture([sys.executable, "-c", "import mindspore; print(mindspore.__version__)"], 300)
    with open(os.path.join(results, "summary.txt"), "w") as f:
        f.write("\n".join(lines + [f"{passed} of {len(kits)} kits pass on {where}",
                                   f"python {platform.python_version()}, {platform.platform()}",
                                   f"mindspore {version.strip().splitlines()[-1] if version.strip() else '?'}",
                                   f"set manifest.json {_sha256(os.path.join(folder, 'manifest.json'))}"]) + "\n")
    off = " (as expected: these graphs' ops have no CPU kernels)" if device != "Ascend" else ""
    out(f"{passed} of {len(kits)} kits pass on {where}{off}")
    out(f"send back: the lines above and the folder {os.path.join(folder, RESULTS)} (each kit's whole output "
        f"<kit>.log, what MindSpore left of a failed kit in <kit>-work/, summary.txt, npu-smi.txt with `npu-smi "
        f"info`), e.g. tar czf {RESULTS}.tgz -C {folder} {RESULTS}")
    return 0 if passed == len(kits) else 1


def main(argv=None):
    p = argparse.ArgumentParser(prog=SCRIPT, description="Runs every kit of this device check on the NPU.")
    p.add_argument("--device-id", type=int, help="the NPU (default MindSpore's: DEVICE_ID or 0)")
    p.add_argument("--device", default="Ascend", choices=("Ascend", "CPU"),
                   help="CPU only to try the runner off the device: every kit then exits 3 (CANNOT RUN)")
    args = p.parse_args(argv)
    if args.device_id is not None and args.device != "Ascend":
        print(f"{SCRIPT}: --device-id: expected it only with --device Ascend, got it with --device {args.device}",
              file=sys.stderr)
        return 2
    try:
        return run(os.path.dirname(os.path.abspath(__file__)), args.device, args.device_id)
    except KeyboardInterrupt:  # (the running kit got the Ctrl-C too)
        print(f"{SCRIPT}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
