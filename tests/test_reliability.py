"""The CLI's promise under hostile input, crashes and races: bad input exits 2 with one line; a bug exits 1 naming
its traceback; outputs appear whole or not at all; nothing existing is replaced without --force; no subprocess
imports from the working directory; nothing is left behind but what a failure needs for diagnosis."""
import contextlib
import json
import os
import re
import signal
import stat
import struct
import subprocess
import sys

import numpy as np
import pytest

from ms_swiglu.checkpoint import read_safetensors
from ms_swiglu.errors import InputError
from conftest import cli_batch, pwned
from hf_checkpoint import make_checkpoint

H, I = 32, 48
EXE = os.path.join(os.path.dirname(sys.executable), "ms-swiglu")


def cli(*args, cwd=None, env=None, timeout=600):
    return subprocess.run([EXE, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def one_line(r, status, message):
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == status, (r.returncode, r.stdout[-800:], r.stderr[-2000:])
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr, r.stderr[-2000:]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rel_ckpt")
    make_checkpoint(folder, layers=3, seed=5)
    return str(folder)


@pytest.fixture
def tmpenv(tmp_path):
    """The environment of a child whose temporary files must land in this test's folder."""
    (tmp_path / "tmp").mkdir()
    return dict(os.environ, TMPDIR=str(tmp_path / "tmp"))


# ---- 1. no code from the working directory (the shared runs': test_export, test_bench, test_parallel) ---------

# ---- 2. outputs whole or not at all ---------------------------------------------------------------------------

FAULT = r"""
import os, signal, sys
from ms_swiglu import cli
from ms_swiglu.checkpoint import converted
calls, when, how = [0], int(os.environ["FAULT_AT"]), os.environ["FAULT"]
original = converted.layout_safetensors if os.environ["FAULT_IN"] == "dump" else os.link
def faulty(*a, **k):
    calls[0] += 1
    if calls[0] == when:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise {"disk": OSError(28, "No space left on device"), "ctrl-c": KeyboardInterrupt()}[how]
    return original(*a, **k)
if os.environ["FAULT_IN"] == "dump":  # each rank's file starts with its layout
    converted.layout_safetensors = faulty
else:
    os.link = faulty
sys.exit(cli.main(sys.argv[1:]))
"""


def convert_with_fault(ckpt, out, fault, where, at, *extra):
    env = dict(os.environ, FAULT=fault, FAULT_IN=where, FAULT_AT=str(at))
    return subprocess.run([sys.executable, "-c", FAULT, "convert", "--checkpoint", ckpt, "--output", str(out),
                           "--tp-size", "2", *extra], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("fault, status", [("disk", 1), ("ctrl-c", 130)])
def test_convert_failing_on_rank_1_leaves_nothing(ckpt, tmp_path, fault, status):
    out = tmp_path / "packed.safetensors"
    r = convert_with_fault(ckpt, out, fault, "dump", 2)  # rank 0 written, rank 1 fails
    assert r.returncode == status, r.stderr
    assert os.listdir(tmp_path) == []  # neither rank 0's file nor any temporary
    r = cli("convert", "--checkpoint", ckpt, "--output", out, "--tp-size", 2)  # a rerun is not refused
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["packed-tp0-of-2.safetensors", "packed-tp1-of-2.safetensors"]


def test_a_killed_convert_is_told_apart_and_cleaned_by_the_next(ckpt, tmp_path):
    out = tmp_path / "packed.safetensors"
    r = convert_with_fault(ckpt, out, "kill", "link", 2)  # killed between putting rank 0 and rank 1 in place
    assert r.returncode == -signal.SIGKILL
    rank0 = tmp_path / "packed-tp0-of-2.safetensors"
    assert rank0.exists() and not (tmp_path / "packed-tp1-of-2.safetensors").exists()
    with open(rank0, "rb") as f:  # a reader can tell: the file names its set of 2, whose rank 1 is missing
        meta = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))["__metadata__"]
    assert meta["tp_size"] == "2" and meta["rank"] == "0" and meta["set"]
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # the killed writer's temporaries
    r = cli("convert", "--checkpoint", ckpt, "--output", out, "--tp-size", 2)
    one_line(r, 2, f"expected a new file, got existing {rank0}")
    r = cli("convert", "--checkpoint", ckpt, "--output", out, "--tp-size", 2, "--force")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["packed-tp0-of-2.safetensors", "packed-tp1-of-2.safetensors"]
    sets = {read_safetensors_meta(tmp_path / f"packed-tp{r}-of-2.safetensors")["set"] for r in range(2)}
    assert len(sets) == 1 and meta["set"] not in sets


def read_safetensors_meta(path):
    with open(path, "rb") as f:
        return json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))["__metadata__"]


