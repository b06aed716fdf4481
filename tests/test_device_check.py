"""``ms-swiglu export --device-check DIR``: the set of five kits and run_device_check.py, written whole; the runner's
one line per kit for each exit status of verify_on_device.py; the refusals."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import cli_batch_start
from ms_swiglu.export import device_check

KITS = {k.name: k for k in device_check.KITS}
TOP = ["README.txt", "manifest.json", "run_device_check.py"]
# the ops that mark what each kit is for (a subset of its op types)
MARKS = {"dense-bfloat16": {"Swiglu"}, "dense-int8-g128": {"WeightQuantBatchMatmul"},
         "moe-bfloat16": {"MoeInitRoutingV2", "GroupedMatmulV4", "InnerMoeTokenUnpermute"},
         "moe-ge-bfloat16-2x8": {"MoeInitRouting", "GroupedMatmul", "MoeFinalizeRouting"},
         "dense-float32": {"Swiglu"}}


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def runner(folder, *args):
    return subprocess.run([sys.executable, os.path.join(folder, "run_device_check.py"), *args], capture_output=True,
                          text=True, timeout=600)


def kit_lines(stdout):
    return {line.split(":")[0]: line for line in stdout.splitlines() if line.split(":")[0] in KITS}


def start_set(root, folder):
    """In one background process (conftest.device_check_started; its files in ``folder``): the set written
    (--preset tiny) into a folder holding another file, every refusal, then the set replaced (--force --seed 1).
    (case names, the batch)."""
    out, foreign = root / "set", root / "foreign"
    foreign.mkdir()
    out.mkdir()
    (out / "mine.txt").write_text("not the set's")
    (foreign / "manifest.json").write_text(json.dumps({"name": "tiny-mlp0-ascend-float32", "files": {}}))
    names, cases = set_cases(root)
    return names, cli_batch_start(cases, folder=folder)


def set_cases(root):
    """(case names, cli_batch cases) of :func:`start_set`."""
    out, other, foreign = root / "set", root / "other", root / "foreign"
    base = ["export", "--device-check"]
    cases = {"set": base + [out, "--preset", "tiny"],
             "again": base + [out, "--preset", "tiny"],
             "layer": base + [other, "--preset", "tiny", "--layer", "0"],
             "dtype": base + [other, "--dtype", "float32"],
             "ep-size": base + [other, "--ep-size", "2"],
             "air": base + [other, "--air"],
             "output-dir": base + [other, "--output-dir", root / "x"],
             "chip": base + [other, "--chip", "atlas-310p"],
             "seed": base + [other, "--seed", "-1"],
             "foreign": base + [foreign, "--preset", "tiny", "--force"],
             "neither": ["export", "--preset", "tiny"],
             "force": base + [out, "--preset", "tiny", "--force", "--seed", "1"]}
    return list(cases), [{"argv": argv, "watch": [root]} for argv in cases.values()]


@pytest.fixture(scope="module")
def made(device_check_started):
    """({name: Ran}, the set's folder, their folder) of :func:`start_set`'s commands."""
    root, names, batch = device_check_started
    return dict(zip(names, batch.wait())), root / "set", root


def test_the_set_holds_the_five_kits_the_runner_and_their_ids(made):
    runs, out, _ = made
    assert runs["set"].returncode == 0, runs["set"].stderr[-2000:]
    r = runs["force"]  # the set in the folder now: the first one replaced, the other file kept
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(os.listdir(out)) == sorted(list(KITS) + TOP + ["mine.txt"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kind"] == device_check.KIND and [k["name"] for k in manifest["kits"]] == list(KITS)
    assert manifest["seed"] == 1
    for entry in manifest["kits"]:
        kit = out / entry["name"]
        assert entry["id"] == sha256(kit / "manifest.json")
        assert f"wrote {kit / entry['model_file']} (kit id {entry['id']})" in r.stdout
        assert entry["id"] not in runs["set"].stdout and "(kit id " in runs["set"].stdout  # other weights
        m = json.loads((kit / "manifest.json").read_text())
        want = KITS[entry["name"]]
        assert (m["target"], m["dtype"], m["weights"]["quant"]) == (want.target, want.dtype, want.quant)
        assert m["inputs"][0]["shape"][:2] == list(want.static_shape or (-1, -1))
        assert MARKS[entry["name"]] <= set(m["op_types"]), m["op_types"]
        assert (m["moe"] is not None) == (want.layer == 1)
    moe = json.loads((out / "moe-bfloat16" / "manifest.json").read_text())["moe"]
    assert (moe["num_experts"], moe["top_k"], moe["shared_intermediate_size"] > 0) == (16, 4, True)
    assert moe["router"]["n_group"] == 4 and moe["router"]["topk_group"] == 2
    # the top manifest vouches for every file of the set
    files = {os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs} - {
        "manifest.json", "mine.txt"}
    assert set(manifest["files"]) == files
    assert all(manifest["files"][f] == sha256(out / f) for f in files)
    assert "python run_device_check.py [--device-id N]" in r.stdout.splitlines()[-1]


def test_refusals_are_one_line_and_leave_nothing(made):
    runs, out, root = made
    want = {"again": "expected no earlier export in", "layer": "--layer: expected only --preset, --seed, --chip",
            "dtype": "got --dtype float32", "ep-size": "got --ep-size 2", "air": "got --air",
            "output-dir": "--output-dir: expected only", "chip": "--chip: expected atlas-a2 or atlas-a3",
            "seed": "--seed: expected an integer >= 0, got -1", "foreign": "manifest.json is another export's",
            "neither": "--output-dir: expected a folder"}
    for name, words in want.items():
        r = runs[name]
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, (name, r.stderr)
        assert sorted(r.watched[str(root)]) == ["foreign", "set"], name  # nothing new beside them
    assert os.listdir(root / "foreign") == ["manifest.json"]
    assert (out / "mine.txt").read_text() == "not the set's"


def test_the_runner_reports_each_kit_as_the_cpu_runs_it(made, tmp_path):
    """Off the device (--device CPU) no graph of the set runs: every kit exits 3, one line each."""
    out = tmp_path / "copy"
    shutil.copytree(made[1], out)
    r = runner(out, "--device", "CPU")
    assert r.returncode == 1, r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    lines = kit_lines(r.stdout)
    assert list(lines) == list(KITS)
    for entry in manifest["kits"]:
        assert lines[entry["name"]].startswith(f"{entry['name']}: CANNOT RUN (exit 3); kit {entry['id']}; "
                                               f"verify_on_device: expected the graph to run on CPU")
        log = (out / "device-check-results" / f"{entry['name']}.log").read_text()
        assert f"kit {entry['id']}" in log and log.endswith("exit status: 3\n")
    assert "0 of 5 kits pass on CPU" in r.stdout and r.stdout.splitlines()[-1].startswith("send back:")
    results = out / "device-check-results"
    assert {"summary.txt", "npu-smi.txt"} <= set(os.listdir(results))
    assert (results / "summary.txt").read_text().splitlines()[:5] == list(lines.values())


STUB = """import sys
print("args", " ".join(sys.argv[1:]))
print("kit {kit}")
print("case 0 [1, 1, 128]: {word}")
print("time case 0 [1, 1, 128]: median 1 ms, p90 1 ms over 5 calls; predicted 0.5 ms (x); measured/predicted 2")
print("time case 1 [1, 16, 128]: median 1 ms, p90 1 ms over 5 calls; predicted 0.5..1 ms (y); measured/predicted 1..2")
print("m.mindir: {passed} of 2 cases pass (mindspore.load + nn.GraphCell on Ascend)")
sys.exit({status})
"""


def test_the_runner_classifies_every_exit_status(made, tmp_path):
    """Kits whose verify_on_device.py is a stub exiting 0 or 1 (and one printing another kit id), a kit with a
    tampered golden file (exit 2), one left as written (exit 3 here: no Ascend backend); --device-id passes through."""
    _, out, _ = made
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    ids = {k["name"]: k["id"] for k in json.loads((copy / "manifest.json").read_text())["kits"]}
    stubs = {"dense-bfloat16": (ids["dense-bfloat16"], "pass", 2, 0),
             "dense-int8-g128": (ids["dense-int8-g128"], "FAIL", 1, 1),
             "dense-float32": ("0" * 64, "pass", 2, 0)}
    for name, (kit, word, passed, status) in stubs.items():
        (copy / name / "verify_on_device.py").write_text(STUB.format(kit=kit, word=word, passed=passed,
                                                                     status=status))
    golden = next((copy / "moe-bfloat16" / "golden").glob("output_*.npy"))
    golden.write_bytes(golden.read_bytes()[:-4] + b"\0\0\0\0")
    r = runner(copy, "--device-id", "3")
    assert r.returncode == 1, r.stderr
    lines = kit_lines(r.stdout)
    assert list(lines) == list(KITS)
    assert lines["dense-bfloat16"] == (f"dense-bfloat16: pass; kit {ids['dense-bfloat16']}; measured/predicted 2, "
                                       f"1..2")
    assert lines["dense-int8-g128"].startswith(f"dense-int8-g128: NUMERIC FAILURE (exit 1); kit "
                                               f"{ids['dense-int8-g128']}; measured/predicted 2, 1..2; m.mindir: 1 of "
                                               f"2 cases pass")
    assert lines["moe-bfloat16"].startswith(f"moe-bfloat16: NOT WHOLE (exit 2); kit {ids['moe-bfloat16']}; "
                                            f"verify_on_device: the kit is not whole: golden/{golden.name}")
    assert lines["moe-ge-bfloat16-2x8"].startswith("moe-ge-bfloat16-2x8: CANNOT RUN (exit 3); kit ")
    assert "--device Ascend" in lines["moe-ge-bfloat16-2x8"]
    assert lines["dense-float32"].startswith(f"dense-float32: NOT WHOLE (its kit id is not the set's "
                                             f"{ids['dense-float32']}); kit {'0' * 64}")
    assert "1 of 5 kits pass on Ascend (device id 3)" in r.stdout
    log = (copy / "device-check-results" / "dense-bfloat16.log").read_text()
    assert f"args {copy / 'dense-bfloat16'} --device Ascend --device-id 3" in log


@pytest.mark.parametrize("status, printed, words", [
    (0, "a", "pass"), (1, "a", "NUMERIC FAILURE (exit 1)"), (2, "a", "NOT WHOLE (exit 2)"),
    (3, "a", "CANNOT RUN (exit 3)"), (3, None, "CANNOT RUN (exit 3)"), (-11, "a", "CRASHED (signal 11)"),
    (139, "a", "CRASHED (exit 139)"), (None, "a", f"TIMED OUT (after {device_check.KIT_TIMEOUT} s)"),
    (0, "b", "NOT WHOLE (its kit id is not the set's a)")])
def test_the_verdict_of_each_exit_status(status, printed, words):
    assert device_check.verdict(status, printed, "a") == words


def test_the_runner_refuses_a_device_id_off_the_device_and_a_folder_of_no_set(made, tmp_path):
    _, out, _ = made
    r = runner(out, "--device", "CPU", "--device-id", "0")
    assert r.returncode == 2 and r.stdout == "" and "--device-id: expected it only with --device Ascend" in r.stderr
    shutil.copyfile(out / "run_device_check.py", tmp_path / "run_device_check.py")
    r = runner(tmp_path)
    assert r.returncode == 2 and "expected the manifest.json of a device check" in r.stderr
