"""SIGINT, SIGTERM and SIGHUP at any moment of run, convert and export: exit 128 + the signal's number with one
line, the promised clean-up done (no scratch, work or lock folder, no temporary file), and every output either
the whole earlier one or the whole new one, also after MindSpore has replaced the SIGINT handler (it does at each
graph call) and while outputs are being put in place."""
import contextlib
import glob
import hashlib
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
    assert _job_processes(tmp) == [] and os.listdir(tmp) == []  # no job folder, nor their empty parent
    time.sleep(3)
    assert not (tmp_path / "y.npy").exists() and _job_processes(tmp) == []


def _outcome(proc, sig, out, tmp, whole):
    """A command sent ``sig`` (or finished first) ended as promised: exit 0 with its output whole, or 128 + N with
    one line, its output absent (or whole: the signal came once it was in place) and nothing left in $TMPDIR; or,
    sent while the interpreter was still starting (before the command took its handlers: ~20 ms on a quiet host),
    ended by the signal itself (the shell's 128 + N), having written and printed nothing."""
    _, err = proc.communicate(timeout=120)
    lines = err.strip().splitlines()
    where = f"status {proc.returncode}: {err[-3000:]}"
    if proc.returncode == 0:
        assert whole(out), where
        return "finished"
    if proc.returncode == -sig:
        assert lines == [] and not os.path.lexists(out) and os.listdir(tmp) == [], where
        return "not started"
    assert proc.returncode == 128 + sig, where
    assert lines == [f"ms-swiglu: interrupted ({signal.Signals(sig).name})"], where
    assert not os.path.lexists(out) or whole(out), where
    assert os.listdir(tmp) == [], where  # no log, no compile dump, no scratch folder
    return "interrupted"


def _start(argv, tmp):
    """The command in its own process group (a signal to the group reaches it alone), $TMPDIR its own."""
    tmp.mkdir()
    return subprocess.Popen([EXE, *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp)), start_new_session=True)


def _send(proc, sig, group):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig) if group else os.kill(proc.pid, sig)


def _whole_npy(path):
    return os.path.isfile(path) and np.load(path).shape == (4, H)


def _whole_kit(path):
    return os.path.isdir(path) and whole_export({os.path.relpath(os.path.join(r, n), path): _digest(r, n)
                                                 for r, _, names in os.walk(path) for n in names}) is not None


def _digest(root, name):
    path = os.path.join(root, name)
    if name == "manifest.json":
        with open(path) as f:
            return f.read()
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _maps(pid):
    try:
        with open(f"/proc/{pid}/maps") as f:
            return f.read()
    except OSError:
        return ""


@pytest.mark.parametrize("argv, whole", [
    (["run", "--layer", 0, "--tokens", 4, "--output"], _whole_npy),
    (["export", "--layer", 0, "--target", "portable", "--output-dir"], _whole_kit)], ids=["run", "export"])
def test_a_signal_while_mindspore_is_imported_ends_the_command_cleanly(ckpt, tmp_path, argv, whole):
    """Sent from outside once MindSpore's C++ extension is loaded (its import under way), by pid and to the
    process group: 128 + N and one line. Raised inside the import it had aborted the process (134) or printed an
    ImportError and left a log."""
    cases = [(signal.SIGTERM, False, 0.0), (signal.SIGINT, True, 0.05), (signal.SIGHUP, False, 0.2)]
    for i, (sig, group, delay) in enumerate(cases):
        out = tmp_path / f"out{i}"
        proc = _start([argv[0], "--checkpoint", ckpt, *argv[1:], out], tmp_path / f"tmp{i}")
        _wait_for(lambda: "_c_expression" in _maps(proc.pid), proc)
        time.sleep(delay)
        _send(proc, sig, group)
        assert _outcome(proc, sig, out, tmp_path / f"tmp{i}", whole) == "interrupted"


def test_a_signal_while_a_graph_compiles_ends_the_command_cleanly(ckpt, tmp_path):
    """Sent by another process (to the pid, to the group) when MindSpore's compiler first calls its Python parser,
    in run and in export --target ascend: 128 + N, one line, no output, and no analyze_fail.ir in $TMPDIR. Raised
    inside the compiler it had printed 40-96 lines of MindSpore's traces and left the compile dump."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cases = [(["run", "--checkpoint", ckpt, "--layer", 0, "--tokens", 4, "--output", tmp_path / "y.npy"],
              "compile:SIGINT", "pid"),
             (["run", "--checkpoint", ckpt, "--layer", 1, "--tokens", 4, "--output", tmp_path / "y.npy"],
              "compile:SIGTERM", "group"),
             (["export", "--checkpoint", ckpt, "--layer", 0, "--output-dir", tmp_path / "kit", "--target", "ascend"],
              "compile:SIGHUP", "pid"),
             (["export", "--checkpoint", ckpt, "--layer", 2, "--output-dir", tmp_path / "kit", "--target", "ascend"],
              "compile:SIGINT", "group")]
    spec = [{"argv": [str(a) for a in argv], "at": at, "by": by, "watch": [str(tmp)]} for argv, at, by in cases]
    (tmp_path / "cases.json").write_text(json.dumps(spec))
    r = subprocess.run([sys.executable, "-I", DRIVER, str(tmp_path / "cases.json")], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, TMPDIR=str(tmp)), cwd=tmp_path, start_new_session=True)
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0 and len(results) == len(cases), r.stderr[-3000:]
    for (argv, at, by), got in zip(cases, results):
        name = at.split(":")[1]
        where = f"{argv[0]} {at} by {by}: {got}"
        assert got["status"] == 128 + getattr(signal, name), where
        assert got["stderr"] == [f"ms-swiglu: interrupted ({name})"], where
        assert got["watched"][str(tmp)] == {}, where
    assert not (tmp_path / "y.npy").exists() and not (tmp_path / "kit").exists()


@pytest.mark.parametrize("argv, whole", [
    (["run", "--layer", 0, "--tokens", 4, "--output"], _whole_npy),
    (["export", "--layer", 0, "--target", "ascend", "--output-dir"], _whole_kit)], ids=["run", "export-ascend"])
def test_a_signal_at_any_moment_ends_the_command_cleanly(ckpt, tmp_path, argv, whole):
    """Ten moments from 0.1 s to the end of an undisturbed run of the command (import, reading, compilation,
    graph calls, writing, reporting), the three signals in turn, by pid and to the group: every one ends as
    promised (:func:`_outcome`). How loaded the host is moves the moments, not the promise."""
    command = [argv[0], "--checkpoint", ckpt, *argv[1:]]
    t0 = time.perf_counter()
    assert _outcome(_start([*command, tmp_path / "first"], tmp_path / "tmp-first"), 0, tmp_path / "first",
                    tmp_path / "tmp-first", whole) == "finished"
    end = time.perf_counter() - t0
    ended = []
    for i in range(10):
        sig, group = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)[i % 3], i % 2 == 1
        out, tmp = tmp_path / f"out{i}", tmp_path / f"tmp{i}"
        proc = _start([*command, out], tmp)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.1 + i * max(end - 0.1, 0.0) / 9)
        _send(proc, sig, group)
        ended.append(_outcome(proc, sig, out, tmp, whole))
    assert "interrupted" in ended, ended  # the early moments land inside the command