EXPORT_FAULT = r"""
import os, signal, sys
from ms_swiglu import cli
calls, when, how = [0], int(os.environ["FAULT_AT"]), os.environ["FAULT"]
def faulty(original):
    def put(src, dst, *a, **k):  # every way an entry is put into the output folder
        if os.path.dirname(os.path.abspath(dst)) == os.path.abspath(os.environ["OUT"]):
            calls[0] += 1
            if calls[0] == when:
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise OSError(28, "No space left on device")
        return original(src, dst, *a, **k)
    return put
os.link, os.rename, os.replace = faulty(os.link), faulty(os.rename), faulty(os.replace)
sys.exit(cli.main(sys.argv[1:]))
"""


def export_with_fault(out, fault, at, *extra):
    env = dict(os.environ, FAULT=fault, FAULT_AT=str(at), OUT=str(out))
    return subprocess.run([sys.executable, "-c", EXPORT_FAULT, "export", "--preset", "tiny", "--output-dir", str(out),
                           "--target", "portable", *map(str, extra)], capture_output=True, text=True, timeout=600,
                          env=env)


def whole(out):
    """Whether ``out`` holds a whole export: a manifest whose every file is there with its sha256."""
    import hashlib

    path = out / "manifest.json"
    if not path.exists():
        return False
    manifest = json.loads(path.read_text())
    return all((out / f).exists() and hashlib.sha256((out / f).read_bytes()).hexdigest() == h
               for f, h in manifest["files"].items())


def _files(out):
    return {f: (out / f).read_bytes() for f in os.listdir(out) if (out / f).is_file()}


def test_export_a_manifest_marks_a_whole_export_at_every_point(tmp_path):
    out = tmp_path / "out"
    r = export_with_fault(out, "kill", 2)  # killed between putting the model and the rest in place
    assert r.returncode == -signal.SIGKILL and not (out / "manifest.json").exists() and not whole(out)
    r = cli("export", "--preset", "tiny", "--output-dir", out, "--target", "portable", "--force", "--seed", 1)
    assert r.returncode == 0, r.stderr
    assert whole(out) and not [f for f in os.listdir(out) if f.startswith(".ms_swiglu-export-")]
    r = export_with_fault(out, "kill", 3, "--force", "--seed", 2)  # --force over a whole export, killed midway
    assert r.returncode == -signal.SIGKILL
    assert not (out / "manifest.json").exists()  # removed first: the half-replaced folder does not look whole
    r = cli("export", "--preset", "tiny", "--output-dir", out, "--target", "portable", "--force", "--seed", 1)
    assert r.returncode == 0 and whole(out)
    before = _files(out)
    r = export_with_fault(out, "disk", 3, "--force", "--seed", 2)  # a failure it can catch: the earlier export back
    assert r.returncode == 1 and "No space left on device" in r.stderr
    assert whole(out) and _files(out) == before


def test_export_refuses_a_foreign_file_named_like_an_artifact_before_touching_anything(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "golden").write_text("mine")
    (out / "notes.txt").write_text("mine too")
    r = cli("export", "--preset", "tiny", "--output-dir", out, "--target", "portable", "--force")
    one_line(r, 2, f"expected {out / 'golden'} to be an earlier export's folder, got a regular file")
    assert sorted(os.listdir(out)) == ["golden", "notes.txt"] and (out / "golden").read_text() == "mine"


def _folder_set(folder, force=False):
    """A FolderSet of a file, a subfolder and a manifest listing both, as an export's (no MindSpore)."""
    from ms_swiglu.outputs import FolderSet

    return FolderSet(folder, ["model.bin", "golden/", "manifest.json"], force, label="--output-dir", noun="export",
                     manifest="manifest.json")


def _fill(out, text):
    """Write the set's entries into its stage, the manifest listing them."""
    stage = out.stage
    with open(os.path.join(stage, "model.bin"), "w") as f:
        f.write(text)
    os.mkdir(os.path.join(stage, "golden"))
    with open(os.path.join(stage, "golden", "case.npy"), "w") as f:
        f.write(text)
    with open(os.path.join(stage, "manifest.json"), "w") as f:
        json.dump({"files": {"model.bin": text, "golden/case.npy": text}}, f)


