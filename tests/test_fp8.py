"""FP8 checkpoints as DeepSeek-V3/R1 publish them: float8_e4m3fn weights with float32 block scales
(weight_scale_inv), blocks of 128 whose edges are partial here (H 160, I 200 and 96). The reference: each weight
dequantized by ml_dtypes (tests/hf_checkpoint.to_fp8), and the same layer from a float32 checkpoint holding those
values."""
import json
import os

import mindspore as ms
import ml_dtypes
import numpy as np
import pytest
from safetensors import TensorSpec, serialize_file

from ms_swiglu.checkpoint import load_dense_layer, load_moe_layer, read_safetensors
from ms_swiglu.checkpoint.converted import convert
from ms_swiglu.checkpoint.fp8 import E4M3
from ms_swiglu.checkpoint.load import load_moe
from ms_swiglu.packing import shard_down, shard_packed
from ms_swiglu.quant.int8 import quantize_int8
from conftest import assert_close, cli_batch, to_f64, to_tensor
from hf_checkpoint import make_checkpoint, to_fp8
from test_cli import cli

H, I, MOE_I, E = 160, 200, 96, 4
P = "model.layers.1.mlp."


@pytest.fixture(scope="module")
def fp8(tmp_path_factory):
    """(FP8 folder, float32 folder with the values the FP8 weights stand for, those values)."""
    root = tmp_path_factory.mktemp("fp8")
    src, dst, ref = str(root / "float"), str(root / "fp8"), str(root / "reference")
    make_checkpoint(src, model_type="deepseek_v3", hidden=H, inter=I, layers=2, experts=E, moe_inter=MOE_I,
                    shared_inter=MOE_I, sparse=[1], config_extra={"n_group": 2, "topk_group": 1,
                                                                   "first_k_dense_replace": 1})
    # the shared expert left unquantized (as modules_to_not_convert does): no scales beside it, float32 weights
    values = to_fp8(src, dst, skip=tuple(f"{P}shared_experts.{p}_proj.weight" for p in ("gate", "up", "down")))
    os.makedirs(ref)
    specs = {n: TensorSpec(dtype="float32", shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
             for n, a in values.items()}
    serialize_file(specs, os.path.join(ref, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f, open(os.path.join(ref, "config.json"), "w") as g:
        g.write(f.read())
    return dst, ref, values


def test_the_e4m3_table_is_ml_dtypes():
    want = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(E4M3, want)  # NaN where ml_dtypes has NaN (0x7f, 0xff)


def test_every_weight_is_its_block_dequantization_on_every_rank(fp8):
    folder, _, v = fp8
    dense, dtype = load_dense_layer(folder, 0)
    p = "model.layers.0.mlp."
    assert dtype == "bfloat16"  # the config's: FP8 weights compute in it
    np.testing.assert_array_equal(dense["gate_up"],
                                  np.concatenate([v[p + "gate_proj.weight"], v[p + "up_proj.weight"]]))
    whole, _ = load_moe_layer(folder, 1)
    gate_up = np.stack([np.concatenate([v[f"{P}experts.{e}.gate_proj.weight"], v[f"{P}experts.{e}.up_proj.weight"]])
                        for e in range(E)])
    down = np.stack([v[f"{P}experts.{e}.down_proj.weight"] for e in range(E)])
    np.testing.assert_array_equal(whole["gate_up"], gate_up)
    np.testing.assert_array_equal(whole["down"], down)
    np.testing.assert_array_equal(whole["router"], v[P + "gate.weight"])  # the router stays float
    for rank in range(2):  # a rank reads only the blocks (and scales) its rows and columns touch
        part, _ = load_moe_layer(folder, 1, tp_size=2, rank=rank)
        np.testing.assert_array_equal(part["gate_up"], shard_packed(gate_up, 2, rank))
        np.testing.assert_array_equal(part["down"], shard_down(down, 2, rank))
        np.testing.assert_array_equal(part["shared_down"], shard_down(v[P + "shared_experts.down_proj.weight"], 2,
                                                                      rank))  # float32 as stored


def test_the_block_equals_the_float_checkpoints(fp8):
    folder, ref, _ = fp8
    ms.set_context(mode=ms.GRAPH_MODE)
    x, _ = to_tensor(np.random.default_rng(1).standard_normal((7, H)), "float32")
    want = to_f64(load_moe(ref, 1, backend="cpu", dtype="float32")(x))
    assert_close(load_moe(folder, 1, backend="cpu", dtype="float32")(x), want, "float32", "fp8 block")


def test_convert_writes_float_or_requantizes_from_float32(fp8, tmp_path):
    folder, ref, v = fp8
    convert(folder, str(tmp_path / "f.safetensors"), dtype="float32", tp_size=2)
    convert(folder, str(tmp_path / "q.safetensors"), quant="int8")
    _, dtype = convert(folder, str(tmp_path / "b.safetensors"))
    assert dtype == "bfloat16"
    for rank in range(2):
        tensors, _ = read_safetensors(str(tmp_path / f"f-tp{rank}-of-2.safetensors"))
        np.testing.assert_array_equal(tensors[P + "experts.down_proj.weight"],
                                      shard_down(np.stack([v[f"{P}experts.{e}.down_proj.weight"] for e in range(E)]),
                                                 2, rank))
    ms.set_context(mode=ms.GRAPH_MODE)  # convert, then run the converted layer
    convert(folder, str(tmp_path / "w.safetensors"), dtype="float32", layers=range(1, 2))
    x, _ = to_tensor(np.random.default_rng(3).standard_normal((5, H)), "float32")
    assert_close(load_moe(str(tmp_path / "w.safetensors"), 1, backend="cpu")(x),
                 to_f64(load_moe(ref, 1, backend="cpu", dtype="float32")(x)), "float32", "converted fp8 block")
    q, _ = read_safetensors(str(tmp_path / "q.safetensors"))
    w = np.concatenate([v[P + "shared_experts.gate_proj.weight"], v[P + "shared_experts.up_proj.weight"]])
    q_ref, s_ref = quantize_int8(w)  # from the float32 values, not through bfloat16
    np.testing.assert_array_equal(q[P + "shared_experts.gate_up_proj.weight"], q_ref)
    np.testing.assert_array_equal(q[P + "shared_experts.gate_up_proj.weight_scale"], s_ref)


def test_run_and_export_take_an_fp8_checkpoint(fp8, tmp_path):
    folder, ref, _ = fp8
    np.save(tmp_path / "x.npy", np.random.default_rng(2).standard_normal((3, H)).astype(np.float32))
    outputs = []
    for source in (folder, ref):
        r = cli("run", "--checkpoint", source, "--layer", 1, "--dtype", "float32", "--input", tmp_path / "x.npy",
                "--output", tmp_path / f"{os.path.basename(source)}.npy")
        assert r.returncode == 0, r.stderr
        outputs.append(np.load(tmp_path / f"{os.path.basename(source)}.npy"))
    np.testing.assert_array_equal(outputs[0], outputs[1])  # the same weights, the same graph
    r = cli("run", "--checkpoint", folder, "--layer", 1, "--tokens", 2)
    assert r.returncode == 0 and "dtype bfloat16" in r.stdout, r.stdout + r.stderr  # the config's dtype
    r = cli("export", "--checkpoint", folder, "--layer", 1, "--target", "portable", "--output-dir", tmp_path / "ex")
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "ex" / "manifest.json") as f:
        assert json.load(f)["dtype"] == "bfloat16"


def _edit(folder, tmp_path, config=None, tensors=None):
    """A copy of the FP8 folder (in ``tmp_path``/edited) with config.json's fields and tensors replaced
    (``tensors``: name -> (safetensors dtype, array), None to drop one)."""
    out = tmp_path / "edited"
    out.mkdir(parents=True, exist_ok=True)
    with open(os.path.join(folder, "config.json")) as f:
        raw = json.load(f)
    raw.update(config or {})
    (out / "config.json").write_text(json.dumps(raw))
    head = _header(folder)
    arrays = {}
    for name, meta in head.items():
        if name == "__metadata__":
            continue
        arrays[name] = ({"F8_E4M3": "float8_e4m3fn", "F32": "float32"}[meta["dtype"]], _raw(folder, head, name))
    for name, entry in (tensors or {}).items():
        if entry is None:
            arrays.pop(name)
        else:
            arrays[name] = entry
    specs = {n: TensorSpec(dtype=d, shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
             for n, (d, a) in arrays.items()}
    serialize_file(specs, str(out / "model.safetensors"), metadata={"format": "pt"})
    return str(out)


def _raw(folder, head, name):
    meta = head[name]
    start, end = meta["data_offsets"]
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        base = 8 + int.from_bytes(f.read(8), "little")
        f.seek(base + start)
        data = np.frombuffer(f.read(end - start), np.uint8 if meta["dtype"] == "F8_E4M3" else np.float32)
    return np.ascontiguousarray(data.reshape(meta["shape"]))


def test_what_it_does_not_know_is_refused_by_name(fp8, tmp_path):
    folder, _, _ = fp8
    w = f"{P}experts.0.gate_proj.weight"
    scale = _raw(folder, _header(folder), w + "_scale_inv")
    cases = [
        ({"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}, None,
         "expected quantization_config.quant_method fp8 (block-scaled e4m3), compressed-tensors, gptq, awq or no "
         "quantization_config, got 'bitsandbytes'"),
        ({"quantization_config": {"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}}, None,
         "expected quantization_config.fmt e4m3, got 'e5m2'"),
        ({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [64, 64]}}, None,
         f"{w}_scale_inv: expected shape (2, 3) from config.json, got (1, 2)"),
        ({"quantization_config": None}, None, f"{w}: expected float weights, or F8_E4M3 ones with "
                                              f"quantization_config quant_method fp8"),
        (None, {w: ("float8_e5m2", _raw(folder, _header(folder), w))}, f"{w}: expected dtype F32, F16, BF16, I8, U8, I32, I64 or "
                                                                      f"F8_E4M3, got F8_E5M2"),
        (None, {w + "_scale_inv": None}, f"{w}: expected its block scales {w}_scale_inv beside the F8_E4M3 weight"),
        (None, {w + "_scale_inv": ("float32", np.where(np.arange(scale.size).reshape(scale.shape) == 1, np.inf,
                                                      scale).astype(np.float32))},
         f"{w}_scale_inv: expected finite positive scales, got 1 of 2 that are not"),
    ]
    for config, tensors, expected in cases:
        edited = _edit(folder, tmp_path, config, tensors)
        with pytest.raises(ValueError) as err:
            load_moe_layer(edited, 1)
        assert expected in str(err.value), (expected, str(err.value))
    r = cli("convert", "--checkpoint", edited, "--output", tmp_path / "c.safetensors")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and cases[-1][2] in r.stderr, r.stderr
    assert not (tmp_path / "c.safetensors").exists()


def _header(folder):
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        return json.loads(f.read(int.from_bytes(f.read(8), "little")))


def test_a_dtype_it_does_not_read_and_a_nan_weight_are_refused_by_every_command(fp8, tmp_path):
    """An F8_E5M2 weight (convert had raised KeyError, exit 1) and an e4m3 NaN byte (0x7f, 0xff: run had given an
    all-NaN output with exit 0, a bfloat16 convert had written it): exit 2 with one line naming the tensor (and
    the count), before any output, in run, export and every form of convert."""
    folder, _, _ = fp8
    w = f"{P}experts.1.up_proj.weight"
    raw = _raw(folder, _header(folder), w)
    nan = raw.copy()
    nan.flat[[5, 77]] = (0x7F, 0xFF)
    e5m2 = _edit(folder, tmp_path / "e5m2", tensors={w: ("float8_e5m2", raw)})
    corrupt = _edit(folder, tmp_path / "nan", tensors={w: ("float8_e4m3fn", nan)})
    out = tmp_path / "out"
    out.mkdir()
    forms = [["convert", "--output", out / "c.safetensors", *extra] for extra in
             ([], ["--tp-size", 2], ["--ep-size", 2], ["--quantize", "int8"], ["--dtype", "bfloat16"])]
    forms += [["run", "--layer", 1, "--tokens", 2, "--output", out / "y.npy"],
              ["export", "--layer", 1, "--target", "portable", "--output-dir", out / "kit"]]
    cases = [(source, want, [f[0], "--checkpoint", source, *f[1:]]) for source, want in (
        (e5m2, f"{w}: expected dtype F32, F16, BF16, I8, U8, I32, I64 or F8_E4M3, got F8_E5M2"),
        (corrupt, f"{w}: expected finite weights, got 2 of {raw.size} NaN or infinite")) for f in forms]
    for (source, want, argv), r in zip(cases, cli_batch([argv for _, _, argv in cases])):
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"ms-swiglu: error: {want} (a corrupt "
                                                                        f"checkpoint file)" if source == corrupt
                                                                        else f"ms-swiglu: error: {want}"], (argv,
                                                                                                            r.stderr)
    assert os.listdir(out) == []
