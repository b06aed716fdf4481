"""Exported kits of every kind against simulated devices (tests/device_sim.py), through the kit's own checker
(verify_on_device.verify with a runner standing for the device): a correct device passes every kit, each fault that
applies to a kit fails it (exit 1), and so does a 1% gain on any one branch, in stacks whose MLP branches are each
under 1% of their output too. Then edits of a kit: manifest.json alone never yields exit 0; a MindIR of another
layer (hashes updated) exits 1."""
import hashlib
import json
import os
import shutil

import numpy as np
import pytest

import device_sim as ds
from conftest import cli_batch
from kit_cases import KITS
from ms_swiglu.export.verify_on_device import verify

@pytest.fixture(scope="module")
def kits(kits_started):
    """{kit: (folder, manifest, the exported network's description for device_sim)} of every KITS entry
    (exported in the background from the session's start: conftest.kits_started)."""
    from ms_swiglu.export import exporter

    root, batch = kits_started
    runs = batch.wait(timeout=1200)
    out = {}
    for (name, (ck, opts)), r in zip(KITS.items(), runs):
        assert r.returncode == 0, (name, r.stderr[-3000:])
        manifest = json.loads((root / name / "manifest.json").read_text())
        layers = manifest["source"]["layers"]
        req = exporter.ExportRequest(output_dir="", target="portable", checkpoint=str(root / ck),
                                     layers=tuple(layers), stack="--layers" in opts, dtype=manifest["dtype"],
                                     quant=manifest["weights"]["quant"])
        net = exporter._build(req, "composite")[0]
        out[name] = (root / name, manifest, ds.describe(net))
    return out


def _device(spec, fault=None):
    """A runner for verify(): the simulated device on a case's input, every graph output in the input's shape."""
    def run(x, tokens=None):  # noqa: ARG001
        outs, _ = ds.device(spec, x.reshape(-1, x.shape[-1]), fault, outputs=True)
        return [o.reshape(x.shape) for o in outs]
    return run


def _verify(folder, runner):
    lines = []
    return verify(str(folder), "CPU", calls=0, out=lines.append, runner=runner), lines


@pytest.mark.parametrize("name", list(KITS))
def test_a_correct_device_passes_and_every_fault_fails_each_kit(kits, name):
    folder, manifest, spec = kits[name]
    status, lines = _verify(folder, _device(spec))
    assert status == 0, lines
    faults = ds.faults_for(spec) + [f"gain@{i}" for i in range(ds.branches(spec))]
    for fault in faults:
        status, lines = _verify(folder, _device(spec, fault))
        assert status == 1 and any(": FAIL:" in line for line in lines), (name, fault, lines)


def test_the_matrix_holds_every_fault_and_kind(kits):
    """Every fault of device_sim applies to some kit; the kinds: dense in every dtype and int8 format, each MoE
    family, stacks (one whose branches are each under 1% of its output)."""
    seen = {f for _, _, spec in kits.values() for f in ds.faults_for(spec)} | {"gain"}
    assert seen >= set(ds.FAULTS) - {"down_transposed"}, sorted(set(ds.FAULTS) - seen)
    # the fixtures' norm weights (N(0, 0.1^2)) make each MLP branch of a stack under 1% of the stack's output
    # (smaller still, the MLP inputs are so small that SiLU is linear there and gate/up swapped changes less than a
    # rounding: no numeric check could see it)
    for name in ("stack-bfloat16", "stack-deepseek_v3"):
        fractions = [b["rms_fraction"][1] for b in kits[name][1]["outputs"][0]["branches"]]
        assert max(fractions) <= 0.01, (name, fractions)


def test_every_branch_has_a_detection_floor_under_one_percent_on_the_multi_token_case(kits):
    """The manifest's floor (the gain error that fails with probability >= 97.7%) of each branch: under 1% on the
    16-token case, for every output of every kit (a stack's blocks seen through their own outputs)."""
    for name, (_, manifest, _) in kits.items():
        for output in manifest["outputs"]:
            for branch in output["branches"]:
                if output["name"] == "output" and len(manifest["outputs"]) > 1:
                    continue  # a stack's output: its blocks are checked through their own outputs below it
                assert branch["floor"][1] < 0.01, (name, output["name"], branch)


def _copy(kits, name, tmp_path):
    folder = tmp_path / f"{name}-{len(os.listdir(tmp_path))}"
    shutil.copytree(kits[name][0], folder)
    return folder, json.loads((folder / "manifest.json").read_text())


def _write(folder, manifest):
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_editing_the_manifest_alone_never_passes(kits, tmp_path):
    """Thresholds raised, a case removed, every token left out, a file's entry dropped and the file edited: exit 2
    (the kit is not one export's), never 0, against a device that is wrong by 2% (which fails the kit as it is)."""
    name = "mixtral-bfloat16"
    wrong = _device(kits[name][2], "gain@0")
    assert _verify(kits[name][0], wrong)[0] == 1

    def raise_thresholds(m):
        for o in m["outputs"]:
            o["acceptance"].update(mean_max=1e9, max_max=1e9, gain_z=1e9, sigma=1e9)

    def drop_case(m):
        m["golden"] = m["golden"][:1]

    def leave_every_token_out(m):
        for case in m["golden"]:
            case["excluded_tokens"] = list(range(case["tokens"]))

    def no_cases(m):
        m["golden"] = []

    edits = [raise_thresholds, drop_case, leave_every_token_out, no_cases]
    for edit in edits:
        folder, m = _copy(kits, name, tmp_path)
        edit(m)
        _write(folder, m)
        status, lines = _verify(folder, wrong)
        assert status == 2 and "not whole" in lines[-1], (edit.__name__, lines)
    folder, m = _copy(kits, name, tmp_path)
    victim = m["golden"][1]["outputs"][0]["npy"]
    del m["files"][victim]
    _write(folder, m)
    y = np.load(folder / victim)
    np.save(folder / victim, y * 1.02)  # the golden made to match the wrong device
    status, lines = _verify(folder, wrong)
    assert status == 2 and victim in lines[-1], lines


def test_a_mindir_of_another_layer_fails_on_the_numbers(kits, tmp_path):
    """The MindIR of layer 1 put in the kit of layer 0 (same shapes; its sha256 updated in manifest.json): the
    kit's real checker runs it on the CPU and fails it (exit 1), not on the files."""
    import subprocess
    import sys

    folder, m = _copy(kits, "dense-float16", tmp_path)
    other = tmp_path / "other"
    r = cli_batch([["export", "--checkpoint", kits["dense-float16"][0].parent / "dense", "--layer", 1, "--target",
                    "portable", "--dtype", "float16", "--output-dir", other]])[0]
    assert r.returncode == 0, r.stderr
    shutil.copyfile(other / m["model_file"].replace("mlp0", "mlp1"), folder / m["model_file"])
    m["files"][m["model_file"]] = _sha(folder / m["model_file"])
    _write(folder, m)
    v = subprocess.run([sys.executable, folder / "verify_on_device.py", "--device", "CPU", "--calls", "0"],
                       capture_output=True, text=True, timeout=600)
    assert v.returncode == 1 and ": FAIL:" in v.stdout, v.stdout + v.stderr[-2000:]
