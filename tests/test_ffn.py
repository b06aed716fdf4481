"""FFNBlock: gradients per recompute mode, what the compiled graph recomputes, mixed precision, loading."""
import glob
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import amp

from ms_swiglu import FFNBlock, PackedMoE, load_ffn
from ms_swiglu.export import op_types
from conftest import DTYPES, TOL, LossCell, assert_close, ref_swiglu, to_f64, to_tensor
from hf_checkpoint import make_checkpoint

H, I = 32, 48


def _grads(block, x, dy):
    net = LossCell(block)
    gx, gw = ms.grad(net, grad_position=0, weights=net.trainable_params())(x, dy)
    return [gx.asnumpy()] + [g.asnumpy() for g in gw]


def _block(backend="composite", recompute="none", seed=0, **kw):
    ms.set_seed(seed)
    return FFNBlock(H, I, backend=backend, recompute=recompute, **kw)


def _xy(seed=0, t=6):
    rng = np.random.default_rng(seed)
    return to_tensor(rng.standard_normal((t, H)), "float32")[0], to_tensor(rng.standard_normal((t, H)), "float32")[0]


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recompute_gradients_equal_none(mode):
    ms.set_context(mode=ms.GRAPH_MODE)
    x, dy = _xy()
    want = _grads(_block(), x, dy)
    got = _grads(_block(recompute=mode), x, dy)
    for g, w in zip(got, want):
        assert_close(g, w.astype(np.float64), "float32", f"recompute={mode}")


def test_fused_gradients_equal_composite():
    ms.set_context(mode=ms.GRAPH_MODE)
    x, dy = _xy(1)
    for g, w in zip(_grads(_block("cpu"), x, dy), _grads(_block("composite"), x, dy)):
        assert_close(g, w.astype(np.float64), "float32", "cpu vs composite")


def _compiled_ops(block, tmp_path):
    """Op counts of the final compiled training graph (save_graphs IR)."""
    ms.set_context(mode=ms.GRAPH_MODE, save_graphs=True, save_graphs_path=str(tmp_path))
    try:
        _grads(block, *_xy(2))
    finally:
        ms.set_context(save_graphs=False)
    ir = [p for p in glob.glob(str(tmp_path / "**" / "*task_emit*.ir"), recursive=True)]
    text = open(max(ir, key=os.path.getmtime)).read()
    return {op: text.count(f"PrimFunc_{op}(") for op in ("SiLU", "Split", "MatMul", "Rsqrt")}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("backend", ["cpu", "composite"])
def test_rms_norm_and_residual_add_against_numpy(backend, dtype):
    # H = 37: vector tails; [3, 2, 37]: leading dims flattened
    ms.set_context(mode=ms.GRAPH_MODE)
    from ms_swiglu import RMSNorm
    from ms_swiglu.backends import get

    rng = np.random.default_rng(7)
    for shape in ((5, 37), (3, 2, 37), (1, 64)):
        h = shape[-1]
        norm = RMSNorm(h, eps=1e-5, dtype=dtype, backend=backend)
        w, w64 = to_tensor(rng.standard_normal(h), dtype)
        norm.weight.set_data(w)
        x, x64 = to_tensor(rng.standard_normal(shape) * 3, dtype)
        want = x64 / np.sqrt(np.mean(x64 ** 2, -1, keepdims=True) + 1e-5) * w64
        assert_close(norm(x), want, dtype, f"{backend} RMSNorm {shape}")
        y, y64 = to_tensor(rng.standard_normal(shape), dtype)
        assert_close(get(backend).add()(x, y), x64 + y64, dtype, f"{backend} add {shape}")


