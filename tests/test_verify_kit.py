"""The kit's verify_on_device.py as a person runs it, on the CPU: the kit's id first (the one `ms-swiglu export`
printed), the device line, each case timed alone, the exit statuses (2: not whole or malformed, 3: cannot run on
the device asked for), --device-id; and the pieces an NPU would exercise, as pure functions: the roofline inputs
the exporter writes, the prediction from the chip's figures, the chip comparison, npu-smi's table, the converter
config's gears and Lite's inputs in the model's dtype."""
import configparser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest

from conftest import cli_batch
from ms_swiglu.backends import chips
from ms_swiglu.checkpoint import to_bf16_bits
from ms_swiglu.export import kit as kit_files
from ms_swiglu.export import roofline
from ms_swiglu.export import verify_on_device as vod
from ms_swiglu.ffn import FFNBlock, FFNStack
from ms_swiglu.mlp import PackedSwiGLUMLP, to_quantized
from ms_swiglu.moe import PackedMoE

A2, P310 = (dict(name=c.name, key=c.key, soc_family=c.soc_family) for c in (chips.BY_KEY["atlas-a2"],
                                                                               chips.BY_KEY["atlas-310p"]))


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A portable float32 kit of the tiny preset: (folder, manifest, what export printed)."""
    out = tmp_path_factory.mktemp("verify_kit") / "tiny"
    (r,) = cli_batch([["export", "--preset", "tiny", "--target", "portable", "--output-dir", out]])
    assert r.returncode == 0, r.stderr[-2000:]
    return out, json.loads((out / "manifest.json").read_text()), r.stdout


def run_kit(kit, *args):
    """The kit's own script, as on a device: (status, stdout lines, stderr lines), MindSpore's own log lines
    ("[WARNING] ...", "[ERROR] ...") and its plugin loader's left out."""
    r = subprocess.run([sys.executable, "-I", str(kit / "verify_on_device.py"), *map(str, args)], capture_output=True,
                       text=True, timeout=300)

    def ours(text):
        return [line for line in text.splitlines() if line and not line.startswith(("[", "Load dynamic library"))]

    return r.returncode, ours(r.stdout), ours(r.stderr)


def copy(kit, dest):
    shutil.copytree(kit, dest)
    return dest


def test_the_kit_id_comes_first_and_each_case_is_timed(tiny):
    kit, manifest, printed = tiny
    status, out, err = run_kit(kit, "--device", "CPU", "--calls", 3)
    assert status == 0, out + err
    (exported,) = re.findall(r"^kit id: ([0-9a-f]{64}) ", printed, re.M)
    assert out[0] == f"kit {sha256(kit / 'manifest.json')}" == f"kit {exported}"
    assert out[1] == "device CPU: no Ascend chip (no chip check, no predicted time); the kit's Atlas A2 (ascend910b)"
    times = [line for line in out if line.startswith("time case ")]
    assert len(times) == len(manifest["golden"]) == len([line for line in out if line.startswith("case ")])
    for line, case in zip(times, manifest["golden"]):
        assert re.fullmatch(rf"time case {case['case']} {re.escape(str(case['shape']))}: median [0-9.e+-]+ ms, "
                            r"p90 [0-9.e+-]+ ms over 3 calls; no predicted time on CPU", line), line
    assert out[-1].endswith("2 of 2 cases pass (mindspore.load + nn.GraphCell on CPU)")


def test_a_malformed_manifest_is_exit_2_in_one_line(tiny, tmp_path):
    for name, text in (("truncated", '{"files": '), ("a list", "[1, 2]"), ("no model", '{"files": {}}')):
        kit = copy(tiny[0], tmp_path / name.replace(" ", "-"))
        (kit / "manifest.json").write_text(text)
        status, out, err = run_kit(kit, "--device", "CPU")
        assert status == 2 and out == [f"kit {sha256(kit / 'manifest.json')}"], (name, out, err)
        assert len(err) == 1 and err[0].startswith("verify_on_device: the kit is not whole: expected manifest.json "
                                                   "as the exporter wrote it, got "), (name, err)


def test_a_mindir_that_does_not_load_is_exit_3(tiny, tmp_path):
    """The MindIR's bytes replaced (and their sha256 in the manifest): the kit is whole, MindSpore cannot load it."""
    kit = copy(tiny[0], tmp_path / "garbage")
    manifest = json.loads((kit / "manifest.json").read_text())
    (kit / manifest["model_file"]).write_bytes(b"not a MindIR\n" * 64)
    manifest["files"][manifest["model_file"]] = sha256(kit / manifest["model_file"])
    (kit / "manifest.json").write_text(json.dumps(manifest))
    status, out, err = run_kit(kit, "--device", "CPU")
    assert status == 3 and out == [f"kit {sha256(kit / 'manifest.json')}"], out + err
    assert err == [f"verify_on_device: expected a MindIR MindSpore loads on CPU, got {manifest['model_file']}: "
                   f"Load MindIR failed."], err


