"""`ms-swiglu run` and `ms-swiglu convert` as a user runs them: subprocesses on HF-layout checkpoints."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ms_swiglu.checkpoint import read_safetensors
from conftest import TOL, cli_batch, ref_swiglu
from hf_checkpoint import make_checkpoint

H, I = 32, 48
CLI = [os.path.join(os.path.dirname(sys.executable), "ms-swiglu")]


def cli(*args):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=300)


def ref_mlp(x, stored, layer):
    p = f"model.layers.{layer}.mlp."
    g, u, d = (stored[p + n].astype(np.float64) for n in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"))
    return ref_swiglu(np.concatenate([x @ g.T, x @ u.T], axis=-1)) @ d.T


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    return {dtype: (str(root / dtype), make_checkpoint(root / dtype, dtype=dtype, shards=2 if dtype == "bfloat16"
                                                          else 1, layers=3, seed=7)) for dtype in TOL}


@pytest.fixture(scope="module")
def runs(ckpts, tmp_path_factory):
    """{dtype: (folder, {name: Ran})}: per checkpoint dtype, in one process (conftest.cli_batch), "x": layer 2 on
    x.npy ([2, 5, H]) into y.npy (backend cpu), "tokens": layer 0 on 7 seeded random tokens in float32 compute
    into z.npy; for float32 also "relative": the same from the dtype's folder with relative paths (rel.npy)."""
    root, cases, names = tmp_path_factory.mktemp("runs"), [], []
    x = np.random.default_rng(1).standard_normal((2, 5, H)).astype(np.float32)
    for dtype, (folder, _) in ckpts.items():
        (root / dtype).mkdir()
        np.save(root / dtype / "x.npy", x)
        cases += [["run", "--checkpoint", folder, "--layer", 2, "--input", root / dtype / "x.npy", "--output",
                   root / dtype / "y.npy", "--backend", "cpu"],
                  ["run", "--checkpoint", folder, "--layer", 0, "--tokens", 7, "--dtype", "float32", "--output",
                   root / dtype / "z.npy"]]
        names += [(dtype, "x"), (dtype, "tokens")]
        if dtype == "float32":  # paths relative to the working folder (the run itself works in a scratch one)
            cases.append({"argv": ["run", "--checkpoint", os.path.relpath(folder, root / dtype), "--layer", "0",
                                   "--tokens", "7", "--output", "rel.npy"], "cwd": root / dtype})
            names.append((dtype, "relative"))
    found = {dtype: (root / dtype, {}) for dtype in ckpts}
    for (dtype, name), r in zip(names, cli_batch(cases)):
        found[dtype][1][name] = r
    return found


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_run_matches_numpy_at_several_token_counts(ckpts, runs, dtype):
    _, stored = ckpts[dtype]
    out, done = runs[dtype]
    x = np.load(out / "x.npy")
    r = done["x"]
    assert r.returncode == 0, r.stderr
    assert f"dtype {dtype}" in r.stdout and "backend cpu" in r.stdout and "device CPU" in r.stdout
    assert "latency" in r.stdout and "-> output [2, 5, 32]" in r.stdout
    y = np.load(out / "y.npy")
    assert y.dtype == np.float32 and y.shape == (2, 5, H)
    if dtype == "float32":
        np.testing.assert_allclose(y, ref_mlp(x.astype(np.float64), stored, 2), atol=1e-5, rtol=1.3e-6)
    else:
        # Compute in `dtype` rounds x, gate_up, the activation and the output: compare with the float64 MLP of
        # the rounded input at 4x the one-rounding tolerance (four roundings in a row).
        atol, rtol = TOL[dtype]
        np.testing.assert_allclose(y, ref_mlp(_round(x, dtype), stored, 2), atol=4 * atol, rtol=4 * rtol)
    # seeded random tokens, cast to float32 compute
    r = done["tokens"]
    assert r.returncode == 0, r.stderr
    x7 = np.random.default_rng(0).standard_normal((7, H)).astype(np.float32)  # what --tokens 7 --seed 0 runs
    np.testing.assert_allclose(np.load(out / "z.npy"), ref_mlp(x7.astype(np.float64), stored, 0),
                               atol=1e-5, rtol=1.3e-6)
    if dtype == "float32":  # paths relative to the working folder
        r = done["relative"]
        assert r.returncode == 0, r.stderr
        np.testing.assert_array_equal(np.load(out / "rel.npy"), np.load(out / "z.npy"))


