"""The C++ linear kernels (skinny GEMM and oneDNN; SwiGLU epilogue) and the Linear Cell on the cpu backend."""
import mindspore as ms
import numpy as np
import pytest

from ms_swiglu import PackedSwiGLUMLP, SwiGLUMLP, _cpu_kernel, to_packed
from ms_swiglu.checkpoint import to_bf16_bits
from ms_swiglu.linear import Linear
from conftest import DTYPES, LossCell, assert_close, ref_swiglu, ref_swiglu_grad, to_f64, to_tensor

NP_DTYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


def _in_dtype(a, dtype):
    """float32 array -> (array in the kernel's dtype, its exact float64 values); bfloat16 rounds to nearest even."""
    a = np.ascontiguousarray(a, np.float32)
    if dtype != "bfloat16":
        cast = a.astype(NP_DTYPE[dtype])
        return cast, cast.astype(np.float64)
    bits = to_bf16_bits(a)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _out64(a, dtype):
    return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64) if dtype == "bfloat16" else a.astype(np.float64)


def _check_kernel(n, k, m, dtype, swiglu, seed=0):
    rng = np.random.default_rng(seed)
    x, x64 = _in_dtype(rng.standard_normal((n, k)), dtype)
    w, w64 = _in_dtype(rng.standard_normal((m, k)) / np.sqrt(max(k, 1)), dtype)
    ref = x64 @ w64.T
    if swiglu:
        ref = ref_swiglu(ref)
    out = np.full(ref.shape, 7, NP_DTYPE[dtype])  # stale values must be overwritten
    _cpu_kernel.linear(x, w, out, dtype, swiglu=swiglu)
    assert_close(_out64(out, dtype), ref, dtype, f"{'GateUpSwiglu' if swiglu else 'Linear'} n={n} k={k} m={m}")


@pytest.fixture
def skinny_only():
    """The skinny kernel for every token count (restored afterwards)."""
    _cpu_kernel.set_onednn(False)
    yield
    _cpu_kernel.set_onednn(True)


def test_onednn_is_bound():
    # MindSpore's CPU wheel ships libdnnl.so.3; without it every size would run the skinny kernel.
    assert _cpu_kernel.gemm() == "onednn"


@pytest.mark.parametrize("dtype", list(NP_DTYPE))
@pytest.mark.parametrize("swiglu", [False, True], ids=["linear", "gate_up_swiglu"])
def test_skinny_tiles_and_tails(dtype, swiglu, skinny_only):
    # tokens 1..13 cover every register tile (6 tokens) and remainder; k covers vector tails; m covers row tails
    for n in (1, 2, 3, 5, 6, 7, 13):
        for k, m in ((1, 2), (15, 6), (17, 10), (37, 130), (64, 4)):
            _check_kernel(n, k, m, dtype, swiglu, seed=n * k + m)


@pytest.mark.parametrize("isa", ["avx2", "generic"])
def test_skinny_every_isa(isa, skinny_only):
    try:
        _cpu_kernel.set_isa(isa)
        for dtype in NP_DTYPE:
            _check_kernel(3, 37, 66, dtype, True)
            _check_kernel(7, 100, 9, dtype, False)
    finally:
        _cpu_kernel.set_isa("avx512")


@pytest.mark.parametrize("dtype", list(NP_DTYPE))
@pytest.mark.parametrize("swiglu", [False, True], ids=["linear", "gate_up_swiglu"])
def test_onednn_path(dtype, swiglu):
    n = _cpu_kernel.skinny_max(dtype) + 3  # above the skinny range
    # 2500 rows: more than one 1024-row block, and a partial last block
    _check_kernel(n, 129, 2500, dtype, swiglu)


def test_skinny_max_is_settable_and_checked():
    old = _cpu_kernel.skinny_max("float32")
    try:
        assert _cpu_kernel.skinny_max("float32", 0) == 0
        _check_kernel(1, 64, 40, "float32", True)  # one token through oneDNN
    finally:
        _cpu_kernel.skinny_max("float32", old)
    with pytest.raises(ValueError):
        _cpu_kernel.skinny_max("float64")