def test_device_id_is_the_npu_and_refused_on_the_cpu(tiny):
    kit = tiny[0]
    status, out, err = run_kit(kit, "--device", "CPU", "--device-id", 0)
    assert status == 2 and out == [] and err == [
        "verify_on_device: --device-id: expected it only with --device Ascend (the NPU to use), got it with --device "
        "CPU"]
    if ms.device_context.ascend.is_available():
        pytest.skip("an Ascend device is present: the refusal of a missing one is not testable")
    status, out, err = run_kit(kit, "--device", "Ascend", "--device-id", 0)
    assert status == 3 and out == [f"kit {sha256(kit / 'manifest.json')}"], out + err
    assert err == ["verify_on_device: --device Ascend: expected MindSpore for Ascend with CANN and an NPU, got a "
                   "MindSpore whose Ascend backend does not load"]


def test_the_manifest_holds_each_cases_roofline_and_the_chips_models(tiny):
    _, manifest, _ = tiny
    h, i = manifest["hidden_size"], manifest["intermediate_size"]
    rl = manifest["roofline"]
    assert [c["case"] for c in rl["cases"]] == [g["case"] for g in manifest["golden"]]
    for c, g in zip(rl["cases"], manifest["golden"]):
        t = g["tokens"]
        assert c == {"case": g["case"], "tokens": t, "weight_bytes": 3 * h * i * 4, "activation_bytes": 2 * t * h * 4,
                     "flops": 6 * t * h * i}
    assert set(rl["models"]) == {m.soc for m in chips.models("ascend910b")}
    assert rl["models"]["Ascend910B3"]["cube_tflops"] == {"float16": 294.9, "bfloat16": 294.9, "float32": None}


def test_roofline_of_a_dense_mlp_and_its_int8_copy():
    h, i, t = 16, 24, 5
    mlp = PackedSwiGLUMLP(h, i, dtype=ms.bfloat16, backend="composite")
    assert roofline.case(mlp, t, h, 2) == {"tokens": t, "weight_bytes": (2 * i * h + h * i) * 2,
                                           "activation_bytes": 2 * t * h * 2,
                                           "flops": 2 * t * h * 2 * i + 2 * t * i * h}  # gate/up, then down
    q = to_quantized(mlp, "int8")  # one byte a weight, a float32 scale per output row
    assert roofline.case(q, t, h, 2)["weight_bytes"] == 3 * i * h + (2 * i + h) * 4
    h4 = 64  # int4 in groups of 32: half a byte a weight, a float32 scale per 32 inputs; W8A8 at the int8 peak
    mlp4 = PackedSwiGLUMLP(h4, h4, dtype=ms.bfloat16, backend="composite")
    q4 = to_quantized(mlp4, "int4-g32", "ascend")
    assert roofline.case(q4, t, h4, 2)["weight_bytes"] == 3 * h4 * h4 // 2 + 3 * h4 * (h4 // 32) * 4
    assert "compute" not in roofline.case(q4, t, h4, 2)
    assert roofline.case(to_quantized(mlp, "w8a8", "ascend"), t, h, 2)["compute"] == "int8"
    stack = FFNStack([FFNBlock(h, i, dtype=ms.bfloat16, backend="composite") for _ in range(2)], branch_outputs=True)
    assert roofline.case(stack, t, h, 2) == {"tokens": t, "weight_bytes": 2 * (3 * i * h + h) * 2,
                                             "activation_bytes": (1 + 3) * t * h * 2, "flops": 2 * 6 * t * h * i}


def test_roofline_of_a_moe_reads_the_experts_its_tokens_reach():
    """Grouped experts (cpu, ascend): the router, the shared expert and its gate, and E (1 - (1 - k/E)^T) of the
    E experts; dense experts (portable): every expert on every token."""
    h, i, e, k, s = 16, 8, 4, 2, 12
    expert, router, shared = (2 * i * h + h * i) * 4, e * h * 4, (2 * s * h + h * s) * 4 + h * 4
    for backend, dense in (("cpu", False), ("ascend", False), ("composite", True)):
        moe = PackedMoE(h, i, e, k, dtype=ms.float32, backend=backend, shared_intermediate_size=s,
                        shared_expert_gate=True)
        for t in (1, 3):
            read = e if dense else e * (1 - (1 - k / e) ** t)
            assert read == (e if dense else {1: k, 3: 3.5}[t])
            c = roofline.case(moe, t, h, 4)
            assert c == {"tokens": t, "weight_bytes": round(router + shared + read * expert), "activation_bytes":
                         2 * t * h * 4, "flops": 2 * t * h * e + 6 * t * (e if dense else k) * h * i +
                         6 * t * h * s + 2 * t * h, "experts_read": read}, (backend, t, c)


