"""The C++ linear kernels (skinny GEMM and oneDNN; SwiGLU epilogue) and the Linear Cell on the cpu backend."""
import mindspore as ms
import numpy as np
import pytest

from ms_swiglu import PackedSwiGLUMLP, SwiGLUMLP, to_packed
from ms_swiglu.backends.cpu import kernels
from ms_swiglu.checkpoint import from_bf16_bits, to_bf16_bits
from ms_swiglu.linear import Linear
from conftest import (DTYPES, ISAS, LossCell, assert_close, needs_amx, on_isa, ref_swiglu, ref_swiglu_grad, to_f64,
                      to_tensor)


def _in_dtype(a, dtype):
    """float32 array -> (array in the kernel's dtype, its exact float64 values); bfloat16 rounds to nearest even."""
    a = np.ascontiguousarray(a, np.float32)
    if dtype != "bfloat16":
        cast = a.astype(kernels.NP_DTYPES[dtype])
        return cast, cast.astype(np.float64)
    bits = to_bf16_bits(a)
    return bits, _out64(bits, dtype)


def _out64(a, dtype):
    return (from_bf16_bits(a) if dtype == "bfloat16" else a).astype(np.float64)


def _check_kernel(n, k, m, dtype, swiglu, seed=0):
    rng = np.random.default_rng(seed)
    x, x64 = _in_dtype(rng.standard_normal((n, k)), dtype)
    w, w64 = _in_dtype(rng.standard_normal((m, k)) / np.sqrt(max(k, 1)), dtype)
    ref = x64 @ w64.T
    if swiglu:
        ref = ref_swiglu(ref)
    out = np.full(ref.shape, 7, kernels.NP_DTYPES[dtype])  # stale values must be overwritten
    kernels.linear(x, w, out, dtype, swiglu=swiglu)
    assert_close(_out64(out, dtype), ref, dtype, f"{'GateUpSwiglu' if swiglu else 'Linear'} n={n} k={k} m={m}")


@pytest.fixture
def skinny_only():
    """The skinny kernel for every token count (restored afterwards)."""
    with kernels.forced_path("skinny"):
        yield


@pytest.mark.parametrize("isa", list(ISAS))  # every build: on_isa skips, naming it, those the CPU lacks
def test_panel_path_where_the_isa_has_it(isa):
    """The panel kernel is AVX2's: there the tuning table gives it token ranges and a forced panel path takes it;
    on the other ISAs it has none, and the forced path falls back to the skinny kernel."""
    with on_isa(isa):
        table = kernels.tuning()
        ranges = [table[key][dtype] for key in ("panel_tokens", "panel_tokens_int8") for dtype in kernels.dtypes()]
        with kernels.forced_path("panel"):
            forced = kernels.path("bfloat16", 16)
    if isa == "avx2":
        assert forced == "panel" and any(r is not None for r in ranges), ranges
    else:
        assert forced == "skinny" and ranges == [None] * len(ranges)


@pytest.mark.parametrize("dtype", list(kernels.NP_DTYPES))
@pytest.mark.parametrize("swiglu", [False, True], ids=["linear", "gate_up_swiglu"])
def test_panel_tiles_and_tails(dtype, swiglu):
    """Tokens around the lane tiles (8 and 16 on AVX2, padded with zero tokens); k within one chunk of 256, at it,
    past it and past two with a vector tail; m (even: gate and up halves) with 6-row groups, lone rows and blocks
    of 96 (600: several blocks, the last partial, split between the threads in blocks of 256 / 128 rows). On AVX2,
    the panel kernel's ISA, whichever ISA is the CPU's best."""
    with on_isa("avx2"), kernels.forced_path("panel"):
        assert kernels.path(dtype, 16) == "panel"
        for n in (1, 7, 8, 9, 16, 17, 24, 40):
            for k, m in ((1, 2), (15, 8), (256, 14), (257, 6), (530, 600)):
                _check_kernel(n, k, m, dtype, swiglu, seed=n * k + m)


def test_onednn_is_bound():
    # MindSpore's CPU wheel ships libdnnl.so.3; without it every size would run the skinny kernel.
    assert kernels.onednn().startswith("oneDNN 3.")


@pytest.mark.parametrize("dtype", list(kernels.NP_DTYPES))
@pytest.mark.parametrize("swiglu", [False, True], ids=["linear", "gate_up_swiglu"])
def test_skinny_tiles_and_tails(dtype, swiglu, skinny_only):
    # tokens 1..13 cover every register tile (6 tokens) and remainder; k covers vector tails; m covers row tails,
    # and 600 several blocks of rows, each read by one token as strided streams with a remainder
    for n in (1, 2, 3, 5, 6, 7, 13):
        for k, m in ((1, 2), (15, 6), (17, 10), (37, 130), (64, 4), (33, 600)):
            _check_kernel(n, k, m, dtype, swiglu, seed=n * k + m)


