"""What docs/architecture.md promises about adding a weight format and an MoE family: each is one object,
registered, and everything else follows (loading, converting, running and exporting). The toys are defined here,
outside the package, so that the test counts what adding one takes: the object and its registration."""
import json

import mindspore as ms
import numpy as np
import pytest
from safetensors.numpy import save_file

from ms_swiglu import families, quant
from ms_swiglu.checkpoint import open_checkpoint
from ms_swiglu.checkpoint.converted import convert
from ms_swiglu.checkpoint.load import layer_state, load_mlp, load_moe
from ms_swiglu.layout import ParallelLayout
from ms_swiglu.mlp import load_weights
from ms_swiglu.moe import PackedMoE
from ms_swiglu.families.base import Family, Keys, MoEConfig
from ms_swiglu.quant.int8 import Int8
from ms_swiglu.routing import Softmax
from hf_checkpoint import make_checkpoint
from moe_reference import ref_block, ref_mlp
from conftest import assert_close, to_f64, to_tensor


class PowerOfTwoInt8(Int8):
    """A toy format: int8 with a power-of-two scale per output row, naming no row of the C++ library (``kernel``
    None): every backend runs it through its dequantize_op, the inherited one."""

    kernel = None

    def quantize(self, w):
        w = np.asarray(w, np.float32)
        amax = np.abs(w).max(-1)
        scale = np.exp2(np.ceil(np.log2(np.where(amax > 0, amax / 127, 1)))).astype(np.float32)
        return np.clip(np.rint(w / scale[..., None]), -127, 127).astype(np.int8), scale


class ToyMoE(Family):
    """A toy MoE family: its own block, router and expert names and config fields."""

    model_types = ("toy_moe",)
    has_moe = True
    keys = Keys(block="ffn", router="router.weight", expert="experts.{e}.{part}.weight", parts=("wi_0", "wi_1", "wo"))

    def moe(self, c, layers):
        return MoEConfig(c.int("num_experts"), c.int("top_k"), c.int("expert_size"), Softmax(renormalize=True)), \
            frozenset(layers)


@pytest.fixture(scope="module")
def toy_format():
    method = quant.register(PowerOfTwoInt8("int8-pow2"))
    yield method
    del quant.METHODS[method.name]


@pytest.fixture(scope="module")
def toy_family():
    family = families.register(ToyMoE())
    yield family
    del families.FAMILIES["toy_moe"]


def test_a_new_weight_format_is_one_object(tmp_path, toy_format):
    """Registered, the toy format quantizes at load and in convert, loads back from the converted file, and runs
    on the composite backend, and on the cpu backend (dequantized in the graph: the library has no row for it),
    equal to the NumPy MLP over its dequantized weights."""
    ms.set_context(mode=ms.GRAPH_MODE)
    stored = make_checkpoint(str(tmp_path / "ckpt"), hidden=32, inter=48, layers=1)
    assert "int8-pow2" in quant.names()
    p = "model.layers.0.mlp."
    gate_up = np.concatenate([stored[p + "gate_proj.weight"], stored[p + "up_proj.weight"]])
    want = [toy_format.dequantize(*toy_format.quantize(w)).astype(np.float64) for w in
            (gate_up, stored[p + "down_proj.weight"])]
    assert all(np.all(np.log2(toy_format.quantize(w)[1]) % 1 == 0) for w in (gate_up,))  # powers of two
    x, x64 = to_tensor(np.random.default_rng(0).standard_normal((5, 32)), "float32")
    ref = ref_mlp(x64, *want, "float32")
    convert(str(tmp_path / "ckpt"), str(tmp_path / "c.safetensors"), quant="int8-pow2")
    for source in (str(tmp_path / "ckpt"), str(tmp_path / "c.safetensors")):
        for backend in ("composite", "cpu"):
            mlp = load_mlp(source, 0, backend=backend, quant="int8-pow2")
            assert mlp.quant == "int8-pow2" and mlp.gate_up_proj.weight.dtype == ms.int8
            assert_close(mlp(x), ref, "float32", f"{source} {backend}")
    assert open_checkpoint(str(tmp_path / "c.safetensors")).quant == "int8-pow2"


def test_a_new_moe_family_is_one_object(tmp_path, toy_family):
    """Registered, a family with its own tensor names and config fields loads from its HF folder, converts, and
    its block equals the NumPy reference read from the tensors under the toy's names."""
    ms.set_context(mode=ms.GRAPH_MODE)
    h, inter, e, k = 32, 16, 4, 2
    rng = np.random.default_rng(3)
    q = "model.layers.0.ffn."
    tensors = {q + "router.weight": rng.standard_normal((e, h)), "model.layers.0.post_attention_layernorm.weight":
               np.ones(h)}
    for i in range(e):
        tensors.update({f"{q}experts.{i}.wi_0.weight": rng.standard_normal((inter, h)) / 6,
                        f"{q}experts.{i}.wi_1.weight": rng.standard_normal((inter, h)) / 6,
                        f"{q}experts.{i}.wo.weight": rng.standard_normal((h, inter)) / 4})
    tensors = {n: a.astype(np.float32) for n, a in tensors.items()}
    folder = tmp_path / "toy"
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({
        "model_type": "toy_moe", "hidden_size": h, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_experts": e, "top_k": k, "expert_size": inter}))
    f64 = {n: a.astype(np.float64) for n, a in tensors.items()}
    p = {"router": f64[q + "router.weight"], "k": k, "renormalize": True,
         "gate_up": np.stack([np.concatenate([f64[f"{q}experts.{i}.wi_0.weight"], f64[f"{q}experts.{i}.wi_1.weight"]])
                              for i in range(e)]),
         "down": np.stack([f64[f"{q}experts.{i}.wo.weight"] for i in range(e)])}
    x, x64 = to_tensor(rng.standard_normal((6, h)), "float32")
    ref, _ = ref_block(x64, p)
    convert(str(folder), str(tmp_path / "toy.safetensors"), tp_size=2)
    assert_close(load_moe(str(folder), 0, backend="cpu")(x), ref, "float32", "toy block")
    ckpt, parts = open_checkpoint(str(tmp_path / "toy.safetensors")), []
    for rank in range(2):  # each rank file's block (before the AllReduce: built with tp_size 1) sums to the whole
        weights, _, _ = ckpt.layer(0, ParallelLayout(2, rank))
        moe = PackedMoE(h, inter // 2, e, k, backend="cpu", router=ckpt.config.moe.router)
        parts.append(to_f64(load_weights(moe, layer_state(ckpt.config, 0, weights), stored=True)(x)))
    assert_close(parts[0] + parts[1], ref, "float32", "toy block over 2 ranks")
