"""Loading HF checkpoints, packing at load, tensor-parallel sharding and saving packed weights."""
import json
import os

import mindspore as ms
import numpy as np
import pytest

from ms_swiglu import (CheckpointError, load_dense_layer, load_mlp, load_moe_layer, read_config, reshard,
                       shard_down, shard_packed, unshard_down, unshard_packed)
from ms_swiglu.checkpoint import read_safetensors, write_safetensors
from conftest import assert_close, ref_swiglu, to_tensor
from hf_checkpoint import make_checkpoint

H, I = 32, 48


def ref_mlp(x, gate, up, down):
    return ref_swiglu(np.concatenate([x @ gate.T, x @ up.T], axis=-1)) @ down.T


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dense_layer_packs_gate_then_up(tmp_path, dtype, shards, model_type):
    stored = make_checkpoint(tmp_path, model_type=model_type, dtype=dtype, shards=shards, layers=3)
    weights, got_dtype = load_dense_layer(str(tmp_path), 2)
    assert got_dtype == dtype
    p = "model.layers.2.mlp."
    np.testing.assert_array_equal(weights["gate_up"][:I], stored[p + "gate_proj.weight"])
    np.testing.assert_array_equal(weights["gate_up"][I:], stored[p + "up_proj.weight"])
    np.testing.assert_array_equal(weights["down"], stored[p + "down_proj.weight"])


def test_mixtral_experts_pack_w1_then_w3(tmp_path):
    stored = make_checkpoint(tmp_path, model_type="mixtral", experts=4, dtype="bfloat16")
    w, dtype = load_moe_layer(str(tmp_path), 1)
    assert dtype == "bfloat16" and w["gate_up"].shape == (4, 2 * I, H) and w["down"].shape == (4, H, I)
    p = "model.layers.1.block_sparse_moe."
    np.testing.assert_array_equal(w["router"], stored[p + "gate.weight"])
    for e in range(4):
        np.testing.assert_array_equal(w["gate_up"][e, :I], stored[f"{p}experts.{e}.w1.weight"])
        np.testing.assert_array_equal(w["gate_up"][e, I:], stored[f"{p}experts.{e}.w3.weight"])
        np.testing.assert_array_equal(w["down"][e], stored[f"{p}experts.{e}.w2.weight"])
    config = read_config(str(tmp_path))
    assert (config.num_local_experts, config.num_experts_per_tok, config.is_moe) == (4, 2, True)


def test_only_the_requested_layer_is_read(tmp_path, monkeypatch):
    make_checkpoint(tmp_path, layers=4, shards=4)
    from ms_swiglu.checkpoint import files as checkpoint
    read = []
    original = checkpoint._read_tensor
    monkeypatch.setattr(checkpoint, "_read_tensor", lambda *a: read.append(a[2]) or original(*a))
    load_dense_layer(str(tmp_path), 3)
    assert sorted(read) == [f"model.layers.3.mlp.{n}.weight" for n in ("down_proj", "gate_proj", "up_proj")]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_load_mlp_runs_the_checkpoint_layer(tmp_path, dtype):
    ms.set_context(mode=ms.GRAPH_MODE)
    stored = make_checkpoint(tmp_path, dtype=dtype)
    mlp = load_mlp(str(tmp_path), 1, backend="cpu")
    assert mlp.gate_up_proj.weight.dtype == getattr(ms, dtype)
    x, x64 = to_tensor(np.random.default_rng(0).standard_normal((2, 3, H)), "float32")
    mlp32 = load_mlp(str(tmp_path), 1, dtype="float32", backend="cpu")  # cast at load: float32 compute
    p = "model.layers.1.mlp."
    w = [stored[p + n].astype(np.float64) for n in ("gate_proj.weight", "up_proj.weight", "down_proj.weight")]
    assert_close(mlp32(x), ref_mlp(x64, *w), "float32", "checkpoint layer vs float64")


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shard_round_trip_and_partial_sums(tp):
    rng = np.random.default_rng(tp)
    gate, up, down = rng.standard_normal((I, H)), rng.standard_normal((I, H)), rng.standard_normal((H, I))
    gate_up = np.concatenate([gate, up])
    shards = [shard_packed(gate_up, tp, r) for r in range(tp)]
    downs = [shard_down(down, tp, r) for r in range(tp)]
    blk = I // tp
    for r, s in enumerate(shards):  # rank r holds [gate_r; up_r], never half of gate and nothing of up
        np.testing.assert_array_equal(s, np.concatenate([gate[r * blk:(r + 1) * blk], up[r * blk:(r + 1) * blk]]))
        np.testing.assert_array_equal(downs[r], down[:, r * blk:(r + 1) * blk])
    np.testing.assert_array_equal(unshard_packed(shards), gate_up)
    np.testing.assert_array_equal(unshard_down(downs), down)
    x = rng.standard_normal((5, H))
    partial = sum(ref_swiglu(x @ s.T) @ d.T for s, d in zip(shards, downs))
    np.testing.assert_allclose(partial, ref_mlp(x, gate, up, down), rtol=1e-12, atol=1e-12)
    for other in (1, 2, 4):
        g2, d2 = reshard(shards, downs, other)
        np.testing.assert_array_equal(unshard_packed(g2), gate_up)
        np.testing.assert_array_equal(unshard_down(d2), down)