def _at_page_offset(a, offset):
    """A copy of ``a`` that starts ``offset`` bytes into a 4 KB page."""
    raw = np.empty(a.nbytes + 8192, np.uint8)
    start = (offset - raw.ctypes.data) % 4096
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.parametrize("dtype", list(kernels.NP_DTYPES))
def test_skinny_x_anywhere_in_its_page(dtype, skinny_only):
    # the kernel copies x to half a page from the weights (gemm.cc: placed); rows of 4 KB (k = 1024 in float32,
    # 2048 in 16-bit), x at the weights' offset in the page and elsewhere: the same bits, and the reference
    rng = np.random.default_rng(3)
    k = 4096 // np.dtype(kernels.NP_DTYPES[dtype]).itemsize
    w, w64 = _in_dtype(rng.standard_normal((70, k)) / np.sqrt(k), dtype)
    w = _at_page_offset(w, 16)
    for n in (2, 7, 16):
        x, x64 = _in_dtype(rng.standard_normal((n, k)), dtype)
        outs = []
        for offset in (16, 16 + 2048, 528):
            out = np.zeros((n, 35), kernels.NP_DTYPES[dtype])
            kernels.linear(_at_page_offset(x, offset), w, out, dtype, swiglu=True)
            outs.append(out)
        assert_close(_out64(outs[0], dtype), ref_swiglu(x64 @ w64.T), dtype, f"GateUpSwiglu n={n} k={k}")
        for out in outs[1:]:
            np.testing.assert_array_equal(out, outs[0])


@pytest.mark.parametrize("isa", list(ISAS))  # every build (on_isa skips those the CPU lacks; the best runs every test)
def test_skinny_every_isa(isa, skinny_only):
    with on_isa(isa):
        for dtype in kernels.NP_DTYPES:
            _check_kernel(3, 37, 66, dtype, True)
            _check_kernel(7, 100, 9, dtype, False)


def test_the_best_isa_of_this_cpu():
    # the kernels' builds, best first, against the CPU's flags as the kernel reports them (bfloat16 weights take the
    # VDPBF16PS skinny kernel where the CPU has AVX512-BF16 and AVX512-VNNI)
    flags = set(open("/proc/cpuinfo").read().split())
    runs = tuple(name for name, (_, needs) in ISAS.items() if needs <= flags)  # (conftest: the builds, best first)
    assert kernels.isas() == runs and kernels.isa() == runs[0]
    with pytest.raises(ValueError, match="expected one of"):
        kernels.set_isa("sse9")
    with kernels.forced_path("skinny"):
        _check_kernel(16, 4096, 40, "bfloat16", True)  # a model's k: float32 sums of 4096 products


def _has_fp16_matmul():
    flags = open("/proc/cpuinfo").read().split()
    return "avx512_fp16" in flags or "avx_vnni_int8" in flags  # oneDNN's float16 matmul: AVX512-FP16 or AVX2-VNNI-2


def _has_bf16_matmul():
    flags = open("/proc/cpuinfo").read().split()
    return "avx512bw" in flags or "avx_vnni_int8" in flags  # oneDNN's bfloat16 matmul: AVX-512 core or AVX2-VNNI-2


@pytest.mark.parametrize("dtype", list(kernels.NP_DTYPES))
@pytest.mark.parametrize("swiglu", [False, True], ids=["linear", "gate_up_swiglu"])
@pytest.mark.parametrize("path", ["onednn", "onednn-swapped"])
def test_onednn_paths(dtype, swiglu, path):
    # 2500 rows: more than one 1024-row block, and a partial last block; 1 and 19 tokens (odd, not a tile size)
    with kernels.forced_path(path):
        for n in (1, 19):
            _check_kernel(n, 129, 2500, dtype, swiglu, seed=n)


def test_amx_path():
    """bfloat16 on AMX tiles (skipped, "needs AMX-BF16", without them): TDPBF16PS multiplies x and w as they are,
    each product of two bfloat16 exact in float32, the pairs added into float32 tiles, the output rounded once; so
    the float64 GEMM of the bfloat16 values, within the float32 sums' error (k additions, each within half an ulp
    of its running sum: at most 2e-4 on these inputs, test_quant's _amx_sum_bound, within atol 1e-3) and the
    output's rounding (2^-9 |y|, within rtol 1.6e-2). 1..16 tokens: one B tile group (split-k accumulators); 17+:
    32-row panels packed 12 k steps at a time, pairs of token groups and a lone last group; k of 1, 12 and 13 tile
    steps; m with a lone 16-row block."""
    needs_amx()
    with kernels.forced_path("amx"):
        for n in (1, 3, 16, 17, 33, 100):
            for k, m in ((32, 16), (384, 48), (416, 96)):
                _check_kernel(n, k, m, "bfloat16", False, seed=n + k)
                _check_kernel(n, k, m, "bfloat16", True, seed=n + m)
        _check_kernel(40, 100, 48, "bfloat16", True)  # k not a multiple of 32: the skinny kernel instead
        _check_kernel(40, 64, 40, "bfloat16", False)  # m not a multiple of 16: likewise
        _check_kernel(5, 64, 32, "float32", True)     # not bfloat16: skinny


