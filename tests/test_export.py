"""`ms-swiglu export`: verified MindIR per target, golden files, manifest, the Ascend kit, no-clobber, atomicity."""
import configparser
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from ms_swiglu.export import graph_io, op_types
from conftest import cli_batch, ref_swiglu
from hf_checkpoint import make_checkpoint

H, I = 32, 48
CLI = [os.path.join(os.path.dirname(sys.executable), "ms-swiglu")]

# MindSpore Lite "Ascend Conversion Tool Description": the sections and keys this kit may use
DOC_KEYS = {
    "ascend_context": {"input_format", "input_shape", "dynamic_dims", "precision_mode", "op_select_impl_mode",
                       "output_type", "fusion_switch_config_file_path", "insert_op_config_file_path"},
    "acl_build_options": {"input_format", "input_shape", "ge.dynamicDims", "ge.dynamicBatchSize",
                          "ge.exec.precision_mode", "log"},
}
DOC_PRECISION = {"enforce_fp32", "preferred_fp32", "enforce_fp16", "enforce_origin", "preferred_optimal"}


def cli(*args, env=None):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=600, env=env)


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def ckpt(export_ckpt):
    return export_ckpt  # conftest's: hidden H, intermediate I, three layers


@pytest.fixture(scope="module")
def exports(target_exports):
    """{target: (folder, manifest, stdout)}: conftest's shared export per target of ckpt's layer 1, float32."""
    return target_exports.kits


