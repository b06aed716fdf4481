"""PackedSwiGLUMLP against the unpacked baseline and a float64 NumPy MLP; packing round trips; export."""
import mindspore as ms
import numpy as np
import pytest

from ms_swiglu import (PackedSwiGLUMLP, SwiGLUMLP, pack_gate_up, pack_state_dict, to_packed, to_unpacked,
                       unpack_gate_up, unpack_state_dict)
from ms_swiglu.export import op_types
from conftest import DTYPES, LossCell, assert_close, ref_swiglu, to_f64, to_tensor

H, I = 32, 48


def _baseline(dtype="float32", seed=0):
    ms.set_seed(seed)
    return SwiGLUMLP(H, I, dtype=DTYPES[dtype])


def ref_mlp(x, gate, up, down):
    """float64 MLP: [..., H] -> [..., H]."""
    return ref_swiglu(np.concatenate([x @ gate.T, x @ up.T], axis=-1)) @ down.T


def _weights64(mlp):
    return [to_f64(p) for p in (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)]


@pytest.mark.parametrize("backend", ["cpu", "akg", "composite"])
def test_packed_float32_matches_numpy_and_baseline(backend, mode):
    base = _baseline()
    packed = to_packed(base, backend=backend)
    x, x64 = to_tensor(np.random.default_rng(1).standard_normal((2, 5, H)), "float32")
    expected = ref_mlp(x64, *_weights64(base))
    assert_close(packed(x), expected, "float32", f"packed {backend} vs float64")
    assert_close(base(x), expected, "float32", "baseline vs float64")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("backend", ["cpu", "akg", "composite"])
def test_packed_low_precision_matches_baseline(backend, dtype, mode):
    # Both round the GEMM outputs and the activation to `dtype` at the same points, so they are compared
    # with each other at the dtype's tolerance; a float64 MLP would also see the three roundings.
    base = _baseline(dtype)
    packed = to_packed(base, backend=backend)
    x, _ = to_tensor(np.random.default_rng(2).standard_normal((3, 4, H)), dtype)
    y = packed(x)
    assert y.dtype == DTYPES[dtype]
    assert_close(y, to_f64(base(x)), dtype, f"packed {backend} vs baseline")


def test_pack_unpack_round_trip_is_exact():
    base = _baseline(seed=5)
    packed = to_packed(base, backend="composite")
    gate, up = base.gate_proj.weight.asnumpy(), base.up_proj.weight.asnumpy()
    gate_up = packed.gate_up_proj.weight.asnumpy()
    assert gate_up.shape == (2 * I, H)
    np.testing.assert_array_equal(gate_up[:I], gate)  # gate rows first (Megatron-LM order)
    np.testing.assert_array_equal(gate_up[I:], up)
    again = to_unpacked(packed)
    for name in ("gate_proj", "up_proj", "down_proj"):
        np.testing.assert_array_equal(getattr(again, name).weight.asnumpy(), getattr(base, name).weight.asnumpy())