def _tree(folder):
    """{relative path: text} of every file under ``folder``, hidden ones included."""
    return {os.path.relpath(os.path.join(root, f), folder): open(os.path.join(root, f)).read()
            for root, _, files in os.walk(folder) for f in files}


def test_a_folder_set_appears_whole_and_replaces_only_what_the_earlier_manifest_lists(tmp_path):
    out = tmp_path / "out"
    with _folder_set(out) as s:  # the folder is created, the entries built in its hidden stage
        _fill(s, "one")
        assert sorted(os.listdir(out)) == sorted([".ms_swiglu-export-lock", os.path.basename(s.stage)])
        s.commit()
    first = {"golden/case.npy": "one", "model.bin": "one",
             "manifest.json": json.dumps({"files": {"model.bin": "one", "golden/case.npy": "one"}})}
    assert _tree(out) == first  # no lock, no stage, no kept entry
    (out / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=re.escape(f"--output-dir: expected no earlier export in {out}, found "
                                                   f"model.bin, golden, manifest.json (use --force to replace them)")):
        _folder_set(out)
    assert _tree(out) == dict(first, **{"notes.txt": "mine"})
    (out / "old.bin").write_text("earlier")  # an earlier export's file under another name, listed by its manifest
    (out / "manifest.json").write_text(json.dumps({"files": {"model.bin": "one", "golden/case.npy": "one",
                                                             "old.bin": "earlier"}}))
    with _folder_set(out, force=True) as s:
        _fill(s, "two")
        s.commit()
    assert _tree(out) == {"golden/case.npy": "two", "model.bin": "two", "notes.txt": "mine",
                          "manifest.json": json.dumps({"files": {"model.bin": "two", "golden/case.npy": "two"}})}


def test_a_folder_set_refuses_what_no_earlier_set_wrote_even_with_force(tmp_path):
    from ms_swiglu.outputs import FolderSet

    out = tmp_path / "out"
    out.mkdir()
    os.symlink("/etc/hostname", out / "old.bin")
    (out / "manifest.json").write_text(json.dumps({"files": {"old.bin": "x"}}))
    with pytest.raises(InputError, match=re.escape(f"--output-dir: expected {out / 'old.bin'} to be an earlier "
                                                   f"export's regular file, got a symlink; move it away")):
        _folder_set(out, force=True)
    (out / "golden").write_text("mine")
    with pytest.raises(InputError, match=re.escape(f"expected {out / 'golden'} to be an earlier export's folder, "
                                                   f"got a regular file")):
        FolderSet(out, ["golden/"], True, label="--output-dir", noun="export")
    assert sorted(os.listdir(out)) == ["golden", "manifest.json", "old.bin"]


def test_a_failed_folder_commit_puts_the_earlier_set_back(tmp_path, monkeypatch):
    out = tmp_path / "out"
    with _folder_set(out) as s:
        _fill(s, "one")
        s.commit()
    before = _tree(out)
    replace, failed = os.replace, []

    def full(src, dst):  # the disk fills once, as the subfolder is put in place after the model file
        if os.path.basename(dst) == "golden" and not failed:
            failed.append(dst)
            raise OSError(28, "No space left on device")
        return replace(src, dst)

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space left"), _folder_set(out, force=True) as s:
        _fill(s, "two")
        s.commit()
    assert failed and _tree(out) == before


def test_two_folder_sets_for_one_folder_refuse_each_other(tmp_path):
    out = tmp_path / "out"
    with _folder_set(out) as first:
        with pytest.raises(InputError, match=re.escape(
                f"--output-dir: expected no other export writing to {out}, found one (its lock "
                f"{out / '.ms_swiglu-export-lock'} is held)")):
            _folder_set(out, force=True)
        _fill(first, "one")
        first.commit()
    assert sorted(os.listdir(out)) == ["golden", "manifest.json", "model.bin"]