def test_shard_errors():
    w = np.ones((2 * I, H))
    with pytest.raises(ValueError, match=r"tp_size: expected a positive divisor of intermediate_size 48, got 5"):
        shard_packed(w, 5, 0)
    with pytest.raises(ValueError, match=r"rank: expected 0..1, got 2"):
        shard_packed(w, 2, 2)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_packed_weights_save_and_load(tmp_path, dtype):
    stored = make_checkpoint(tmp_path / "ckpt", dtype=dtype)
    w, _ = load_dense_layer(str(tmp_path / "ckpt"), 0)
    path = str(tmp_path / "packed.safetensors")
    write_safetensors(path, {"model.layers.0.mlp.gate_up_proj.weight": w["gate_up"],
                             "model.layers.0.mlp.down_proj.weight": w["down"]}, dtype)
    back, got = read_safetensors(path)
    assert got == dtype
    np.testing.assert_array_equal(back["model.layers.0.mlp.gate_up_proj.weight"], w["gate_up"])
    np.testing.assert_array_equal(back["model.layers.0.mlp.down_proj.weight"],
                                  stored["model.layers.0.mlp.down_proj.weight"])
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def test_mindspore_checkpoint_of_the_packed_cell(tmp_path):
    make_checkpoint(tmp_path / "ckpt")
    mlp = load_mlp(str(tmp_path / "ckpt"), 0, backend="composite")
    ms.save_checkpoint(mlp, str(tmp_path / "mlp.ckpt"))
    params = ms.load_checkpoint(str(tmp_path / "mlp.ckpt"))
    assert {"gate_up_proj.weight", "down_proj.weight"} <= set(params)
    np.testing.assert_array_equal(params["gate_up_proj.weight"].asnumpy(), mlp.gate_up_proj.weight.asnumpy())


def _edit_config(folder, **changes):
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(changes)
    with open(path, "w") as f:
        json.dump(config, f)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: os.remove(os.path.join(d, "config.json")), r"expected .*config.json, found none"),
        (lambda d: _edit_config(d, model_type="gpt2"), r"expected model_type one of .* got 'gpt2'"),
        (lambda d: _edit_config(d, intermediate_size=40), r"expected shape \(40, 32\) from config.json, got \(48, 32\)"),
        (lambda d: _edit_config(d, hidden_size="x"), r"expected hidden_size a positive integer, got 'x'"),
        (lambda d: os.remove(os.path.join(d, "model.safetensors")), r"expected .*model.safetensors or .*index.json"),
    ],
    ids=["no-config", "model-type", "shape", "bad-field", "no-weights"],
)
def test_checkpoint_errors(tmp_path, damage, message):
    make_checkpoint(tmp_path)
    damage(str(tmp_path))
    with pytest.raises(CheckpointError, match=message):
        load_dense_layer(str(tmp_path), 0)


def test_truncated_and_missing_tensor(tmp_path):
    make_checkpoint(tmp_path / "a")
    path = tmp_path / "a" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"expected a valid safetensors file, got: .*incomplete"):
        load_dense_layer(str(tmp_path / "a"), 0)
    make_checkpoint(tmp_path / "b", shards=2)
    index = tmp_path / "b" / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    del data["weight_map"]["model.layers.1.mlp.up_proj.weight"]
    index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"expected tensor model.layers.1.mlp.up_proj.weight, found none"):
        load_dense_layer(str(tmp_path / "b"), 1)
    with pytest.raises(CheckpointError, match=r"layer: expected 0..1 \(num_hidden_layers=2\), got 2"):
        load_dense_layer(str(tmp_path / "b"), 2)


def test_convert_is_a_library_function_the_cli_calls(tmp_path):
    """convert() writes what `ms-swiglu convert` writes (the same tensors and metadata but the set's id), and
    returns each file with its tensor count and the dtype."""
    from ms_swiglu.checkpoint.converted import convert  # noqa: PLC0415
    from ms_swiglu.checkpoint.files import SafetensorsFolder  # noqa: PLC0415
    from test_cli import cli  # noqa: PLC0415

    folder = tmp_path / "ck"
    make_checkpoint(folder, layers=2, seed=4)
    written, dtype = convert(str(folder), str(tmp_path / "lib.safetensors"), tp_size=2, quant="int8")
    assert [os.path.basename(p) for p, _ in written] == ["lib-tp0-of-2.safetensors", "lib-tp1-of-2.safetensors"]
    r = cli("convert", "--checkpoint", folder, "--output", tmp_path / "cli.safetensors", "--tp-size", 2,
            "--quantize", "int8")
    assert r.returncode == 0, r.stderr
    assert dtype == "float32" and [f"({n} tensors, float32, projections int8)" for _, n in written] == [
        line[line.index("("):] for line in r.stdout.splitlines()]
    for rank in range(2):
        paths = [str(tmp_path / f"{stem}-tp{rank}-of-2.safetensors") for stem in ("lib", "cli")]
        (lib, _), (got, _) = (read_safetensors(p) for p in paths)
        lib_meta, got_meta = (SafetensorsFolder(p).metadata(p) for p in paths)
        assert sorted(lib) == sorted(got) and all(np.array_equal(lib[k], got[k]) for k in lib)
        assert {k: v for k, v in lib_meta.items() if k != "set"} == {k: v for k, v in got_meta.items() if k != "set"}