def _round(x, dtype):
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float64)
    u = x.astype(np.float32).view(np.uint32)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32).astype(np.float64)


def test_convert_tp2_writes_rank_files(ckpts, tmp_path):
    folder, stored = ckpts["float32"]
    r = cli("convert", "--checkpoint", folder, "--output", tmp_path / "packed.safetensors", "--layers", "1-2",
            "--tp-size", 2)
    assert r.returncode == 0, r.stderr
    assert "layers" not in r.stderr  # no progress bar where stderr is a pipe (test_reliability: on a terminal)
    blk = I // 2
    for rank in range(2):
        tensors, dtype = read_safetensors(str(tmp_path / f"packed-tp{rank}-of-2.safetensors"))
        assert dtype == "float32" and len(tensors) == 4
        gu = tensors["model.layers.2.mlp.gate_up_proj.weight"]
        np.testing.assert_array_equal(gu[:blk], stored["model.layers.2.mlp.gate_proj.weight"][rank * blk:(rank + 1) * blk])
        np.testing.assert_array_equal(gu[blk:], stored["model.layers.2.mlp.up_proj.weight"][rank * blk:(rank + 1) * blk])


def _bad(tmp, ckpt):
    """name -> (args, message) of each bad input."""
    x_bad_dim, x_int, not_npy = tmp / "xd.npy", tmp / "xi.npy", tmp / "x.txt"
    np.save(x_bad_dim, np.ones((3, H + 1), np.float32))
    np.save(x_int, np.ones((3, H), np.int32))
    not_npy.write_text("hello")
    base = ["run", "--checkpoint", ckpt, "--layer", 0]
    return {
        "missing-folder": (["run", "--checkpoint", tmp / "nope", "--layer", 0], "expected a folder"),
        "missing-config": (["run", "--checkpoint", tmp / "noconfig", "--layer", 0], "config.json, found none"),
        "model-type": (["run", "--checkpoint", tmp / "gpt2", "--layer", 0], "got 'gpt2'"),
        "layer-range": (["run", "--checkpoint", ckpt, "--layer", 9], "expected 0..2 (num_hidden_layers=3), got 9"),
        "missing-tensor": (["run", "--checkpoint", tmp / "notensor", "--layer", 0], "expected tensor model.layers.0"),
        "shape": (["run", "--checkpoint", tmp / "badshape", "--layer", 0], "from config.json, got"),
        "truncated": (["run", "--checkpoint", tmp / "truncated", "--layer", 0], "expected a valid safetensors file"),
        "input-dim": (base + ["--input", x_bad_dim, "--output", tmp / "o1.npy"], "expected shape [..., 32]"),
        "input-int": (base + ["--input", x_int, "--output", tmp / "o2.npy"], "expected a float array, got dtype int32"),
        "input-not-npy": (base + ["--input", not_npy, "--output", tmp / "o3.npy"], "expected a .npy array"),
        "dtype": (base + ["--dtype", "int8"], "invalid choice: 'int8'"),
        "out-folder": (base + ["--output", tmp / "no" / "y.npy"], "expected an existing folder"),
        "out-readonly": (base + ["--output", tmp / "ro" / "y.npy"], "expected a writable folder"),
        "tp-size": (["convert", "--checkpoint", ckpt, "--output", tmp / "c.safetensors", "--tp-size", 5],
                    "expected a positive divisor of intermediate_size 48, got 5"),
    }


@pytest.fixture(scope="module")
def bad_folder(tmp_path_factory, ckpts):
    tmp = tmp_path_factory.mktemp("bad")
    ckpt = ckpts["float32"][0]
    for name in ("noconfig", "gpt2", "notensor", "badshape", "truncated"):  # each a copy with one defect
        shutil.copytree(ckpt, tmp / name)
    os.remove(tmp / "noconfig" / "config.json")
    for name, edit in (("gpt2", ('"llama"', '"gpt2"')), ("badshape", ('"intermediate_size": 48', '"intermediate_size": 40'))):
        p = tmp / name / "config.json"
        p.write_text(p.read_text().replace(*edit))
    _drop_tensor(tmp / "notensor", "model.layers.0.mlp.up_proj.weight")
    st = tmp / "truncated" / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-64])
    (tmp / "ro").mkdir()
    os.chmod(tmp / "ro", 0o555)
    return tmp, ckpt