def test_state_dict_migration():
    rng = np.random.default_rng(0)
    sd = {f"model.layers.{i}.mlp.{n}.weight": rng.standard_normal((6, 4) if n != "down_proj" else (4, 6))
          for i in range(2) for n in ("gate_proj", "up_proj", "down_proj")}
    sd["model.norm.weight"] = rng.standard_normal(4)
    packed = pack_state_dict(sd)
    assert sorted(packed) == sorted(["model.norm.weight"] + [f"model.layers.{i}.mlp.{n}.weight" for i in range(2)
                                                            for n in ("gate_up_proj", "down_proj")])
    gate, up = unpack_gate_up(packed["model.layers.1.mlp.gate_up_proj.weight"])
    np.testing.assert_array_equal(gate, sd["model.layers.1.mlp.gate_proj.weight"])
    np.testing.assert_array_equal(up, sd["model.layers.1.mlp.up_proj.weight"])
    back = unpack_state_dict(packed)
    assert sorted(back) == sorted(sd)
    for name in sd:
        np.testing.assert_array_equal(back[name], sd[name])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: pack_gate_up(np.ones((3, 4)), np.ones((2, 4))), r"expected up of the gate's shape \(3, 4\), got \(2, 4\)"),
        (lambda: pack_gate_up(np.ones(4), np.ones(4)), r"gate: expected a 2-D weight \[out, in\], got shape \(4,\)"),
        (lambda: unpack_gate_up(np.ones((5, 4))), r"expected an even number of rows \(2I\), got 5"),
        (lambda: pack_state_dict({"a.gate_proj.weight": np.ones((2, 2))}), r"expected a.up_proj.weight beside"),
        (lambda: pack_state_dict({"a.up_proj.weight": np.ones((2, 2))}), r"expected a gate_proj beside a.up_proj"),
        (lambda: PackedSwiGLUMLP(4, 6, dtype="float64"), r"dtype: expected one of float32, float16, bfloat16, got 'float64'"),
    ],
)
def test_packing_errors_name_expected_and_actual(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_dynamic_batch_and_sequence_one_compile():
    ms.set_context(mode=ms.GRAPH_MODE)
    base = _baseline(seed=2)
    packed = to_packed(base, backend="cpu")
    packed.set_inputs(ms.Tensor(shape=[None, None, H], dtype=ms.float32))
    weights = _weights64(base)
    for b, s in ((1, 1), (2, 7), (3, 128), (1, 513)):
        x, x64 = to_tensor(np.random.default_rng(b * s).standard_normal((b, s, H)), "float32")
        assert_close(packed(x), ref_mlp(x64, *weights), "float32", f"batch={b} seq={s}")
    assert len(packed.compile_cache) == 1, packed.compile_cache


@pytest.mark.parametrize("backend", ["cpu", "composite"])
def test_graph_kernel_fusion_jit_level_o1(backend):
    ms.set_context(mode=ms.GRAPH_MODE)
    base = _baseline(seed=3)
    packed = to_packed(base, backend=backend)
    packed.set_jit_config(ms.JitConfig(jit_level="O1"))
    x, x64 = to_tensor(np.random.default_rng(3).standard_normal((4, H)), "float32")
    assert_close(packed(x), ref_mlp(x64, *_weights64(base)), "float32", f"O1 {backend}")


def test_mlp_gradients_match_composite(mode):
    base = _baseline(seed=4)
    x, _ = to_tensor(np.random.default_rng(4).standard_normal((3, 5, H)), "float32")
    dy, _ = to_tensor(np.random.default_rng(5).standard_normal((3, 5, H)), "float32")
    grads = {}
    for backend in ("cpu", "akg", "composite"):
        net = LossCell(to_packed(base, backend=backend))
        gx, gw = ms.value_and_grad(net, grad_position=0, weights=net.trainable_params())(x, dy)[1]
        grads[backend] = [gx.asnumpy()] + [g.asnumpy() for g in gw]
    for backend in ("cpu", "akg"):
        for got, want in zip(grads[backend], grads["composite"]):
            assert_close(got, want.astype(np.float64), "float32", f"grad {backend} vs composite")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_ascend_backend_exports_builtin_swiglu(dtype, tmp_path):
    """The ascend graph cannot run here, but it compiles and exports; the MindIR holds Swiglu, no Custom op,
    and no float32 upcast (the CPU-only GEMM cast is not in a graph built for Ascend)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net = PackedSwiGLUMLP(H, I, dtype=dtype, backend="ascend")
    ms.export(net, ms.Tensor(shape=[None, None, H], dtype=DTYPES[dtype]), file_name=str(tmp_path / "mlp"),
              file_format="MINDIR")
    ops_found = op_types(tmp_path / "mlp.mindir")
    assert "Swiglu" in ops_found and "MatMul" in ops_found, ops_found
    assert not {"Custom", "SiLU", "Split", "Cast"} & set(ops_found), ops_found


def test_cpu_and_composite_exports_name_their_ops(tmp_path):
    ms.set_context(mode=ms.GRAPH_MODE)
    found = {}
    for backend in ("cpu", "composite"):
        ms.export(PackedSwiGLUMLP(H, I, backend=backend), ms.Tensor(shape=[None, H], dtype=ms.float32),
                  file_name=str(tmp_path / backend), file_format="MINDIR")
        found[backend] = set(op_types(tmp_path / f"{backend}.mindir"))
    assert "Custom" in found["cpu"] and "Swiglu" not in found["cpu"]
    assert {"Split", "SiLU", "Mul"} <= found["composite"] and not {"Custom", "Swiglu"} & found["composite"]


def test_op_types_rejects_a_file_that_is_not_mindir(tmp_path):
    bad = tmp_path / "bad.mindir"
    bad.write_bytes(b"\xff\x00not a protobuf" * 10)
    with pytest.raises(ValueError, match="expected a MindIR protobuf"):
        op_types(bad)