def ref_mlp(x, stored, layer):
    p = f"model.layers.{layer}.mlp."
    g, u, d = (stored[p + n].astype(np.float64) for n in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"))
    return ref_swiglu(np.concatenate([x @ g.T, x @ u.T], axis=-1)) @ d.T


def test_op_types_per_target(exports):
    found = {t: set(op_types(d / m["model_file"])) for t, (d, m, _) in exports.items()}
    assert "Swiglu" in found["ascend"] and "Custom" not in found["ascend"]
    assert {"Split", "SiLU", "Mul"} <= found["portable"] and not {"Custom", "Swiglu"} & found["portable"]
    assert "Custom" in found["cpu"] and "Swiglu" not in found["cpu"]
    for t, (_, m, _) in exports.items():
        assert set(m["op_types"]) == found[t]
    assert exports["cpu"][1]["deployable"] is False and exports["ascend"][1]["deployable"] is True


def test_manifest_hashes_and_dynamic_shapes(exports):
    for target, (d, m, _) in exports.items():
        on_disk = {os.path.relpath(os.path.join(root, f), d) for root, _, files in os.walk(d) for f in files}
        assert on_disk - {"manifest.json"} == set(m["files"])
        for rel, digest in m["files"].items():
            assert sha256(d / rel) == digest, rel
        assert m["inputs"][0]["shape"] == [-1, -1, H] and m["inputs"][0]["dynamic"] == [0, 1]
        assert graph_io(d / m["model_file"])["inputs"][0]["shape"] == [-1, -1, H]
        assert m["source"]["checkpoint"] and m["source"]["layers"] == [1, 1]


def test_golden_files_match_numpy_and_raw_bin(exports, ckpt):
    _, stored = ckpt
    for target, (d, m, _) in exports.items():
        assert [g["tokens"] for g in m["golden"]] == [1, 16]
        for g in m["golden"]:
            x = np.load(d / g["input"]["npy"])
            y = np.load(d / g["outputs"][0]["npy"])
            assert list(x.shape) == g["shape"]
            np.testing.assert_allclose(y, ref_mlp(x.astype(np.float64), stored, 1), atol=1e-5, rtol=1.3e-6)
            raw = np.fromfile(d / g["input"]["bin"], dtype="<f4").reshape(x.shape)
            np.testing.assert_array_equal(raw, x)


def verify_kit(kit):
    """The kit's own verify_on_device.py, run on the CPU as on a device: (exit status, its lines)."""
    r = subprocess.run([sys.executable, "-I", kit / "verify_on_device.py", "--device", "CPU", "--calls", "1"],
                       capture_output=True, text=True, timeout=600)
    return r.returncode, [line for line in (r.stdout + r.stderr).splitlines() if not line.startswith("[WARNING")]


@pytest.mark.parametrize("target", ["portable", "cpu"])
def test_the_kits_verify_on_device_passes_on_the_cpu(exports, target):
    """The one command of the kit, here on the CPU (MindSpore only, from the kit folder): every golden case passes
    the acceptance criterion, at two token counts; the export checked the same before it put the kit in place."""
    d, m, stdout = exports[target]
    assert m["checked"] == {"graph": True, "golden": "reloaded MindIR on the CPU", "device": False}
    assert [line.split(":")[1].strip() for line in m["verification"]["reloaded"][:2]] == ["pass", "pass"]
    status, lines = verify_kit(d)
    assert status == 0, lines
    cases = [line for line in lines if line.startswith("case ")]  # (after the kit's id and the device line)
    assert [line.split(":")[0] for line in cases] == [f"case 0 [1, 1, {H}]", f"case 1 [2, 8, {H}]"]
    assert lines[-1].endswith("2 of 2 cases pass (mindspore.load + nn.GraphCell on CPU)")


def test_verify_on_device_fails_on_a_tampered_kit_or_a_wrong_result(exports, tmp_path):
    """A golden file or MindIR changed after the export: exit 2 (the sha256); a golden output that the MindIR does
    not compute (and whose sha256 is made to match): exit 1, that case FAIL; a NaN: FAIL."""
    d, m, _ = exports["portable"]
    for victim in (m["golden"][0]["outputs"][0]["npy"], m["model_file"]):
        kit = tmp_path / f"kit-{len(os.listdir(tmp_path))}"
        shutil.copytree(d, kit)
        with open(kit / victim, "r+b") as f:
            f.seek(-4, os.SEEK_END)
            f.write(b"\x00\x00\x80\x7f")
        status, lines = verify_kit(kit)
        assert status == 2 and "the kit is not whole" in lines[-1] and victim in lines[-1], lines
    for case, value in ((0, 1.02), (1, np.nan)):
        kit = tmp_path / f"kit-{len(os.listdir(tmp_path))}"
        shutil.copytree(d, kit)
        path = kit / m["golden"][case]["outputs"][0]["npy"]
        y = np.load(path)
        y.flat[0] = y.flat[0] * value + 0.3 * np.sqrt(np.mean(y ** 2))  # one element off by 30% of the token's rms
        np.save(path, y)
        manifest = json.loads((kit / "manifest.json").read_text())
        manifest["files"][m["golden"][case]["outputs"][0]["npy"]] = sha256(path)
        (kit / "manifest.json").write_text(json.dumps(manifest))
        status, lines = verify_kit(kit)
        cases = [line for line in lines if line.startswith("case ")]
        assert status == 1 and f"case {case} " in cases[case] and ": FAIL:" in cases[case], lines
        assert ": pass:" in cases[1 - case], lines


def test_ascend_numerics_come_from_the_cpu_twin(exports):
    m = exports["ascend"][1]
    assert m["checked"] == {"graph": True, "golden": "cpu twin", "device": False}
    assert [c["ok"] for c in m["verification"]["cpu_twin"]] == [True, True] and "reloaded" not in m["verification"]


def test_converter_config_uses_documented_keys(exports):
    for target in ("ascend", "portable"):
        d, m, _ = exports[target]
        cfg = configparser.ConfigParser()
        cfg.optionxform = str
        cfg.read(d / "converter_lite.cfg")
        assert set(cfg.sections()) <= set(DOC_KEYS)
        for section in cfg.sections():
            assert set(cfg[section]) <= DOC_KEYS[section], (section, set(cfg[section]))
        assert cfg["ascend_context"]["precision_mode"] in DOC_PRECISION
        assert cfg["ascend_context"]["precision_mode"] != "enforce_fp16"
        shape = cfg["acl_build_options"]["input_shape"].strip('"')
        assert m["inputs"][0]["name"] == "x" and shape == f"x:-1,-1,{H}"  # a name without converter_lite's ':' 
        gears = [tuple(map(int, g.split(","))) for g in cfg["acl_build_options"]["ge.dynamicDims"].strip('"').split(";")]
        assert len(gears) <= 100 and all(len(g) == 2 and 1 <= min(g) and max(g) <= 2048 for g in gears)


def _fake_tools(folder, npu_smi=True, name="910B3", board=None):
    """converter_lite/atc/ms-swiglu stubs that record their arguments, and an npu-smi printing a table whose
    device Name is `name` (`board`: the Chip Name and NPU Name of `npu-smi info -t board`, as on Atlas A3)."""
    folder.mkdir(exist_ok=True)
    for tool in ("converter_lite", "atc"):
        (folder / tool).write_text(f'#!/bin/sh\necho "$@" > "{folder}/{tool}.args"\n')
        os.chmod(folder / tool, 0o755)
    (folder / "ms-swiglu").write_text(f'#!/bin/sh\necho "$@" > "{folder}/ms-swiglu.args"\nmkdir -p air\n')
    os.chmod(folder / "ms-swiglu", 0o755)
    if npu_smi:
        chip, npu = board or ("", "")
        (folder / "npu-smi").write_text(
            '#!/bin/sh\nif [ "$2" = "-t" ]; then\n'
            f'printf "        Chip Name                      : {chip}\\n        NPU Name                       : {npu}\\n"\n'
            "exit 0\nfi\ncat <<'EOF'\n"
            "| npu-smi 24.1.rc2                Version: 24.1.rc2              |\n"
            "| NPU     Name                  | Health          | Power(W) |\n"
            "| Chip    Device                | Bus-Id          | AICore(%) |\n"
            f"| 0       {name:<21} | OK              | 93.4      |\n"
            "| 0       0                     | 0000:C1:00.0    | 0         |\nEOF\n")
        os.chmod(folder / "npu-smi", 0o755)
    return folder


def test_convert_lite_script(exports, tmp_path):
    """Against a stub converter_lite: the ascend kit stops on the ops GE has no adapter for and names the portable
    export (MS_SWIGLU_UNPROVEN=1 goes on); the portable kit converts; the cpu kit refuses."""
    d, m, _ = exports["ascend"]
    assert m["runtime_paths"]["mindspore"] == {"evidence": True, "missing": []}
    assert m["runtime_paths"]["ge"] == {"evidence": False, "missing": ["Swiglu"]}
    tools = _fake_tools(tmp_path / "bin")
    env = dict(os.environ, PATH=f"{tools}:/usr/bin:/bin")
    r = subprocess.run(["bash", d / "convert_lite.sh"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "no adapter in MindSpore 2.10 for Swiglu" in r.stderr
    assert "export --target portable" in r.stderr and not (tools / "converter_lite.args").exists()
    env = dict(os.environ, PATH="/usr/bin:/bin", MS_SWIGLU_UNPROVEN="1")
    r = subprocess.run(["bash", d / "convert_lite.sh"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "converter_lite not found" in r.stderr
    env["PATH"] = f"{tools}:/usr/bin:/bin"
    r = subprocess.run(["bash", d / "convert_lite.sh"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "on Ascend910B3" in r.stdout
    args = (tools / "converter_lite.args").read_text().split()
    assert args == ["--fmk=MINDIR", f"--modelFile={m['model_file']}", f"--outputFile={m['name']}_ascend",
                    "--optimize=ascend_oriented", "--configFile=converter_lite.cfg"]
    r = subprocess.run(["bash", exports["cpu"][0] / "convert_lite.sh"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "cannot be deployed" in r.stderr
    d, m, _ = exports["portable"]
    assert m["runtime_paths"]["ge"] == {"evidence": True, "missing": []}
    r = subprocess.run(["bash", d / "convert_lite.sh"], capture_output=True, text=True,
                       env=dict(os.environ, PATH=f"{tools}:/usr/bin:/bin"))
    assert r.returncode == 0 and f"--modelFile={m['model_file']}" in (tools / "converter_lite.args").read_text()


def test_export_air_script_needs_an_ascend_host(exports, ckpt, tmp_path):
    d, m, _ = exports["ascend"]
    assert m["atc_command"].startswith("atc --mode=0 --framework=1 --model=")
    assert ".air" in m["atc_command"] and "--soc_version=${SOC_VERSION}" in m["atc_command"]
    assert "--precision_mode=must_keep_origin_dtype" in m["atc_command"]
    tools = _fake_tools(tmp_path / "bin")
    os.remove(tools / "ms-swiglu")  # the real one: it refuses AIR off an Ascend device
    env = dict(os.environ, PATH=f"{tools}:{os.path.dirname(sys.executable)}:/usr/bin:/bin", MS_SWIGLU_UNPROVEN="1")
    r = subprocess.run(["bash", d / "export_air.sh"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 2 and "usage: export_air.sh CHECKPOINT" in r.stderr
    r = subprocess.run(["bash", d / "export_air.sh", ckpt[0]], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 2 and "expected MindSpore running on an Ascend device" in r.stderr
    assert not (tools / "atc.args").exists()


def test_static_shape_and_ffn_stack(ckpt, tmp_path):
    folder, stored = ckpt
    r = cli("export", "--checkpoint", folder, "--layers", "0-2", "--output-dir", tmp_path, "--target", "portable",
            "--static-shape", "2,3")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["inputs"][0]["shape"] == [2, 3, H] and m["inputs"][0]["dynamic"] == []
    assert graph_io(tmp_path / m["model_file"])["inputs"][0]["shape"] == [2, 3, H]
    assert "[acl_build_options]" not in (tmp_path / "converter_lite.cfg").read_text()
    assert f"--inputShape={m['inputs'][0]['name']}:2,3,{H}" in m["converter_command"]
    x = np.load(tmp_path / m["golden"][0]["input"]["npy"]).astype(np.float64)
    expected = x
    for layer in range(3):  # x + mlp(rmsnorm(x) * w), eps from config.json
        w = stored[f"model.layers.{layer}.post_attention_layernorm.weight"].astype(np.float64)
        h = expected / np.sqrt(np.mean(expected ** 2, axis=-1, keepdims=True) + 1e-5) * w
        expected = expected + ref_mlp(h, stored, layer)
    np.testing.assert_allclose(np.load(tmp_path / m["golden"][0]["outputs"][0]["npy"]), expected, atol=1e-5, rtol=1.3e-6)
    assert m["checked"]["golden"] == "reloaded MindIR on the CPU"
    assert "Switch" not in m["op_types"] and m["verification"]["straight_line"]


def test_preset_bfloat16(tmp_path):
    r = cli("export", "--preset", "tiny", "--seed", 3, "--output-dir", tmp_path, "--target", "portable",
            "--dtype", "bfloat16")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["dtype"] == "bfloat16" and m["checked"]["golden"] == "reloaded MindIR on the CPU"
    g = m["golden"][1]  # inputs as the device takes them (bfloat16 bits), outputs float32
    bits = np.fromfile(tmp_path / g["input"]["bin"], dtype="<u2").reshape(g["shape"])
    np.testing.assert_array_equal((bits.astype(np.uint32) << 16).view(np.float32),
                                  np.load(tmp_path / g["input"]["npy"]))
    np.testing.assert_array_equal(np.fromfile(tmp_path / g["outputs"][0]["bin"], dtype="<f4").reshape(g["shape"]),
                                  np.load(tmp_path / g["outputs"][0]["npy"]))
    assert g["input"]["bin_dtype"] == "bfloat16" and g["outputs"][0]["bin_dtype"] == "float32"


def test_no_clobber_force_and_unrelated_files(ckpt, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    args = ["export", "--checkpoint", ckpt[0], "--layer", 0, "--output-dir", tmp_path, "--target", "ascend"]
    assert cli(*args).returncode == 0
    before = {f: sha256(tmp_path / f) for f in ("manifest.json", "converter_lite.cfg")}
    r = cli(*args)
    assert r.returncode == 2 and "use --force" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert {f: sha256(tmp_path / f) for f in before} == before
    r = cli(*args, "--force")
    assert r.returncode == 0, r.stderr
    assert notes.read_text() == "mine"
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".ms_swiglu-export-")]


def test_failed_verification_leaves_nothing(ckpt, tmp_path, monkeypatch):
    from ms_swiglu.export import exporter

    (tmp_path / "notes.txt").write_text("mine")

    def broken(*_):
        raise exporter.ExportError("export: expected the reloaded MindIR to match, got an injected failure")

    monkeypatch.setattr(exporter, "_verify_kit", broken)
    req = exporter.ExportRequest(output_dir=str(tmp_path), target="portable", checkpoint=ckpt[0], layers=(0, 0))
    with pytest.raises(exporter.ExportError, match="injected failure"):
        exporter.export(req)
    assert os.listdir(tmp_path) == ["notes.txt"]


def test_ascend_target_refuses_a_custom_op(ckpt, tmp_path, monkeypatch):
    from ms_swiglu.export import exporter

    build = exporter._build
    monkeypatch.setattr(exporter, "_build", lambda req, backend: build(req, "cpu"))  # a graph with the aot Custom op
    req = exporter.ExportRequest(output_dir=str(tmp_path / "out"), target="ascend", checkpoint=ckpt[0], layers=(0, 0))
    with pytest.raises(exporter.ExportError, match="expected no Custom op"):
        exporter.export(req)
    assert os.listdir(tmp_path) == []


def test_killed_export_leaves_no_artifact_and_is_cleaned_next_time(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(CLI + ["export", "--preset", "small", "--output-dir", str(out), "--target", "portable"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and not [f for f in os.listdir(out) if f.startswith(".ms_swiglu-export-")]:
        time.sleep(0.05)
    time.sleep(1.0)  # inside the export: MindIR and golden files are being written into the work folder
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = os.listdir(out)
    assert all(f.startswith(".ms_swiglu-export-") for f in left), left  # no artifact in place
    r = cli("export", "--preset", "tiny", "--output-dir", out, "--target", "portable")
    assert r.returncode == 0, r.stderr
    assert not [f for f in os.listdir(out) if f.startswith(".ms_swiglu-export-")]


BAD_INPUT = {  # id: (the export's arguments, its message); OUT: a new folder's "out", CKPT: ckpt's folder
    "unwritable": (["--preset", "tiny", "--output-dir", "/proc/ms_swiglu_out"], "expected a writable folder"),
    "no-parent": (["--preset", "tiny", "--output-dir", "/nonexistent/a/b"], "expected an existing parent folder"),
    "no-checkpoint": (["--checkpoint", "/nonexistent", "--layer", 0, "--output-dir", "OUT"], "expected a folder"),
    "layer": (["--checkpoint", "CKPT", "--layer", 7, "--output-dir", "OUT"],
              "expected 0..2 (num_hidden_layers=3), got 7"),
    "no-layer": (["--checkpoint", "CKPT", "--output-dir", "OUT"], "expected --layer N or --layers A-B"),
    "static-shape": (["--preset", "tiny", "--static-shape", "2x3", "--output-dir", "OUT"],
                     "expected B,S (two positive integers)"),
    "preset": (["--preset", "gpt-9", "--output-dir", "OUT"], "invalid choice: 'gpt-9'"),
    "air-on-cpu": (["--preset", "tiny", "--air", "--output-dir", "OUT"],
                   "expected MindSpore running on an Ascend device"),
}


@pytest.fixture(scope="module")
def bad_input_runs(ckpt, tmp_path_factory):
    """{id: (its Ran, its folder)}: every BAD_INPUT export in one process (conftest.cli_batch), each with a new
    empty folder of its own for OUT, watched after it."""
    root, cases, folders = tmp_path_factory.mktemp("bad_export"), [], {}
    for name, (args, _) in BAD_INPUT.items():
        folders[name] = root / name
        folders[name].mkdir()
        args = [str(folders[name] / "out") if a == "OUT" else ckpt[0] if a == "CKPT" else a for a in args]
        cases.append({"argv": ["export", *args], "watch": [folders[name]]})
    return {name: (r, folders[name]) for name, r in zip(BAD_INPUT, cli_batch(cases))}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_exit_2_one_line(bad_input_runs, case):
    r, folder = bad_input_runs[case]
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and BAD_INPUT[case][1] in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert r.watched[str(folder)] == {}  # no "out" (nor anything else) in its folder


@pytest.fixture(scope="module")
def moe_ckpt(tmp_path_factory):
    """A Qwen2-MoE checkpoint (gated shared expert; layer 0 dense, layer 1 sparse)."""
    folder = tmp_path_factory.mktemp("export_moe")
    return str(folder), make_checkpoint(folder, model_type="qwen2_moe", hidden=H, inter=40, moe_inter=24, experts=8,
                                        top_k=2, layers=2, sparse=[1], shared_inter=32, seed=12,
                                        config_extra={"decoder_sparse_step": 2, "norm_topk_prob": False,
                                                      "shared_expert_intermediate_size": 32})


@pytest.mark.parametrize("target", ["ascend", "portable"])
def test_moe_layer_exports(moe_ckpt, tmp_path, target):
    """An MoE layer exports like a dense one: the MoE primitives and no Custom op for ascend; for portable,
    MindSpore ops reloaded in a fresh process at two token counts; golden outputs against NumPy."""
    from moe_reference import ref_block, stored_params

    folder, stored = moe_ckpt
    r = cli("export", "--checkpoint", folder, "--layer", 1, "--output-dir", tmp_path / "out", "--target", target)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["source"]["network"] == "PackedMoE" and m["moe"]["num_experts"] == 8 and m["moe"]["sparse_layers"] == [1]
    assert m["inputs"][0]["shape"] == [-1, -1, H]
    assert not {"Switch", "Partial", "Call"} & set(m["op_types"])
    if target == "ascend":
        assert {"MoeInitRoutingV2", "GroupedMatmulV4", "Swiglu"} <= set(m["op_types"]) and "Custom" not in m["op_types"]
        assert m["checked"]["golden"] == "cpu twin" and [c["ok"] for c in m["verification"]["cpu_twin"]] == [True] * 2
        assert set(m["runtime_paths"]["ge"]["missing"]) == {"Swiglu", "GroupedMatmulV4", "MoeInitRoutingV2",
                                                           "InnerMoeTokenUnpermute", "SumExt", "Muls"}
    else:
        assert not {"Custom", "Swiglu", "GroupedMatmulV4"} & set(m["op_types"])
        assert m["checked"]["golden"] == "reloaded MindIR on the CPU" and len(m["verification"]["reloaded"]) == 2
    for case in m["golden"]:
        x = np.load(tmp_path / "out" / case["input"]["npy"]).astype(np.float64)
        want, _ = ref_block(x.reshape(-1, H), stored_params("qwen2_moe", stored, 1))
        np.testing.assert_allclose(np.load(tmp_path / "out" / case["outputs"][0]["npy"]), want.reshape(x.shape),
                                   atol=1e-5, rtol=1e-5)


# `npu-smi info` Name column (and A3's board query) -> the SoC the scripts must read and its family
HOSTS = [("910B3", None, "Ascend910B3", "atlas-a2"), ("910B4-1", None, "Ascend910B4-1", "atlas-a2"),
         ("Ascend910", ("Ascend910", "9391"), "Ascend910_9391", "atlas-a3"),
         ("310P3", None, "Ascend310P3", "atlas-310p"), ("910ProB", None, "Ascend910ProB", "atlas-910a"),
         ("910B", None, "Ascend910B", "atlas-910a")]  # a bare 910B is the first-generation chip


@pytest.mark.parametrize("name, board, soc, family", HOSTS, ids=[h[0] for h in HOSTS])
def test_scripts_read_the_chip_of_every_family(exports, ckpt, tmp_path, name, board, soc, family):
    """convert_lite.sh converts where the host is the family exported for and refuses elsewhere, naming both;
    export_air.sh hands ATC the host's SoC (A3: Chip Name + "_" + NPU Name)."""
    d, m, _ = exports["ascend"]  # exported for the default chip, Atlas A2
    assert m["chip"] == {"name": "Atlas A2", "key": "atlas-a2", "soc_family": "ascend910b"}
    tools = _fake_tools(tmp_path / "bin", name=name, board=board)
    env = dict(os.environ, PATH=f"{tools}:/usr/bin:/bin", MS_SWIGLU_UNPROVEN="1")  # past the GE evidence check
    r = subprocess.run(["bash", d / "convert_lite.sh"], capture_output=True, text=True, env=env)
    if family == "atlas-a2":
        assert r.returncode == 0 and f"on {soc} (Atlas A2)" in r.stdout, r.stderr
    else:
        assert r.returncode == 2 and not (tools / "converter_lite.args").exists()
        assert f"exported for Atlas A2 (atlas-a2), this host is {soc} ({family}): export again with --chip {family}" \
            in r.stderr.replace("\n", " ")
    work = tmp_path / "air_run"
    shutil.copytree(d, work)
    r = subprocess.run(["bash", work / "export_air.sh", ckpt[0]], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "AIR is deprecated in MindSpore 2.10" in r.stderr
    assert f"--soc_version={soc}" in (tools / "atc.args").read_text()
    args = (tools / "ms-swiglu.args").read_text().split()
    assert args[:9] == ["export", "--checkpoint", ckpt[0], "--layer", "1", "--dtype", "float32", "--static-shape",
                        "1,128"] and " ".join(args[9:]).startswith("--target ascend --chip atlas-a2 --air")


def test_chip_option_and_what_a_chip_refuses(ckpt, tmp_path, moe_ckpt):
    """--chip goes into the kit; the ascend target follows the support table: float32 Swiglu on 310P exports, an
    MoE layer for 310P (InnerMoeTokenUnpermute: A2/A3 only) and any chip without Swiglu are refused, bfloat16 where
    the chip has none."""
    a3, p310, moe310, a910, bf16 = cli_batch([  # in one process (conftest.cli_batch), checked below
        ["export", "--checkpoint", ckpt[0], "--layer", 0, "--output-dir", tmp_path / "a3", "--chip", "atlas-a3"],
        ["export", "--checkpoint", ckpt[0], "--layer", 0, "--output-dir", tmp_path / "p", "--chip", "atlas-310p"],
        ["export", "--checkpoint", moe_ckpt[0], "--layer", 1, "--output-dir", tmp_path / "pm", "--chip",
         "atlas-310p"],
        ["export", "--checkpoint", ckpt[0], "--layer", 0, "--output-dir", tmp_path / "t", "--chip", "atlas-910a"],
        ["export", "--checkpoint", ckpt[0], "--layer", 0, "--output-dir", tmp_path / "q", "--chip", "atlas-910a",
         "--target", "portable", "--dtype", "bfloat16"]])
    assert a3.returncode == 0, a3.stderr
    m = json.loads((tmp_path / "a3" / "manifest.json").read_text())
    assert m["chip"]["key"] == "atlas-a3" and "for Atlas A3" in (tmp_path / "a3" / "converter_lite.cfg").read_text()
    assert "checked: graph (op types, straight-line), golden outputs against the cpu twin, device: no" in a3.stdout
    assert p310.returncode == 0, p310.stderr
    assert moe310.returncode == 2 and "expected ops that CANN documents for atlas-310p in float32, got " \
        "GroupedMatmulV4, MoeInitRoutingV2, InnerMoeTokenUnpermute" in moe310.stderr
    assert "export --target portable" in moe310.stderr
    assert a910.returncode == 2 and "expected a chip CANN documents the builtin Swiglu for" in a910.stderr
    assert bf16.returncode == 2 and "(it has no bfloat16), got bfloat16" in bf16.stderr
    assert not [p for p in ("pm", "t", "q") if (tmp_path / p).exists()]


def test_manifest_states_the_acceptance_and_what_was_checked(exports):
    """Fields a program can read: the criterion with the counts it is derived from, the token range, the paths."""
    from ms_swiglu.export.verify_on_device import acceptance

    m = exports["ascend"][1]
    acc = m["outputs"][0]["acceptance"]
    assert acc == acceptance("float32", acc["roundings"], acc["reduction"], acc["gemms"])
    assert (acc["roundings"], acc["reduction"], acc["gemms"]) == (3, I, 2) and acc["unit_roundoff"] == 2.0 ** -24
    assert m["inputs"][0]["tokens"] == {"min": 1, "max": None} and "not in the graph" in m["zero_tokens"]
    assert set(m["runtime_paths"]) == {"mindspore", "ge"} and m["checked"]["device"] is False
    assert not any(w in json.dumps(m) for w in ("here", "this host", "hardware"))


def test_golden_outputs_put_gate_first(exports):
    """Recomputed in NumPy from the weights stored in the exported ascend MindIR, the golden outputs match the
    Swiglu of [gate; up] (Swish of the first half) and not of [up; gate]."""
    from ms_swiglu.export import parameters

    d, m, _ = exports["ascend"]
    weights = parameters(str(d / m["model_file"]))
    gate_up = next(w for n, w in weights.items() if n.endswith("gate_up_proj.weight")).astype(np.float64)
    down = next(w for n, w in weights.items() if n.endswith("down_proj.weight")).astype(np.float64)
    inter = gate_up.shape[0] // 2
    for case in m["golden"]:
        x = np.load(d / case["input"]["npy"]).astype(np.float64)
        y = np.load(d / case["outputs"][0]["npy"]).astype(np.float64)
        gate_first = ref_swiglu(x @ gate_up.T) @ down.T
        up_first = ref_swiglu(np.concatenate([x @ gate_up[inter:].T, x @ gate_up[:inter].T], -1)) @ down.T
        np.testing.assert_allclose(y, gate_first, atol=1e-5, rtol=1.3e-6)
        assert np.abs(y - up_first).max() > 1e-2


def test_export_children_never_import_from_the_working_directory(target_exports):
    """conftest's shared exports (ascend, portable, cpu), each run from a working directory whose glob, json, numpy,
    subprocess, safetensors and mindspore modules leave a mark if imported: every export passed, none marked."""
    from conftest import pwned

    assert sorted(target_exports.kits) == ["ascend", "cpu", "portable"]  # each exit 0 (the fixture checks)
    assert pwned(target_exports.cwd) == []