def _drop_tensor(folder, name):
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors[name]
    save_file(tensors, str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def bad_runs(bad_folder):
    """{case: (its Ran, its message)}: every bad input of _bad in one process (conftest.cli_batch), bad_folder
    watched after each; and bad_folder's entries before them."""
    tmp, ckpt = bad_folder
    bad = _bad(tmp, ckpt)
    if os.geteuid() == 0:
        # root writes into a 0555 folder, so make the target a read-only file system path instead
        bad["out-readonly"] = (["run", "--checkpoint", ckpt, "--layer", 0, "--output", "/proc/ms_swiglu_y.npy"],
                               "expected a writable folder")
    before = set(os.listdir(tmp))
    done = cli_batch([{"argv": args, "watch": [tmp]} for args, _ in bad.values()])
    return {case: (r, message) for (case, (_, message)), r in zip(bad.items(), done)}, before


@pytest.mark.parametrize("case", ["missing-folder", "missing-config", "model-type", "layer-range", "missing-tensor",
                                  "shape", "truncated", "input-dim", "input-int", "input-not-npy", "dtype",
                                  "out-folder", "out-readonly", "tp-size"])
def test_bad_input_exit_2_one_line(bad_folder, bad_runs, case):
    (r, message), before = bad_runs[0][case], bad_runs[1]
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert set(r.watched[str(bad_folder[0])]) == before, "a failed run left a file behind"


def test_existing_output_is_kept_without_force(ckpts, tmp_path):
    folder, _ = ckpts["float32"]
    out = tmp_path / "y.npy"
    out.write_bytes(b"precious")
    r = cli("run", "--checkpoint", folder, "--layer", 0, "--output", out)
    assert r.returncode == 2 and "use --force" in r.stderr and out.read_bytes() == b"precious"
    r = cli("run", "--checkpoint", folder, "--layer", 0, "--output", out, "--force", "--tokens", 2)
    assert r.returncode == 0, r.stderr
    assert np.load(out).shape == (2, H)


def test_nan_input_propagates(ckpts, tmp_path):
    folder, _ = ckpts["float32"]
    x = np.ones((3, H), np.float32)
    x[1, 4] = np.nan
    np.save(tmp_path / "x.npy", x)
    r = cli("run", "--checkpoint", folder, "--layer", 0, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy")
    assert r.returncode == 0, r.stderr
    y = np.load(tmp_path / "y.npy")
    assert np.isnan(y[1]).all() and np.isfinite(y[[0, 2]]).all()


def test_convert_mixtral_packs_each_expert(tmp_path):
    stored = make_checkpoint(tmp_path / "mix", model_type="mixtral", experts=4, layers=2, dtype="float16")
    r = cli("convert", "--checkpoint", tmp_path / "mix", "--output", tmp_path / "moe.safetensors", "--tp-size", 2)
    assert r.returncode == 0, r.stderr
    blk, p = I // 2, "model.layers.1.block_sparse_moe."
    tensors, dtype = read_safetensors(str(tmp_path / "moe-tp1-of-2.safetensors"))
    assert dtype == "float16"
    gu, down = tensors[p + "experts.gate_up_proj.weight"], tensors[p + "experts.down_proj.weight"]
    assert gu.shape == (4, I, H) and down.shape == (4, H, blk)
    for e in range(4):
        np.testing.assert_array_equal(gu[e, :blk], stored[f"{p}experts.{e}.w1.weight"][blk:])
        np.testing.assert_array_equal(gu[e, blk:], stored[f"{p}experts.{e}.w3.weight"][blk:])
        np.testing.assert_array_equal(down[e], stored[f"{p}experts.{e}.w2.weight"][:, blk:])
    np.testing.assert_array_equal(tensors[p + "gate.weight"], stored[p + "gate.weight"])
