"""PackedMoE: the whole block (routing included) against a NumPy reference; sparse dispatch; Mixtral loading."""
import json
import os
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest

from ms_swiglu import PackedMoE, load_moe
from conftest import DTYPES, TOL, assert_close, to_f64, to_tensor
from hf_checkpoint import make_checkpoint

H, I, E, K = 16, 24, 8, 2


def rnd(a, dtype):
    """Round float64 values to `dtype` and back (the points where the block rounds)."""
    if dtype == "float32":
        return a.astype(np.float32).astype(np.float64)
    if dtype == "float16":
        return a.astype(np.float16).astype(np.float64)
    u = a.astype(np.float32).view(np.uint32)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32).astype(np.float64)


def ref_moe(x, router, gate_up, down, k, dtype="float32", renormalize=True):
    """float64 Mixtral block; rounds to `dtype` where the block does (GEMM outputs, activation, output)."""
    logits = rnd(x @ router.T, dtype)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :k]  # ties: lower expert index first
    w = np.take_along_axis(p, idx, -1)
    if renormalize:
        w /= w.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    inter = gate_up.shape[1] // 2
    for t in range(x.shape[0]):
        for j in range(k):
            e = idx[t, j]
            h = rnd(x[t] @ gate_up[e].T, dtype)
            act = rnd(h[:inter] / (1 + np.exp(-h[:inter])) * h[inter:], dtype)
            out[t] += w[t, j] * rnd(act @ down[e].T, dtype)
    return rnd(out, dtype), idx


def _moe(dtype="float32", seed=0, **kw):
    ms.set_seed(seed)
    moe = PackedMoE(H, I, E, K, dtype=DTYPES[dtype], backend="cpu", **kw)
    rng = np.random.default_rng(seed)
    moe.router.weight.set_data(ms.Tensor(rng.standard_normal((E, H)).astype(np.float32)).astype(DTYPES[dtype]))
    return moe


def _weights(moe):
    """router [E, H], gate_up [E, 2I, H], down [E, H, I] as float64."""
    return [to_f64(moe.router.weight), np.stack([to_f64(x.gate_up_proj.weight) for x in moe.experts]),
            np.stack([to_f64(x.down_proj.weight) for x in moe.experts])]


@pytest.mark.parametrize("tokens", [1, 3, 17, 64])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_block_matches_numpy(tokens, dtype, mode):
    moe = _moe(dtype, seed=tokens)
    x, x64 = to_tensor(np.random.default_rng(tokens).standard_normal((tokens, H)), dtype)
    expected, _ = ref_moe(x64, *_weights(moe), K, dtype)
    y = moe(x)
    assert y.dtype == DTYPES[dtype]
    if dtype == "float32":
        assert_close(y, expected, dtype, "MoE vs float64")
    else:
        # The reference rounds where the block rounds; float32 vs float64 GEMM sums can still move a rounding
        # by one ulp at each of the four rounding points, hence 4x the one-rounding tolerance.
        atol, rtol = TOL[dtype]
        np.testing.assert_allclose(to_f64(y), expected, atol=4 * atol, rtol=4 * rtol)


def test_ties_go_to_the_lower_expert(mode):
    moe = _moe()
    moe.router.weight.set_data(ms.Tensor(np.zeros((E, H), np.float32)))  # every expert scores the same
    x, x64 = to_tensor(np.random.default_rng(0).standard_normal((5, H)), "float32")
    expected, idx = ref_moe(x64, *_weights(moe), K)
    assert (idx == [0, 1]).all()
    assert_close(moe(x), expected, "float32", "ties")


def test_expert_with_no_token_single_token_and_every_expert(mode):
    moe = _moe(seed=3)
    router = moe.router.weight.asnumpy()
    router[E - 1] = -10.0 * np.abs(router).max()  # expert 7: never chosen for these inputs
    moe.router.weight.set_data(ms.Tensor(router))
    x, x64 = to_tensor(np.abs(np.random.default_rng(3).standard_normal((40, H))), "float32")
    expected, idx = ref_moe(x64, *_weights(moe), K)
    assert E - 1 not in idx
    assert_close(moe(x), expected, "float32", "expert without tokens")
    x1, x1_64 = to_tensor(np.random.default_rng(4).standard_normal((1, H)), "float32")
    assert_close(moe(x1), ref_moe(x1_64, *_weights(moe), K)[0], "float32", "single token")
    moe = _moe(seed=5)
    x, x64 = to_tensor(np.random.default_rng(5).standard_normal((64, H)), "float32")
    expected, idx = ref_moe(x64, *_weights(moe), K)
    assert set(idx.ravel()) == set(range(E))
    assert_close(moe(x), expected, "float32", "every expert")