def test_prediction_from_the_chips_figures():
    models = {m.soc: m.entry() for m in chips.models("ascend910b")}
    case = {"case": 1, "weight_bytes": 10 ** 9, "activation_bytes": 0, "flops": 2 * 294.9e12 // 1000}
    lo, hi, words = vod.predicted(case, models, "bfloat16", "Ascend910B3")
    assert lo == hi == pytest.approx(2e-3) and words == ("Ascend910B3, HBM bandwidth not sourced: cube term only, "
                                                         "294.9 TFLOPS bfloat16")
    lo, hi, words = vod.predicted(case, models, "bfloat16", None)  # the model not read: the family's range
    assert (lo, hi) == (pytest.approx(case["flops"] / 363.7e12), pytest.approx(case["flops"] / 245.8e12))
    assert words.startswith("Ascend910B1..Ascend910B4-1, the kit's chip family (model not read)")
    assert vod.predicted(case, models, "float32", "Ascend910B3")[0] is None  # no sourced float32 peak
    lo, _, words = vod.predicted(dict(case, compute="int8"), models, "bfloat16", "Ascend910B3")  # W8A8
    assert lo == pytest.approx(1e-3) and words.endswith("589.8 TOPS int8")
    with_hbm = {"X": dict(models["Ascend910B3"], hbm_gbps=1000.0)}  # 1 GB at 1000 GB/s: 1 ms, the cube's 2 ms
    assert vod.predicted(case, with_hbm, "bfloat16", "X")[0] == pytest.approx(2e-3)
    assert vod.predicted(dict(case, weight_bytes=5 * 10 ** 9), with_hbm, "bfloat16", "X")[0] == pytest.approx(5e-3)
    line = vod.time_line({"case": 1, "shape": [2, 8, 64]}, [4.0, 4.0, 6.0], {"cases": [case], "models": models},
                         "bfloat16", "Ascend910B3", "Ascend")
    assert line == ("time case 1 [2, 8, 64]: median 4 ms, p90 5.6 ms over 3 calls; predicted 2 ms (Ascend910B3, HBM "
                    "bandwidth not sourced: cube term only, 294.9 TFLOPS bfloat16); measured/predicted 2")


def test_chip_comparison():
    soc = vod.soc_name("910B3")
    assert (soc, vod.soc_family(soc)) == ("Ascend910B3", "ascend910b")
    assert vod.chip_verdict("Ascend", soc, "ascend910b", A2, "aclrtGetSocName") == (
        True, "chip Ascend910B3 (ascend910b) from aclrtGetSocName, as the kit's Atlas A2 (ascend910b)")
    assert vod.chip_verdict("Ascend", soc, "ascend910b", P310, "npu-smi info") == (
        False, "expected a chip of Atlas inference series (310P) (ascend310p), the kit's, got Ascend910B3 "
               "(ascend910b) from npu-smi info: export again with --chip atlas-a2")
    assert vod.chip_verdict("Ascend", None, None, A2)[0]  # not read: not compared
    assert not vod.chip_verdict("Ascend", "Ascend950PR_9599", None, A2)[0]  # read, of no known family
    assert vod.chip_verdict("CPU", None, None, None) == (
        True, "device CPU: no Ascend chip (no chip check, no predicted time); a kit for no Ascend chip")
    # the script's own tables agree with the package's
    assert vod.CHIP_KEYS == {c.soc_family: c.key for c in chips.CHIPS}
    assert all(vod.soc_family(m.soc) == m.family for m in chips.MODELS)
    assert [vod.soc_family(s) for s in ("Ascend310P3", "Ascend310B1", "Ascend910ProB", "Ascend910B", "Ascend910_9391",
                                        "Ascend950PR_9599")] == [
        "ascend310p", "ascend310b", "ascend910", "ascend910", "ascend910_93", None]  # 910B: the training series


def test_npu_smi_names_the_soc():
    table = ("| npu-smi 24.1.rc2                Version: 24.1.rc2              |\n"
             "| NPU     Name                  | Health          | Power(W) |\n"
             "| Chip    Device                | Bus-Id          | AICore(%) |\n"
             "| 3       {}             | OK              | 93.4      |\n"
             "| 0       0                     | 0000:C1:00.0    | 0         |\n")
    assert vod.npu_smi_device(table.format("910B4    ")) == ("3", "910B4")
    assert vod.soc_from_npu_smi("910B4") == "Ascend910B4"
    assert vod.npu_smi_device(table.format("Ascend910")) == ("3", "Ascend910")
    board = ("        Chip Name                      : Ascend910\n"
             "        NPU Name                       : 9391\n")
    assert vod.soc_from_npu_smi("Ascend910", board) == "Ascend910_9391"
    assert vod.soc_from_npu_smi("Ascend910", "") is None and vod.npu_smi_device("no table") is None


def test_the_converter_config_gears_hold_every_golden_shape(tiny):
    kit, manifest, _ = tiny
    cfg = configparser.ConfigParser()
    cfg.optionxform = str
    cfg.read(kit / "converter_lite.cfg")
    gears = [tuple(map(int, g.split(","))) for g in cfg["acl_build_options"]["ge.dynamicDims"].strip('"').split(";")]
    assert {tuple(g["shape"][:2]) for g in manifest["golden"]} <= set(gears) and len(gears) == len(set(gears))
    assert kit_files.gears([[2, 8, 64], [3, 5, 64], [1, 1, 64], [7, 64]]) == kit_files.GEARS + [(2, 8), (3, 5)]
    with pytest.raises(ValueError, match="expected gear dims in 1..2048, got golden shape"):
        kit_files.gears([[1, 4096, 64]])


def test_lite_inputs_are_in_the_models_dtype():
    x = np.array([1.0, -2.5, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8], np.float32)  # the last two: ties of bfloat16
    bits = vod.lite_input(x, "bfloat16")
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(bits[:2], to_bf16_bits(x[:2]))  # exact bfloat16 values: their patterns
    np.testing.assert_array_equal(bits[2:4], [0x3F80, 0x3F82])  # ties go to the even pattern
    assert vod.lite_input(x, "float16").dtype == np.float16 and vod.lite_input(x, "float32").dtype == np.float32


def test_read_chip_falls_back_to_npu_smi(monkeypatch):
    board = "        Chip Name                      : Ascend910\n        NPU Name                       : 9372\n"
    table = "| 0       Ascend910             | OK              | 93.4      |\n"
    monkeypatch.setattr(vod, "_mindspore_soc", lambda: None)
    monkeypatch.setattr(vod, "_acl_soc", lambda: None)
    monkeypatch.setattr(vod, "_npu_smi", lambda *args: board if args[:2] == ("-t", "board") else table)
    assert vod.read_chip() == ("Ascend910_9372", "ascend910_93", "npu-smi info")
    monkeypatch.setattr(vod, "_npu_smi", lambda *args: "")
    monkeypatch.setattr(vod, "_mindspore_soc", lambda: "Ascend910B4")
    assert vod.read_chip() == ("Ascend910B4", "ascend910b", "mindspore.hal.get_device_name")


def test_on_ascend_the_chip_is_compared_and_the_time_predicted(tiny, monkeypatch):
    """The Ascend path with the device stood in for by the CPU: a chip of another family is exit 3 in one line; the
    kit's own family runs, each case's time beside the prediction (none for float32: no sourced cube rate)."""
    kit = tiny[0]
    monkeypatch.setattr(vod, "open_device", lambda device, device_id=None: None)  # (MindSpore stays on the CPU)
    monkeypatch.setattr(vod, "read_chip", lambda: ("Ascend310P3", "ascend310p", "npu-smi info"))
    lines = []
    assert vod.verify(str(kit), "Ascend", calls=2, out=lines.append) == 3
    assert lines == [f"kit {sha256(kit / 'manifest.json')}", "verify_on_device: expected a chip of Atlas A2 "
                     "(ascend910b), the kit's, got Ascend310P3 (ascend310p) from npu-smi info: export again with "
                     "--chip atlas-310p"]
    monkeypatch.setattr(vod, "read_chip", lambda: ("Ascend910B3", "ascend910b", "mindspore.hal.get_device_name"))
    monkeypatch.setattr(ms.runtime, "synchronize", lambda: None)  # (the CPU has no stream to wait for)
    lines = []
    assert vod.verify(str(kit), "Ascend", calls=2, out=lines.append) == 0, lines
    assert lines[1] == ("chip Ascend910B3 (ascend910b) from mindspore.hal.get_device_name, as the kit's Atlas A2 "
                        "(ascend910b)")
    times = [line for line in lines if line.startswith("time case ")]
    assert len(times) == 2 and all(line.endswith("; no predicted time (no sourced cube peak for float32 nor HBM "
                                                 "bandwidth of Ascend910B3)") for line in times), times
