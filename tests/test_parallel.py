"""Tensor parallelism: rank-local weights read from the checkpoint, and real msrun jobs of 2 (and 4) CPU ranks."""
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

from ms_swiglu import cli, load_dense_layer, load_mlp, load_moe_layer, shard_down, shard_packed
from conftest import cli_batch, job_processes
from hf_checkpoint import make_checkpoint

H, I, E = 32, 48, 4
CLI = [os.path.join(os.path.dirname(sys.executable), "ms-swiglu")]


@pytest.fixture(scope="module")
def dense(tp_ckpt):
    return tp_ckpt  # conftest's: the checkpoint of the shared msrun jobs (hidden H, intermediate I, two layers)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tp_moe")
    return str(folder), make_checkpoint(folder, model_type="mixtral", hidden=H, inter=I, experts=E, layers=1, seed=22)


@pytest.mark.parametrize("tp", [2, 4])
def test_each_rank_reads_its_own_gate_and_up_slices(dense, tp):
    folder, stored = dense
    p = "model.layers.1.mlp."
    gate, up, down = stored[p + "gate_proj.weight"], stored[p + "up_proj.weight"], stored[p + "down_proj.weight"]
    full, _ = load_dense_layer(folder, 1)
    blk = I // tp
    for rank in range(tp):
        local, _ = load_dense_layer(folder, 1, tp_size=tp, rank=rank)
        want = np.concatenate([gate[rank * blk:(rank + 1) * blk], up[rank * blk:(rank + 1) * blk]])
        np.testing.assert_array_equal(local["gate_up"], want)  # [gate_r; up_r]: not half of gate, not rank 0's
        np.testing.assert_array_equal(local["gate_up"], shard_packed(full["gate_up"], tp, rank))
        np.testing.assert_array_equal(local["down"], down[:, rank * blk:(rank + 1) * blk])
        np.testing.assert_array_equal(local["down"], shard_down(full["down"], tp, rank))
    mlp = load_mlp(folder, 1, tp_size=tp, rank=tp - 1, backend="composite")
    assert tuple(mlp.gate_up_proj.weight.shape) == (2 * I // tp, H) and tuple(mlp.down_proj.weight.shape) == (H, I // tp)


def test_each_rank_reads_its_own_expert_slices(mixtral):
    folder, stored = mixtral
    full, _ = load_moe_layer(folder, 0)
    for rank in range(2):
        local, _ = load_moe_layer(folder, 0, tp_size=2, rank=rank)
        np.testing.assert_array_equal(local["router"], full["router"])
        for e in range(E):
            np.testing.assert_array_equal(local["gate_up"][e], shard_packed(full["gate_up"][e], 2, rank))
            np.testing.assert_array_equal(local["down"][e], shard_down(full["down"][e], 2, rank))
            w1 = stored[f"model.layers.0.block_sparse_moe.experts.{e}.w1.weight"]
            np.testing.assert_array_equal(local["gate_up"][e][: I // 2], w1[rank * I // 2:(rank + 1) * I // 2])


def _run(folder, x_path, out, *extra, env=None):
    return subprocess.run(CLI + ["run", "--checkpoint", folder, "--layer", "0", "--input", str(x_path),
                                 "--output", str(out), "--dtype", "float32", *map(str, extra)],
                          capture_output=True, text=True, timeout=600, env=env)


CASES = [("dense", 2), ("moe", 2), ("dense", 4)]


@pytest.fixture(scope="module")
def one_process(dense, mixtral, tp_success, tmp_path_factory):
    """{case: (input, the output of `ms-swiglu run` without --tp-size)}, the three runs in one process
    (conftest.cli_batch); dense 2's input is that of conftest's shared job."""
    folder, found, argv = tmp_path_factory.mktemp("one_process"), {}, []
    for kind, tp in CASES:
        if (kind, tp) == ("dense", 2):
            x = tp_success.x
        else:
            x = folder / f"x-{kind}-{tp}.npy"
            np.save(x, np.random.default_rng(tp).standard_normal((3, 5, H)).astype(np.float32))
        found[kind, tp] = (x, folder / f"y1-{kind}-{tp}.npy")
        argv.append(["run", "--checkpoint", (dense if kind == "dense" else mixtral)[0], "--layer", 0, "--input", x,
                     "--output", found[kind, tp][1], "--dtype", "float32"])
    for r in cli_batch(argv):
        assert r.returncode == 0, r.stderr
    return found


@pytest.mark.parametrize("kind, tp", CASES)
def test_msrun_ranks_equal_one_process(dense, mixtral, one_process, tp_success, tmp_path, kind, tp):
    folder = (dense if kind == "dense" else mixtral)[0]
    x, y1 = one_process[kind, tp]
    if (kind, tp) == ("dense", 2):  # conftest's shared msrun job: this input, dense's layer 0, float32
        many, yp = tp_success.result, tp_success.y
    else:
        many, yp = _run(folder, x, tmp_path / "yp.npy", "--tp-size", tp), tmp_path / "yp.npy"
    assert many.returncode == 0, many.stderr
    assert f"tp {tp}" in many.stdout
    np.testing.assert_allclose(np.load(yp), np.load(y1), atol=1e-5, rtol=1.3e-6)
    assert not job_processes(folder)


def test_a_crashed_worker_is_reported_and_nothing_is_left(dense, tp_failure):
    r = tp_failure.result  # conftest's: rank 1 of tests/tp_fault_worker.py fails (TP_FAULT_RANK=1), --output y.npy
    assert r.returncode == 1
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "worker 1 failed" in lines[0] and "injected failure" in lines[0], r.stderr
    log = re.search(r"\(log: (.*)\)$", lines[0]).group(1)
    assert os.path.exists(log)
    assert not job_processes(dense[0])
    assert not tp_failure.y.exists()


def test_ctrl_c_ends_every_worker(dense, tp_interrupted):
    assert len(tp_interrupted.ranks_seen) >= 2  # conftest's: SIGINT once both ranks ran
    assert tp_interrupted.returncode == 130 and "interrupted" in tp_interrupted.stderr
    assert not job_processes(dense[0])


def test_tp_size_not_dividing_is_rejected_before_any_worker(dense, tmp_path, capsys):
    r = _run(dense[0], "", tmp_path / "y.npy", "--tp-size", 5)
    assert r.returncode == 2 and "expected a positive divisor of intermediate_size 48, got 5" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_port_in_use_and_missing_msrun(dense, tmp_path, capsys, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert cli.main(["run", "--checkpoint", dense[0], "--layer", "0", "--tp-size", "2",
                         "--master-port", str(port)]) == 2
    assert f"--master-port: expected a free port, got {port} (in use)" in capsys.readouterr().err
    import shutil

    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    assert cli.main(["run", "--checkpoint", dense[0], "--layer", "0", "--tp-size", "2"]) == 2
    assert "msrun: expected MindSpore's launcher on PATH" in capsys.readouterr().err


def test_tp_workers_never_import_from_the_working_directory(tp_success):
    """conftest's shared msrun job (its ranks) runs from a working directory whose glob, json, numpy, subprocess,
    safetensors and mindspore modules leave a mark if imported."""
    from conftest import pwned

    assert tp_success.result.returncode == 0, tp_success.result.stderr[-2000:]
    assert pwned(tp_success.cwd) == []


def test_tp_job_folders_are_removed_or_kept_for_diagnosis_and_pruned(tp_success, tp_failure):
    """conftest's shared msrun jobs: a success leaves nothing in $TMPDIR (no job folder, nor their empty parent
    ms-swiglu-tp); a failed job keeps its logs (not its input) and prunes the earlier jobs it found to the newest
    three failed ones (no killed job's folder)."""
    from conftest import OLD_JOBS

    assert tp_success.result.returncode == 0 and not os.path.exists(tp_success.tmp / "ms-swiglu-tp")
    r, jobs = tp_failure.result, tp_failure.jobs  # its $TMPDIR held OLD_JOBS and KILLED_JOB beforehand
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and len(lines) == 1 and "worker 1 failed" in lines[0], r.stderr[-2000:]
    log = r.stderr.strip().rsplit("(log: ", 1)[1].rstrip(")")
    assert log.startswith(str(jobs)) and os.path.exists(log)
    job = os.path.basename(os.path.dirname(os.path.dirname(log)))
    assert sorted(os.listdir(jobs)) == sorted(OLD_JOBS[2:] + [job])  # the newest three earlier failed jobs
    assert os.listdir(jobs / job) == ["logs"]  # the logs only: neither the input nor the running mark


def test_ctrl_c_leaves_no_job_folder(tp_interrupted):
    """conftest's shared Ctrl-C to a tensor-parallel run once its ranks run: no job folder, nor their parent."""
    assert tp_interrupted.returncode == 130 and "interrupted" in tp_interrupted.stderr
    assert not os.path.exists(tp_interrupted.jobs)
