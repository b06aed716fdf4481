"""SIGINT, SIGTERM and SIGHUP at any moment of run, convert and export: exit 128 + the signal's number with one
line, the promised clean-up done (no scratch, work or lock folder, no temporary file), and every output either
the whole earlier one or the whole new one, also after MindSpore has replaced the SIGINT handler (it does at each
graph call) and while outputs are being put in place."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hf_checkpoint import make_checkpoint

EXE = os.path.join(os.path.dirname(sys.executable), "ms-swiglu")
DRIVER = os.path.join(os.path.dirname(__file__), "signal_driver.py")
H = 32


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    folder = tmp_path_factory.mktemp("int_ckpt")
    make_checkpoint(folder, layers=3, seed=7)
    return str(folder)


def top(contents):
    """The top-level names of a folder's contents as the driver records them."""
    return sorted({rel.split("/")[0] for rel in contents})


def whole_export(contents):
    """The folder (as recorded) holds exactly one whole export: its manifest, every file the manifest names with
    its sha256, and nothing else; its manifest."""
    manifest = json.loads(contents["manifest.json"])
    assert all(contents.get(name) == digest for name, digest in manifest["files"].items())
    assert top(contents) == sorted({n.split("/")[0] for n in manifest["files"]} | {"manifest.json"})
    return manifest


def test_each_signal_at_each_moment_leaves_the_earlier_or_the_new_output_whole(ckpt, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run_out, conv, exp = tmp_path / "run", tmp_path / "conv", tmp_path / "exp"
    for d in (run_out, conv, exp):
        d.mkdir()
    run = ["run", "--checkpoint", ckpt, "--layer", 0, "--tokens", 3]
    convert = ["convert", "--checkpoint", ckpt, "--output", conv / "p.safetensors", "--tp-size", 4]
    export = ["export", "--checkpoint", ckpt, "--output-dir", exp, "--target", "portable"]
    sigs = ("SIGINT", "SIGTERM", "SIGHUP")
    cases = [  # (argv, signal point, what the case checks)
        (run + ["--output", run_out / "new.npy"], "graph:SIGINT", "run-none"),
        (run + ["--output", run_out / "y.npy"], "", "setup"),
        *[(run + ["--output", run_out / "y.npy", "--force", "--seed", i + 1], f"commit:{s}", "run-whole")
          for i, s in enumerate(sigs)],
        (convert, "convert-layer:SIGINT", "convert-none"),
        (convert, "", "setup"),
        *[(convert + ["--force"], f"commit:{s}", "convert-whole") for s in sigs],
        (export + ["--layer", 0], "export-written:SIGTERM", "export-none"),
        (export + ["--layer", 0], "", "setup"),
        *[(export + ["--layer", 1, "--force"], f"commit:{s}", "export-whole") for s in sigs],
    ]
    spec = [{"argv": [str(a) for a in argv], "at": at, "watch": [str(tmp), str(run_out), str(conv), str(exp)]}
            for argv, at, _ in cases]
    (tmp_path / "cases.json").write_text(json.dumps(spec))
    r = subprocess.run([sys.executable, "-I", DRIVER, str(tmp_path / "cases.json")], capture_output=True,
                       text=True, timeout=900, env=dict(os.environ, TMPDIR=str(tmp)), cwd=tmp_path)
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0 and len(results) == len(cases), r.stderr[-3000:]
    earlier = {}
    for (argv, at, kind), got in zip(cases, results):
        where = f"{kind} {at}: {got['status']} {got['stderr']}"
        run_now, conv_now, exp_now = (got["watched"][str(d)] for d in (run_out, conv, exp))
        if kind == "setup":
            assert got["status"] == 0, where
            earlier[argv[0]] = {"run": run_now, "convert": conv_now, "export": exp_now}[argv[0]]
            continue
        signum = getattr(signal, at.split(":")[1])
        assert got["status"] == 128 + signum, where
        assert got["stderr"] == [f"ms-swiglu: interrupted ({at.split(':')[1]})"], where
        assert got["watched"][str(tmp)] == {}, where  # no scratch folder, no export staging folder
        if kind == "run-none":
            assert "new.npy" not in run_now, where
        elif kind == "run-whole":  # the new output (another seed) whole, no hidden temporary or kept file
            assert list(run_now) == ["y.npy"] and run_now["y.npy"] != earlier["run"]["y.npy"], where
            earlier["run"] = run_now
        elif kind == "convert-none":
            assert conv_now == {}, where
        elif kind == "convert-whole":  # all 4 ranks of the new conversion (each names a new set): never cut
            assert sorted(conv_now) == [f"p-tp{r}-of-4.safetensors" for r in range(4)], where
            assert all(conv_now[f] != earlier["convert"][f] for f in conv_now), where
            earlier["convert"] = conv_now
        elif kind == "export-none":
            assert exp_now == {}, where  # no work folder, no lock
        else:  # the new export (layer 1) whole, the earlier one (layer 0) gone, no work folder or lock
            assert whole_export(exp_now)["source"]["layers"] == [1, 1], where
    assert np.load(run_out / "y.npy").shape == (3, H)


def _wait_for(predicate, proc, limit=300):
    t0 = time.time()
    while not predicate():
        assert proc.poll() is None and time.time() - t0 < limit, proc.communicate()[1][-2000:]
        time.sleep(0.02)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_from_outside_after_a_graph_call_ends_export_cleanly(ckpt, tmp_path, sig):
    """Sent from outside when the export's golden outputs (graph calls) start to appear: 128 + N within about
    a second, and the output folder (work folder and lock included) and $TMPDIR left as they were."""
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([EXE, "export", "--checkpoint", ckpt, "--layer", "0", "--output-dir", str(out),
                             "--target", "portable"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp)))
    _wait_for(lambda: glob.glob(f"{out}/.ms_swiglu-export-*/golden/output_0_*.npy"), proc)
    proc.send_signal(sig)
    t0 = time.time()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err[-2000:]
    assert time.time() - t0 < 5 and err.strip().splitlines()[-1].startswith("ms-swiglu: interrupted"), err
    assert not os.path.exists(out) and os.listdir(tmp) == []


def _job_processes(tmp):
    """PIDs of the processes whose command line names the job folders under ``tmp``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f"{tmp}/ms-swiglu-tp".encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def test_sigterm_to_a_tensor_parallel_run_ends_its_job_before_it_returns(ckpt, tmp_path):
    """SIGTERM (as from ``timeout``) once the workers run: exit 143, msrun and every worker gone when the command
    returns, the job folder removed, and no --output then or later."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    np.save(tmp_path / "x.npy", np.ones((2, H), np.float32))
    proc = subprocess.Popen([EXE, "run", "--checkpoint", ckpt, "--layer", "0", "--input", str(tmp_path / "x.npy"),
                             "--tp-size", "2", "--repeat", "200", "--output", str(tmp_path / "y.npy")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp)))
    _wait_for(lambda: glob.glob(f"{tmp}/ms-swiglu-tp/*/logs/worker_1.log"), proc)
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    assert _job_processes(tmp) == [] and os.listdir(tmp / "ms-swiglu-tp") == []
    time.sleep(3)
    assert not (tmp_path / "y.npy").exists() and _job_processes(tmp) == []