def test_no_renormalisation_flag(mode):
    moe = _moe(seed=6, renormalize=False)
    x, x64 = to_tensor(np.random.default_rng(6).standard_normal((9, H)), "float32")
    assert_close(moe(x), ref_moe(x64, *_weights(moe), K, renormalize=False)[0], "float32", "no renormalise")


def test_dispatch_is_sparse():
    """Each expert runs on its own tokens only: the expert GEMMs see T * k rows in all, not T * E."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    moe = _moe(seed=7)
    rows = []
    for expert in moe.experts:
        original = expert.construct
        expert.construct = lambda xs, original=original: rows.append(xs.shape[0]) or original(xs)
    x, _ = to_tensor(np.random.default_rng(7).standard_normal((33, H)), "float32")
    moe(x)
    ms.set_context(mode=ms.GRAPH_MODE)
    assert len(rows) == E and sum(rows) == 33 * K, rows


def test_dynamic_token_count_one_compile():
    ms.set_context(mode=ms.GRAPH_MODE)
    moe = _moe(seed=8)
    moe.set_inputs(ms.Tensor(shape=[None, H], dtype=ms.float32))
    for t in (1, 5, 100):
        x, x64 = to_tensor(np.random.default_rng(t).standard_normal((t, H)), "float32")
        assert_close(moe(x), ref_moe(x64, *_weights(moe), K)[0], "float32", f"T={t}")
    assert len(moe.compile_cache) == 1


def test_bad_top_k():
    with pytest.raises(ValueError, match=r"top_k: expected 1..num_experts \(8\), got 9"):
        PackedMoE(H, I, E, 9)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixtral")
    return str(folder), make_checkpoint(folder, model_type="mixtral", hidden=H, inter=I, experts=E, top_k=K,
                                        layers=2, seed=9)


def _stored_weights(stored, layer):
    p = f"model.layers.{layer}.block_sparse_moe."
    router = stored[p + "gate.weight"].astype(np.float64)
    gate_up = np.stack([np.concatenate([stored[f"{p}experts.{e}.w1.weight"], stored[f"{p}experts.{e}.w3.weight"]])
                        for e in range(E)]).astype(np.float64)
    down = np.stack([stored[f"{p}experts.{e}.w2.weight"] for e in range(E)]).astype(np.float64)
    return router, gate_up, down


def test_load_moe_from_mixtral_checkpoint(mixtral):
    ms.set_context(mode=ms.GRAPH_MODE)
    folder, stored = mixtral
    moe = load_moe(folder, 1, backend="cpu")
    x, x64 = to_tensor(np.random.default_rng(1).standard_normal((6, H)), "float32")
    assert_close(moe(x), ref_moe(x64, *_stored_weights(stored, 1), K)[0], "float32", "Mixtral layer")


def test_cli_runs_the_moe_block(mixtral, tmp_path):
    folder, stored = mixtral
    x = np.random.default_rng(2).standard_normal((2, 7, H)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    cli = os.path.join(os.path.dirname(sys.executable), "ms-swiglu")
    r = subprocess.run([cli, "run", "--checkpoint", folder, "--layer", "0", "--input", str(tmp_path / "x.npy"),
                        "--output", str(tmp_path / "y.npy")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "MoE 8 experts top-2" in r.stdout
    expected = ref_moe(x.reshape(-1, H).astype(np.float64), *_stored_weights(stored, 0), K)[0].reshape(x.shape)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, atol=1e-5, rtol=1.3e-6)
    r = subprocess.run([cli, "run", "--checkpoint", folder, "--layer", "5"], capture_output=True, text=True)
    assert r.returncode == 2 and "expected 0..1 (num_hidden_layers=2), got 5" in r.stderr
    assert json.loads(open(os.path.join(folder, "config.json")).read())["num_local_experts"] == E