def test_more_token_counts_than_the_matmul_cache_holds():
    # each token count is a new oneDNN primitive; past 256 the cache is dropped and rebuilt (dynamic N)
    with kernels.forced_path("onednn"):
        for n in range(1, 300):
            _check_kernel(n, 8, 6, "float32", n % 2 == 0, seed=n)


def test_default_paths():
    # measured crossovers (tools/bench_linear.py): skinny for decode, swapped oneDNN in the middle, oneDNN above.
    # 16-bit weights that oneDNN has no matmul for on this CPU go to it widened to float32, on float32's crossovers.
    widened = {"float32": False, "float16": not _has_fp16_matmul(), "bfloat16": not _has_bf16_matmul()}
    assert kernels.tuning()["onednn_float32_for"] == widened
    panel = kernels.tuning()["panel_tokens"]  # the panel kernel (AVX2) for 16-bit weights oneDNN takes widened
    assert kernels.path("float16", 100) == ("panel" if panel["float16"] else
                                            "onednn-swapped" if widened["float16"] else "onednn")
    for dtype, n, expected in (("float32", 1, "skinny"), ("float32", 8, "skinny"), ("float32", 9, "onednn-swapped"),
                               ("float32", 192, "onednn-swapped"), ("float32", 193, "onednn"),
                               ("bfloat16", 2, "skinny"), ("float16", 12, "skinny")):
        assert kernels.path(dtype, n) == expected, (dtype, n)
    amx = kernels.tuning()["amx_available"]  # bfloat16 on AMX tiles from 3 to 512 tokens, where the CPU has them
    dot = kernels.tuning()["skinny_max_tokens"]["bfloat16"] == 64  # else a CPU without AVX512-BF16: 16
    if widened["bfloat16"]:  # (no AMX either)
        middle = "panel" if panel["bfloat16"] else "onednn-swapped"
        cases = ((12, "skinny"), (13, middle), (128, middle), (129, "onednn-swapped"), (192, "onednn-swapped"),
                 (193, "onednn"), (512, "onednn"))
    else:
        cases = ((3, "amx" if amx else "skinny"), (16, "amx" if amx else "skinny"),
                 (17, "amx" if amx else "skinny" if dot else "onednn"),
                 (65, "amx" if amx else "onednn"), (512, "amx" if amx else "onednn"), (513, "onednn"))
    for n, expected in cases:
        assert kernels.path("bfloat16", n) == expected, ("bfloat16", n)
    with kernels.forced_path("onednn"):
        assert kernels.path("float32", 1) == "onednn"
    assert kernels.path("float32", 1) == "skinny"  # restored
    with pytest.raises(ValueError, match="expected a path in"):
        with kernels.forced_path("mkl"):
            pass
    with pytest.raises(ValueError, match="expected a dtype in"):
        kernels.path("float64", 8)


def test_empty_and_mismatched_inputs():
    out = np.full((3, 4), 5.0, np.float32)
    kernels.linear(np.zeros((3, 0), np.float32), np.zeros((4, 0), np.float32), out, "float32")
    np.testing.assert_array_equal(out, np.zeros((3, 4), np.float32))  # an empty sum is 0
    kernels.linear(np.zeros((0, 8), np.float32), np.ones((4, 8), np.float32), np.zeros((0, 4), np.float32),
                       "float32")
    with pytest.raises(ValueError, match=r"expected x \[\.\.\., K\], w \[M, K\]"):
        kernels.linear(np.zeros((3, 8), np.float32), np.zeros((4, 9), np.float32), out, "float32")
    with pytest.raises(ValueError, match="status 3"):  # GateUpSwiglu needs an even number of rows
        kernels.linear(np.zeros((3, 8), np.float32), np.zeros((5, 8), np.float32), out, "float32", swiglu=True)


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
    before = kernels.launches()
    for _ in range(3):
        packed(x)
    after = kernels.launches()
    delta = {k: after[k] - before[k] for k in after}
    assert delta == dict.fromkeys(kernels.ops(), 0) | {"Linear": 3, "GateUpSwiglu": 3}, delta


def test_cpu_mlp_export_reloads_with_dynamic_tokens(tmp_path):
    """A MindIR of the cpu MLP (Custom ops with reg_info and C++ InferShape) reloads and runs at any N, on
    every path of the kernels; vs float64 NumPy."""
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(1)
    net = PackedSwiGLUMLP(32, 48, backend="cpu")
    gate_up, down = to_f64(net.gate_up_proj.weight), to_f64(net.down_proj.weight)
    ms.export(net, ms.Tensor(shape=[None, 32], dtype=ms.float32), file_name=str(tmp_path / "mlp"),
              file_format="MINDIR")
    loaded = ms.nn.GraphCell(ms.load(str(tmp_path / "mlp.mindir")))
    for n in (1, 40, 300):
        x, x64 = to_tensor(np.random.default_rng(n).standard_normal((n, 32)), "float32")
        assert_close(loaded(x), ref_swiglu(x64 @ gate_up.T) @ down.T, "float32", f"reloaded N={n}")