def test_recompute_modes_really_recompute(tmp_path):
    none = _compiled_ops(_block(), tmp_path / "none")
    selective = _compiled_ops(_block(recompute="selective"), tmp_path / "selective")
    full = _compiled_ops(_block(recompute="full"), tmp_path / "full")
    assert none["SiLU"] == 1 and none["Rsqrt"] == 1, none
    # selective: SiLU(gate) * up runs again in backward, the GEMMs and the norm do not
    assert selective["SiLU"] == 2 and selective["Split"] == 2, selective
    assert selective["MatMul"] == none["MatMul"] and selective["Rsqrt"] == 1, selective
    # full: the norm and the gate_up GEMM run again too
    assert full["SiLU"] == 2 and full["Rsqrt"] == 2 and full["MatMul"] == none["MatMul"] + 1, full


def test_recompute_rejects_the_aot_backend_and_bad_names():
    with pytest.raises(ValueError, match=r"expected a backend MindSpore can recompute .* got cpu \("):
        _block("cpu", "selective")
    with pytest.raises(ValueError, match=r"recompute: expected one of none, full, selective, got 'some'"):
        _block(recompute="some")
    with pytest.raises(TypeError, match=r"dtype: expected one of float32, float16, bfloat16, got 'int8'"):
        _block(dtype="int8")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_block_keeps_float32_statistics(dtype):
    ms.set_context(mode=ms.GRAPH_MODE)
    block32 = _block("cpu", seed=3)
    block = _block("cpu", seed=3, dtype=dtype)
    for (_, p), (_, q) in zip(block32.parameters_and_names(), block.parameters_and_names()):
        q.set_data(ms.Tensor(p.asnumpy()).astype(DTYPES[dtype]))
    x, x64 = to_tensor(np.random.default_rng(3).standard_normal((5, H)) * 50, dtype)  # large |x|: norm in fp32
    got = to_f64(block(x))
    want = to_f64(block32(ms.Tensor(x64.astype(np.float32))))
    # Four roundings to `dtype` (norm output, gate_up, activation, MLP output) before the residual: 4x tolerance;
    # atol scaled by the input magnitude (50), which the residual add carries into the output
    atol, rtol = TOL[dtype]
    np.testing.assert_allclose(got, want, atol=4 * atol * 50, rtol=4 * rtol)


def test_amp_o2_keeps_the_fused_op(tmp_path):
    ms.set_context(mode=ms.GRAPH_MODE)
    block = _block("cpu", seed=4)
    x, _ = _xy(4)
    y32 = block(x).asnumpy()
    mixed = amp.auto_mixed_precision(block, amp_level="O2")
    y16 = mixed(x).astype(ms.float32).asnumpy()
    np.testing.assert_allclose(y16, y32, atol=4e-3, rtol=4e-3)  # float16 GEMMs and activations: 4x fp16 tol
    ms.export(mixed, ms.Tensor(shape=[None, H], dtype=ms.float32), file_name=str(tmp_path / "amp"),
              file_format="MINDIR")
    found = op_types(tmp_path / "amp.mindir")
    assert "Custom" in found and "SiLU" not in found, found


def test_load_ffn_dense_and_mixtral(tmp_path):
    ms.set_context(mode=ms.GRAPH_MODE)
    stored = make_checkpoint(tmp_path / "d", layers=2, seed=5)
    block = load_ffn(str(tmp_path / "d"), 1, backend="cpu")
    x, x64 = to_tensor(np.random.default_rng(5).standard_normal((4, H)), "float32")
    p = "model.layers.1."
    h = x64 / np.sqrt(np.mean(x64 ** 2, -1, keepdims=True) + 1e-5) * stored[p + "post_attention_layernorm.weight"]
    g, u, d = (stored[p + f"mlp.{n}_proj.weight"].astype(np.float64) for n in ("gate", "up", "down"))
    assert_close(block(x), x64 + ref_swiglu(np.concatenate([h @ g.T, h @ u.T], -1)) @ d.T, "float32", "dense")
    make_checkpoint(tmp_path / "m", model_type="mixtral", experts=4, layers=1, seed=6)
    moe_block = load_ffn(str(tmp_path / "m"), 0, backend="cpu")
    assert isinstance(moe_block.mlp, PackedMoE)
    assert moe_block(x).shape == (4, H)
