"""The fused SwiGLU op on every backend that runs here, against the float64 NumPy reference."""
import mindspore as ms
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from mindspore import nn, ops

import ms_swiglu
from ms_swiglu import SwiGLU
from ms_swiglu.backends.cpu import kernels
from conftest import DTYPES, ISAS, assert_close, on_isa, ref_swiglu, ref_swiglu_grad, to_f64, to_tensor

BACKENDS = ["cpu", "akg", "composite"]
SHAPES = [(0, 2), (1, 2), (3, 7, 862), (5, 22016)]


class Grad(nn.Cell):
    """d(sum(swiglu(x) * dy))/dx for a given dy."""

    def __init__(self, net):
        super().__init__()
        self.net, self.grad = net, ops.GradOperation(sens_param=True)

    def construct(self, x, dy):
        return self.grad(self.net)(x, dy)


def _inputs(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x, x64 = to_tensor(rng.standard_normal(shape) * 2, dtype)
    dy, dy64 = to_tensor(rng.standard_normal(shape[:-1] + (shape[-1] // 2,)), dtype)
    return x, x64, dy, dy64


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_backward(backend, dtype, shape, mode):
    x, x64, dy, dy64 = _inputs(shape, dtype)
    net = SwiGLU(backend)
    y = net(x)
    assert y.dtype == DTYPES[dtype]
    assert_close(y, ref_swiglu(x64), dtype, f"forward {backend}")
    dx = Grad(net)(x, dy)
    assert dx.dtype == DTYPES[dtype]
    assert_close(dx, ref_swiglu_grad(x64, dy64), dtype, f"backward {backend}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_form_matches_cell(backend, mode):
    x, x64, _, _ = _inputs((4, 10), "float32", seed=3)
    assert_close(ms_swiglu.swiglu(x, backend=backend), ref_swiglu(x64), "float32", backend)


@pytest.mark.parametrize("isa", list(ISAS))  # every build: on_isa skips, naming it, those the CPU lacks
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_every_isa_of_the_cpu_kernel(isa, dtype):
    """Each code path of the .so (forced with msw_set_isa), at widths that leave every tail length."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        with on_isa(isa):
            net = SwiGLU("cpu")
            for inter in list(range(1, 34)) + [4095, 4097, 9000]:
                x, x64, dy, dy64 = _inputs((3, 2 * inter), dtype, seed=inter)
                assert_close(net(x), ref_swiglu(x64), dtype, f"{isa} forward I={inter}")
                assert_close(Grad(net)(x, dy), ref_swiglu_grad(x64, dy64), dtype, f"{isa} backward I={inter}")
            assert kernels.isa() == isa
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)


SPECIAL = [-np.inf, np.inf, np.nan, -100.0, 100.0, -0.0, 0.0, 88.5, -88.5, 1e-30]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("backend", ["cpu", "akg"])
def test_nan_inf_propagate_as_in_the_reference(backend, dtype, mode):
    gate = np.array(SPECIAL * 2, np.float32)
    up = np.array([1.0] * len(SPECIAL) + [np.inf, -np.inf, 2.0, np.nan, 0.0, 1.0, np.inf, 0.0, 3.0, -1.0], np.float32)
    x, x64 = to_tensor(np.concatenate([gate, up])[None], dtype)
    composite = to_f64(SwiGLU("composite")(x))
    assert_close(composite, ref_swiglu(x64), dtype, "composite vs float64")
    got = to_f64(SwiGLU(backend)(x))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(composite))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(composite))
    assert_close(got, composite, dtype, f"{backend} vs composite")


@pytest.mark.parametrize("backend", BACKENDS)
def test_float16_large_gate_does_not_overflow(backend):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    gate = np.array([65504, -65504, 30000, -30000, 11.5, -11.5, 20, -20], np.float32)
    up = np.array([1e-3, 1e-3, 2e-3, 2.0, 1.0, 1.0, 3000, 3000], np.float32)
    x, x64 = to_tensor(np.concatenate([gate, up])[None], "float16")
    y = SwiGLU(backend)(x)
    assert not np.isnan(to_f64(y)).any()
    assert_close(y, ref_swiglu(x64), "float16", backend)
    ms.set_context(mode=ms.GRAPH_MODE)


def test_dynamic_shape_compiles_once():
    """One graph with None leading dims serves every token count; the Cell's compile cache holds one phase."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net = SwiGLU("cpu")
    net.set_inputs(ms.Tensor(shape=[None, None, 64], dtype=ms.float32))
    for tokens in (1, 7, 64, 3, 513):
        x, x64, _, _ = _inputs((2, tokens, 64), "float32", seed=tokens)
        assert_close(net(x), ref_swiglu(x64), "float32", f"tokens={tokens}")
    assert len(net.compile_cache) == 1, net.compile_cache


def test_akg_rejects_dynamic_shapes_with_a_clear_error():
    ms.set_context(mode=ms.GRAPH_MODE)
    net = SwiGLU("akg")
    net.set_inputs(ms.Tensor(shape=[None, 8], dtype=ms.float32))
    with pytest.raises(ValueError, match=r"expected a static shape .* got \(-1, 8\)"):
        net(ms.Tensor(np.ones((3, 8), np.float32)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "array, error, message",
    [
        (np.ones((3, 7), np.float32), ValueError, r"expected an even, non-zero last dim \(2I\), got 7"),
        (np.ones((3, 0), np.float32), ValueError, r"expected an even, non-zero last dim \(2I\), got 0"),
        (np.array(1.0, np.float32), ValueError, r"expected a tensor of rank >= 1 .* got a 0-d tensor"),
        (np.ones((3, 4), np.int32), TypeError, r"expected dtype float32, float16 or bfloat16, got Int32"),
        (np.ones((3, 4), np.float64), TypeError, r"expected dtype float32, float16 or bfloat16, got Float64"),
    ],
    ids=["odd", "zero", "0-d", "int32", "float64"],
)
def test_bad_input_is_rejected_before_any_kernel(backend, array, error, message, mode):
    with pytest.raises(error, match=message):
        SwiGLU(backend)(ms.Tensor(array))


def test_bad_backend_name():
    with pytest.raises(ValueError, match=r"backend: expected one of auto, ascend, cpu, akg, composite, ge, got 'gpu'"):
        SwiGLU("gpu")


def test_auto_is_cpu_here():
    assert ms.get_context("device_target") == "CPU"
    assert SwiGLU("auto").backend.name == "cpu"


_DYN = {}


def _dynamic_cpu_net(dtype):
    if dtype not in _DYN:
        net = SwiGLU("cpu")
        net.set_inputs(ms.Tensor(shape=[None, None], dtype=DTYPES[dtype]))
        _DYN[dtype] = (net, Grad(net))
    return _DYN[dtype]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(0, 9),
    inter=st.integers(1, 300),
    dtype=st.sampled_from(list(DTYPES)),
    scale=st.sampled_from([1e-3, 1.0, 8.0, 60.0]),
    seed=st.integers(0, 2**31),
)
def test_property_random_shapes_and_values(rows, inter, dtype, scale, seed):
    """The cpu kernel (one dynamic-shape graph per dtype) against the reference over random shapes and scales."""
    ms.set_context(mode=ms.GRAPH_MODE)
    rng = np.random.default_rng(seed)
    x, x64 = to_tensor(rng.standard_normal((rows, 2 * inter)) * scale, dtype)
    dy, dy64 = to_tensor(rng.standard_normal((rows, inter)), dtype)
    net, grad = _dynamic_cpu_net(dtype)
    expected = ref_swiglu(x64)
    if dtype == "float16" and not np.isfinite(expected).all():
        return  # the exact product overflows float16 (both sides give inf); not a kernel property
    assert_close(net(x), expected, dtype, "forward")
    if rows:
        assert_close(grad(x, dy), ref_swiglu_grad(x64, dy64), dtype, "backward")


def test_launch_counter_sees_each_kernel_run():
    """kernels.launches() counts the library's own launches: one forward per call, one fused backward per gradient."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net = SwiGLU("cpu")
    x, _, dy, _ = _inputs((3, 8), "float32", seed=9)
    net(x).asnumpy()
    Grad(net)(x, dy).asnumpy()
    before = kernels.launches()
    net(x).asnumpy()
    after_fwd = kernels.launches()
    Grad(net)(x, dy).asnumpy()
    after_bwd = kernels.launches()
    assert after_fwd["SwigluFwd"] - before["SwigluFwd"] == 1 and after_fwd["SwigluBwd"] == before["SwigluBwd"]
    assert after_bwd["SwigluBwd"] - after_fwd["SwigluBwd"] == 1