def test_empty_and_mismatched_inputs():
    out = np.full((3, 4), 5.0, np.float32)
    _cpu_kernel.linear(np.zeros((3, 0), np.float32), np.zeros((4, 0), np.float32), out, "float32")
    np.testing.assert_array_equal(out, np.zeros((3, 4), np.float32))  # an empty sum is 0
    _cpu_kernel.linear(np.zeros((0, 8), np.float32), np.ones((4, 8), np.float32), np.zeros((0, 4), np.float32),
                       "float32")
    with pytest.raises(ValueError, match=r"expected x \[\.\.\., K\], w \[M, K\]"):
        _cpu_kernel.linear(np.zeros((3, 8), np.float32), np.zeros((4, 9), np.float32), out, "float32")
    with pytest.raises(ValueError, match="status 3"):  # GateUpSwiglu needs an even number of rows
        _cpu_kernel.linear(np.zeros((3, 8), np.float32), np.zeros((5, 8), np.float32), out, "float32", swiglu=True)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_linear_cell_forward_and_grad_match_float64(dtype, mode):
    """cpu Linear forward, dx and dW against float64 NumPy from the same rounded inputs: every sum is float32 and
    each result is rounded once, so the one-rounding tolerance holds in every dtype. float32 checks the composite
    (MindSpore MatMul + split/silu/mul) against the same reference."""
    x, x64 = to_tensor(np.random.default_rng(1).standard_normal((2, 5, 24)), dtype)
    for swiglu, d_out in ((False, 20), (True, 40)):
        for backend in ("cpu", "composite") if dtype == "float32" else ("cpu",):
            ms.set_seed(3)
            net = Linear(24, d_out, dtype=DTYPES[dtype], backend=backend, swiglu=swiglu)
            w64 = to_f64(net.weight)
            z = x64 @ w64.T
            y = net(x)
            assert y.dtype == DTYPES[dtype]
            assert_close(y, ref_swiglu(z) if swiglu else z, dtype, f"{backend} forward swiglu={swiglu}")
            dy, dy64 = to_tensor(np.random.default_rng(2).standard_normal(y.shape), dtype)
            dz = ref_swiglu_grad(z, dy64) if swiglu else dy64
            loss = LossCell(net)
            gx, (gw,) = ms.value_and_grad(loss, grad_position=0, weights=loss.trainable_params())(x, dy)[1]
            assert gx.dtype == DTYPES[dtype] and gw.dtype == DTYPES[dtype]
            assert_close(gx, dz @ w64, dtype, f"{backend} dx swiglu={swiglu}")
            assert_close(gw, dz.reshape(-1, dz.shape[-1]).T @ x64.reshape(-1, 24), dtype, f"{backend} dW swiglu={swiglu}")


def test_cpu_mlp_is_two_kernel_calls_and_keeps_weight_dtype():
    """The cpu MLP runs GateUpSwiglu + Linear once each per call (no MatMul, no separate SwiGLU) and keeps
    bfloat16 weights as bfloat16 (nothing is widened per call outside the kernel)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    base = SwiGLUMLP(32, 48, dtype=ms.bfloat16)
    packed = to_packed(base, backend="cpu")
    assert packed.gate_up_proj.weight.dtype == ms.bfloat16 and packed.down_proj.weight.dtype == ms.bfloat16
    x, _ = to_tensor(np.random.default_rng(0).standard_normal((3, 32)), "bfloat16")
    packed(x)  # compile
    before = _cpu_kernel.launches()
    for _ in range(3):
        packed(x)
    after = _cpu_kernel.launches()
    delta = {k: after[k] - before[k] for k in after}
    assert delta == {"forward": 0, "backward": 0, "linear": 3, "gate_up_swiglu": 3}, delta


def test_cpu_mlp_export_reloads_with_dynamic_tokens(tmp_path):
    """A MindIR of the cpu MLP (Custom ops with reg_info and C++ InferShape; exported without the float32
    token-count branch, which a reloaded MindIR cannot run) reloads and runs at any N; vs float64 NumPy."""
    from ms_swiglu.linear import without_token_branch

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(1)
    net = without_token_branch(PackedSwiGLUMLP(32, 48, backend="cpu"))
    gate_up, down = to_f64(net.gate_up_proj.weight), to_f64(net.down_proj.weight)
    ms.export(net, ms.Tensor(shape=[None, 32], dtype=ms.float32), file_name=str(tmp_path / "mlp"),
              file_format="MINDIR")
    loaded = ms.nn.GraphCell(ms.load(str(tmp_path / "mlp.mindir")))
    for n in (1, 40, 300):
        x, x64 = to_tensor(np.random.default_rng(n).standard_normal((n, 32)), "float32")
        assert_close(loaded(x), ref_swiglu(x64 @ gate_up.T) @ down.T, "float32", f"reloaded N={n}")


def test_float32_mid_token_counts_take_mindspore_matmul_in_the_same_graph():
    """float32 with MATMUL_TOKENS[0] <= N <= MATMUL_TOKENS[1] runs MindSpore's MatMul + the fused SwiGLU op
    (faster here than oneDNN's sgemm); fewer or more tokens run the C++ GEMMs; one compile serves all."""
    from ms_swiglu.linear import MATMUL_TOKENS

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(2)
    base = SwiGLUMLP(32, 48)
    packed = to_packed(base, backend="cpu")
    packed.set_inputs(ms.Tensor(shape=[None, None, 32], dtype=ms.float32))
    weights = [to_f64(p) for p in (base.gate_proj.weight, base.up_proj.weight, base.down_proj.weight)]
    lo, hi = MATMUL_TOKENS
    for (b, s), kernel in (((1, lo - 1), "gate_up_swiglu"), ((1, lo), "forward"), ((2, hi // 2), "forward"),
                           ((1, hi + 1), "gate_up_swiglu")):
        x, x64 = to_tensor(np.random.default_rng(s).standard_normal((b, s, 32)), "float32")
        before = _cpu_kernel.launches()
        y = packed(x)
        delta = {k: v - before[k] for k, v in _cpu_kernel.launches().items()}
        assert delta[kernel] == 1 and sum(delta.values()) == (2 if kernel == "gate_up_swiglu" else 1), (s, delta)
        ref = ref_swiglu(np.concatenate([x64 @ weights[0].T, x64 @ weights[1].T], -1)) @ weights[2].T
        assert_close(y, ref, "float32", f"N={b * s}")
    assert len(packed.compile_cache) == 1