def test_the_next_set_sweeps_what_killed_writers_left(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    dead, live = ".ms_swiglu-export-9999991.abc", f".ms_swiglu-export-{os.getpid()}.abc"
    for name in (f"{dead}.tmp/golden", f"{dead}.old", f"{live}.tmp"):
        (out / name).mkdir(parents=True)
    (out / f"{dead}.tmp" / "model.bin").write_text("partial")
    (out / ".ms_swiglu-export-lock").write_text("")  # a killed writer's lock: taken over
    (out / ".ms_swiglu-export-backup.tmp").write_text("mine")  # no pid: not a writer's
    with _folder_set(out) as s:
        _fill(s, "one")
        s.commit()
    assert sorted(os.listdir(out)) == sorted([".ms_swiglu-export-backup.tmp", f"{live}.tmp", "golden",
                                              "manifest.json", "model.bin"])


# ---- 3. two writers, one target ------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["convert", "export"])
def test_of_two_writers_exactly_one_wins(ckpt, tmp_path, command):
    if command == "convert":
        args = ["convert", "--checkpoint", ckpt, "--output", tmp_path / "p.safetensors", "--tp-size", 2]
    else:
        args = ["export", "--preset", "tiny", "--output-dir", tmp_path / "out", "--target", "portable"]
    procs = [subprocess.Popen([EXE, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    assert sorted(status for status, _ in results) == [0, 2], results
    loser = next(err for status, err in results if status == 2)
    # the loser may have lost at its final commit, after its progress bar: then one error line ends it
    lines = [line for line in loser.splitlines() if line.strip() and not re.match(r"\w+ \[[#.]+\] \d+/\d+ ", line)]
    assert len(lines) == 1 and ("expected a new file" in lines[0] or "expected no" in lines[0]), loser
    assert loser.strip().splitlines()[-1] == lines[0] and "Traceback" not in loser


# ---- 4. malformed input --------------------------------------------------------------------------------------

def _npy_header(shape):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': %r, }" % (shape,)
    header += " " * (-(len(header) + 11) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode()


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory, ckpt):
    d = tmp_path_factory.mktemp("bad_inputs")
    np.savez(d / "x.npz", x=np.ones((2, H), np.float32))
    (d / "empty.npy").write_bytes(b"")
    (d / "huge.npy").write_bytes(_npy_header((10 ** 7, 10 ** 6, H)))  # a header claiming 1.3 PB, no data
    (d / "text.npy").write_text("1 2 3\n")
    (d / "obj.npy").write_bytes(b"")
    np.save(d / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    for name, raw in (("list", "[1, 2]"), ("string", '"llama"'), ("number", "7")):
        (d / name).mkdir()
        (d / name / "config.json").write_text(raw)
    cfg = json.loads(open(os.path.join(ckpt, "config.json")).read())
    (d / "eps").mkdir()
    (d / "eps" / "config.json").write_text(json.dumps(dict(cfg, rms_norm_eps=-1e-6)))
    (d / "escape").mkdir()
    (d / "escape" / "config.json").write_text(json.dumps(cfg))
    (d / "escape" / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.layers.0.mlp.gate_proj.weight": f"../{os.path.basename(ckpt)}/model.safetensors"}}))
    # things that are not regular files where a file is read or replaced: a FIFO would block open() for ever
    os.mkfifo(d / "fifo.npy")
    os.mkfifo(d / "fifo-out")
    os.symlink("loop.npy", d / "loop.npy")
    (d / "fifo-config").mkdir()
    os.mkfifo(d / "fifo-config" / "config.json")
    (d / "fifo-model").mkdir()
    (d / "fifo-model" / "config.json").write_text(json.dumps(cfg))
    os.mkfifo(d / "fifo-model" / "model.safetensors")
    os.mknod(d / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a null device of its own, never /dev/null
    (d / "elsewhere").mkdir()
    os.symlink("elsewhere", d / "linked-dir")  # an export would land in elsewhere/ (and --force replace there)
    return d


MALFORMED = {
    "config-list": (["run", "--checkpoint", "D/list", "--layer", 0], "expected a JSON object, got list"),
    "config-string": (["run", "--checkpoint", "D/string", "--layer", 0], "expected a JSON object, got str"),
    "config-number": (["convert", "--checkpoint", "D/number", "--output", "D/o.safetensors"],
                      "expected a JSON object, got int"),
    "negative-eps": (["run", "--checkpoint", "D/eps", "--layer", 0], "expected rms_norm_eps a positive number"),
    "index-escapes": (["run", "--checkpoint", "D/escape", "--layer", 0], "expected shard file names inside"),
    "npz": (["run", "--checkpoint", "C", "--layer", 0, "--input", "D/x.npz"], "expected a .npy array, got a .npz"),
    "empty": (["run", "--checkpoint", "C", "--layer", 0, "--input", "D/empty.npy"], "expected a .npy array, got"),
    "huge-header": (["run", "--checkpoint", "C", "--layer", 0, "--input", "D/huge.npy"],
                    "expected a size that fits in memory"),
    "text": (["run", "--checkpoint", "C", "--layer", 0, "--input", "D/text.npy"], "expected a .npy array"),
    "object": (["run", "--checkpoint", "C", "--layer", 0, "--input", "D/obj.npy"], "expected a float array"),
    "folder-input": (["run", "--checkpoint", "C", "--layer", 0, "--input", "D"],
                     "input: expected a regular file, got a folder at"),
    "huge-tokens": (["run", "--checkpoint", "C", "--layer", 0, "--tokens", 10 ** 13],
                    "--tokens: expected a size that fits in memory"),
    "huge-static-shape": (["export", "--preset", "llama-7b", "--static-shape", "100000,100000", "--output-dir",
                           "D/out"], "--static-shape: expected a size that fits in memory"),
    "port-0": (["run", "--checkpoint", "C", "--layer", 0, "--tp-size", 2, "--master-port", 0],
               "--master-port: expected a port in 1..65535, got 0"),
    "port-70000": (["run", "--checkpoint", "C", "--layer", 0, "--tp-size", 2, "--master-port", 70000],
                   "--master-port: expected a port in 1..65535, got 70000"),
    "repeat-0": (["run", "--checkpoint", "C", "--layer", 0, "--repeat", 0], "--repeat: expected an integer >= 1, got 0"),
    "layers-empty": (["convert", "--checkpoint", "C", "--output", "D/o.safetensors", "--layers", ""],
                     "--layers: expected A-B or N, got ''"),
    "ascend-on-cpu": (["run", "--checkpoint", "C", "--layer", 0, "--backend", "ascend"],
                      "--backend ascend: expected a backend that runs on this machine's device CPU"),
    "fifo-input": (["run", "--checkpoint", "C", "--layer", 0, "--input", "D/fifo.npy"],
                   "input: expected a regular file, got a FIFO at"),
    "symlink-loop-input": (["run", "--checkpoint", "C", "--layer", 0, "--input", "D/loop.npy"],
                           "input: expected a regular file, got a symlink loop at"),
    "fifo-config": (["run", "--checkpoint", "D/fifo-config", "--layer", 0],
                    "checkpoint: expected a regular file, got a FIFO at"),
    "fifo-model": (["convert", "--checkpoint", "D/fifo-model", "--output", "D/o.safetensors"],
                   "checkpoint: expected a regular file, got a FIFO at"),
    "fifo-model-run": (["run", "--checkpoint", "D/fifo-model", "--layer", 0],
                       "checkpoint: expected a regular file, got a FIFO at"),
    "symlink-loop-checkpoint": (["run", "--checkpoint", "D/loop.npy", "--layer", 0],
                                "checkpoint: expected a folder, got"),
    "device-output": (["run", "--checkpoint", "C", "--layer", 0, "--output", "D/null", "--force"],
                      "output: expected a new name or a regular file, got a character device at"),
    "fifo-output": (["run", "--checkpoint", "C", "--layer", 0, "--output", "D/fifo-out", "--force"],
                    "output: expected a new name or a regular file, got a FIFO at"),
    "fifo-convert-output": (["convert", "--checkpoint", "C", "--output", "D/fifo-out", "--force"],
                            "output: expected a new name or a regular file, got a FIFO at"),
    "symlink-output": (["run", "--checkpoint", "C", "--layer", 0, "--output", "D/loop.npy", "--force"],
                       "output: expected a new name or a regular file, got a symlink at"),
    "empty-output": (["run", "--checkpoint", "C", "--layer", 0, "--output", ""],
                     "output: expected a file name, got an empty string"),
    "empty-convert-output": (["convert", "--checkpoint", "C", "--output", ""],
                             "output: expected a file name, got an empty string"),
    "empty-input": (["run", "--checkpoint", "C", "--layer", 0, "--input", ""],
                    "input: expected a .npy file name, got an empty string"),
    "empty-output-dir": (["export", "--preset", "tiny", "--output-dir", ""],
                         "--output-dir: expected a folder name, got an empty string"),
    "symlinked-output-dir": (["export", "--preset", "tiny", "--output-dir", "D/linked-dir", "--force"],
                             "--output-dir: expected a folder that is not a symbolic link, got"),
    # an option that takes effect only with another is refused without it, never silently ignored
    "dispatch-without-ep": (["run", "--checkpoint", "C", "--layer", 0, "--dispatch", "sharded"],
                            "--dispatch: expected only with --ep-size K > 1, got it with --ep-size 1"),
    "export-dispatch-without-ep": (["export", "--preset", "tiny", "--output-dir", "D/out", "--dispatch", "sharded"],
                                   "--dispatch: expected only with --ep-size K > 1, got it with --ep-size 1"),
    "export-port-without-ep": (["export", "--preset", "tiny", "--output-dir", "D/out", "--master-port", 8118],
                               "--master-port: expected only with --ep-size K > 1, got it with --ep-size 1"),
    "port-without-ranks": (["run", "--checkpoint", "C", "--layer", 0, "--master-port", 8118],
                           "--master-port: expected only with --tp-size or --ep-size K > 1, got it with one process"),
    "log-dir-without-ranks": (["run", "--checkpoint", "C", "--layer", 0, "--log-dir", "D/logs"],
                              "--log-dir: expected only with --tp-size or --ep-size K > 1, got it with one process"),
    "tokens-with-input": (["run", "--checkpoint", "C", "--layer", 0, "--input", "D/x.npz", "--tokens", 4],
                          "--tokens: expected only without --input (it sets the tokens), got it with --input"),
    "seed-with-input": (["run", "--checkpoint", "C", "--layer", 0, "--input", "D/x.npz", "--seed", 4],
                        "--seed: expected only without --input (it seeds random tokens), got it with --input"),
    "open-layer-range": (["convert", "--checkpoint", "C", "--output", "D/o.safetensors", "--layers", "1-"],
                         "--layers: expected A-B or N, got '1-'"),
    "huge-export-layers": (["export", "--preset", "small", "--layers", "0-100000", "--output-dir", "D/out"],
                           "--layers: expected a size that fits in memory"),
    "bench-tokens": (["bench", "--preset", "tiny", "--tokens", -1], "--tokens: expected integers >= 1, got -1"),
    "bench-rounds": (["bench", "--preset", "tiny", "--rounds", 0], "--rounds: expected integers >= 1, got 0"),
    "bench-layers": (["bench", "--preset", "tiny", "--layers", 0], "--layers: expected integers >= 1, got 0"),
    "bench-peer": (["bench", "--preset", "tiny", "--peer-python", "/nonexistent/python"],
                   "--peer-python: expected an executable Python"),
    "bench-choice": (["bench", "--preset", "gpt-9"], "invalid choice: 'gpt-9'"),
    "bench-settle": (["bench", "--preset", "tiny", "--settle", "nan"],
                     "--settle: expected seconds in [0, 60], got 'nan'"),
}


@pytest.fixture(scope="module")
def malformed_runs(bad_inputs, ckpt, tmp_path_factory):
    """Every MALFORMED command, in one process (conftest.cli_batch), each from an empty working directory of its
    own, bad_inputs watched after each: ({case: its Ran}, {case: its working directory}, bad_inputs' entries
    before)."""
    root, before = tmp_path_factory.mktemp("malformed"), sorted(os.listdir(bad_inputs))
    cases, cwds = [], {}
    for case, (args, _) in MALFORMED.items():
        cwds[case] = root / case
        cwds[case].mkdir()
        args = [ckpt if a == "C" else str(bad_inputs) if a == "D" else
                f"{bad_inputs}/{a[2:]}" if isinstance(a, str) and a.startswith("D/") else a for a in args]
        cases.append({"argv": args, "cwd": cwds[case], "watch": [bad_inputs, cwds[case]]})
    return dict(zip(MALFORMED, cli_batch(cases, timeout=900))), cwds, before


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_input_exits_2_with_one_line_before_any_work(malformed_runs, bad_inputs, case):
    runs, cwds, before = malformed_runs
    r = runs[case]
    one_line(r, 2, MALFORMED[case][1])
    assert r.stderr.count(": expected") <= 1  # one message, not one wrapped in another
    after = r.watched[str(bad_inputs)]  # right after this command
    assert sorted(after) == before and r.watched[str(cwds[case])] == {}
    assert after["null"] == "c" and after["fifo-out"] == "p"  # neither replaced (a character device, a FIFO still)


def test_akg_runs_with_the_inputs_static_shape_and_leaves_the_working_directory_clean(ckpt, tmp_path, tmpenv):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((2, 3, H)).astype(np.float32))
    (tmp_path / "cwd").mkdir()
    r = cli("run", "--checkpoint", ckpt, "--layer", 0, "--input", tmp_path / "x.npy", "--output",
            tmp_path / "y.npy", "--backend", "akg", cwd=tmp_path / "cwd", env=tmpenv)
    assert r.returncode == 0, r.stderr[-2000:]
    r2 = cli("run", "--checkpoint", ckpt, "--layer", 0, "--input", tmp_path / "x.npy", "--output",
             tmp_path / "z.npy", "--backend", "composite", cwd=tmp_path / "cwd", env=tmpenv)
    assert r2.returncode == 0
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), np.load(tmp_path / "z.npy"), atol=1e-5, rtol=1e-5)
    assert os.listdir(tmp_path / "cwd") == []  # AKG's akg_kernel_meta, dsa_transfrom.log, ... went elsewhere


def test_an_error_after_the_progress_bar_starts_on_its_own_line(ckpt, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    # stderr a pipe (a log, CI): no bar, the error is the one line
    one_line(cli("convert", "--checkpoint", broken, "--output", tmp_path / "o.safetensors"), 2,
             "ms-swiglu: error: checkpoint: expected tensor model.layers.1.mlp.up_proj.weight")
    assert not (tmp_path / "o.safetensors").exists()
    # stderr a terminal: the bar, then the error on a line of its own
    import pty  # noqa: PLC0415

    leader, follower = pty.openpty()
    with os.fdopen(leader, "rb", buffering=0) as terminal:
        proc = subprocess.run([EXE, "convert", "--checkpoint", str(broken), "--output", str(tmp_path / "o.safetensors")],
                              stdout=subprocess.DEVNULL, stderr=follower, timeout=600)
        os.close(follower)
        shown = b""
        with contextlib.suppress(OSError):  # (EIO once the child's side is closed and read to its end)
            while chunk := terminal.read(4096):
                shown += chunk
    lines = shown.decode().replace("\r\n", "\n").split("\n")
    assert proc.returncode == 2 and "1/3 layers" in lines[0] and "error" not in lines[0], lines
    assert lines[1].startswith("ms-swiglu: error: checkpoint: expected tensor model.layers.1.mlp.up_proj.weight")
    assert not (tmp_path / "o.safetensors").exists()


BUG = r"""
import sys
from ms_swiglu import cli
cli.open_checkpoint = lambda path: 1 / 0  # a bug inside the package
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_bug_is_shown_as_one_with_its_traceback_kept(ckpt, tmp_path, tmpenv):
    r = subprocess.run([sys.executable, "-c", BUG, "run", "--checkpoint", ckpt, "--layer", "0"], capture_output=True,
                       text=True, timeout=300, env=tmpenv)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "internal error: ZeroDivisionError" in lines[0], r.stderr
    log = lines[0].rsplit("(traceback: ", 1)[1].rstrip(")")
    assert log.startswith(str(tmp_path / "tmp")) and "Traceback" in open(log).read()


# ---- 5. leftovers --------------------------------------------------------------------------------------------

def test_a_killed_converts_temporaries_are_removed_by_the_next(ckpt, tmp_path):
    stale = tmp_path / ".o.safetensors.9999991.abc.tmp"  # a dead process's
    stale.write_bytes(b"partial")
    live = tmp_path / f".o.safetensors.{os.getpid()}.abc.tmp"  # a running process's: kept
    live.write_bytes(b"in progress")
    r = cli("convert", "--checkpoint", ckpt, "--output", tmp_path / "o.safetensors", "--layers", "0")
    assert r.returncode == 0, r.stderr
    assert not stale.exists() and live.exists()
    assert read_safetensors(str(tmp_path / "o.safetensors"))[1] == "float32"


# ---- 6. the environment and odd paths ----------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs (needs root and mount, as on the development and CI hosts)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                      capture_output=True).returncode:
        pytest.skip("needs mount(8) as root for a small tmpfs, to fill a disk")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_is_named_in_one_line_and_leaves_nothing(ckpt, small_disk):
    r = cli("run", "--checkpoint", ckpt, "--layer", 0, "--tokens", 1000, "--output", small_disk / "y.npy")
    one_line(r, 1, f"No space left on device: '{small_disk / 'y.npy'}'")  # 128 kB of output, 64 kB of disk
    assert os.listdir(small_disk) == []


def test_export_takes_any_folder_name_a_user_can_create(tmp_path):
    """A space, non-ASCII letters, and bytes that are not UTF-8: mindspore.export and mindspore.load refuse all
    three in a file name; the export, its messages and the kit's verify_on_device.py (run from the folder and
    given it) do not."""
    for name in ("my exports é", os.fsdecode(b"out-\xff")):
        out = tmp_path / name
        r = subprocess.run([EXE, "export", "--preset", "tiny", "--output-dir", os.fsencode(out), "--target",
                            "portable"], capture_output=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        assert whole(out) and b"wrote " in r.stdout
        for args, cwd in (([], out), ([os.fsencode(out)], tmp_path)):
            v = subprocess.run([sys.executable, os.fsencode(out / "verify_on_device.py"), *args, "--device", "CPU",
                                "--calls", "0"], capture_output=True, timeout=600, cwd=cwd)
            assert v.returncode == 0 and b"2 of 2 cases pass" in v.stdout, v.stdout + v.stderr[-2000:]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = subprocess.run([EXE, "run", "--checkpoint", os.fsencode(tmp_path / os.fsdecode(b"missing-\xff")), "--layer",
                        "0"], capture_output=True, timeout=600, env=dict(os.environ, TMPDIR=str(tmp)))
    assert r.returncode == 2 and r.stderr.count(b"\n") == 1 and b"missing-\\udcff" in r.stderr, r.stderr


def test_a_bugs_log_keeps_arguments_that_are_not_utf8(tmp_path, monkeypatch):
    from ms_swiglu import cli as cli_module

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(cli_module.tempfile, "tempdir", None)
    monkeypatch.setattr(sys, "argv", ["ms-swiglu", "run", "--checkpoint", os.fsdecode(b"ck-\xff")])
    try:
        raise RuntimeError("a bug")
    except RuntimeError as exc:
        path = cli_module._log_bug(exc)
    text = open(path).read()
    assert path.startswith(str(tmp_path)) and "ck-\\udcff" in text and "RuntimeError: a bug" in text


def test_no_tokens_through_every_moe_family_backend_quantization_and_tp_size(tmp_path):
    """An input with no token ([1, 0, H] and [0, H]) gives [..., 0, H] through run, as a dense layer does: MoE
    families (softmax and sigmoid-group routers, shared experts), backends cpu and composite, bfloat16 and an int8
    conversion, and --tp-size 2 (every rank returns before any collective)."""
    moe = make_checkpoint(tmp_path / "ds", model_type="deepseek_v3", hidden=H, inter=48, moe_inter=16, experts=8,
                          top_k=2, layers=2, sparse=[1], shared_inter=16, seed=3,
                          config_extra={"first_k_dense_replace": 1, "n_shared_experts": 1, "n_group": 4,
                                        "topk_group": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
                                        "scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1})
    assert moe
    make_checkpoint(tmp_path / "qw", model_type="qwen2_moe", hidden=H, inter=48, moe_inter=16, experts=4, top_k=2,
                    layers=1, shared_inter=32, seed=4, config_extra={"norm_topk_prob": False,
                                                                    "shared_expert_intermediate_size": 32})
    make_checkpoint(tmp_path / "mx", model_type="mixtral", hidden=H, inter=48, experts=4, top_k=2, layers=1, seed=5)
    convert = ["convert", "--checkpoint", tmp_path / "mx", "--output", tmp_path / "mx8.safetensors", "--quantize",
               "int8"]
    runs = [("ds", 1, "cpu", []), ("ds", 1, "composite", ["--dtype", "bfloat16"]), ("qw", 0, "cpu", []),
            ("qw", 0, "composite", []), ("mx8.safetensors", 0, "cpu", []), ("mx", 0, "auto", ["--tp-size", 2])]
    cases = []  # (source, backend, shape, output, argv): the commands run in one process (conftest.cli_batch)
    for shape, chosen in (((1, 0, H), runs), ((0, H), runs[:1] + runs[-1:])):
        x = tmp_path / f"x{len(shape)}.npy"
        np.save(x, np.zeros(shape, np.float32))
        for source, layer, backend, extra in chosen:
            out = tmp_path / f"y-{source}-{backend}-{len(shape)}.npy"
            cases.append((source, backend, shape, out, ["run", "--checkpoint", tmp_path / source, "--layer", layer,
                                                        "--input", x, "--backend", backend, "--output", out, *extra]))
    r, *done = cli_batch([convert] + [argv for *_, argv in cases])
    assert r.returncode == 0, r.stderr
    for (source, backend, shape, out, _), r in zip(cases, done):
        assert r.returncode == 0, (source, backend, shape, r.stderr[-2000:])
        assert np.load(out).shape == shape, (source, backend)
