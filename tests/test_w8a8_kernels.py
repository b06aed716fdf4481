"""The cpu library's W8A8 rows (``w8a8``: QLinear_w8a8, QGateUpSwiglu_w8a8 and the experts' ops; ``w8a8-static``:
the same with the input scale and offset) against NumPy on every instruction set the CPU has (conftest.on_isa: the
others skip naming theirs) and every path: the row kernel (VPDPBUSD with x shifted by 128 and the weights' sums
taken off; VPMADDWD on int16 elsewhere; scalar), oneDNN's int8 matmul and the library's own panel kernel (VPDPBUSD;
on AVX2 VPMADDUBSW on |w| and x signed by w, or VPMADDWD where x holds -128 or an offset).

The arithmetic is integer, so the reference is exact: x quantized in NumPy with the same float32 steps (x / s,
rounded half to even), the products summed in int64, then float32(sum) * s_x * scale rounded once to the dtype;
the projections must match it bit for bit. The SwiGLU's exp is float32's (~1 ulp), so GateUpSwiglu is compared
within the dtype's tolerance. Token counts 0, 1, the row kernel's limit and one past it, and more; k not a
multiple of 4, 16 or 64; weights at -128 and activations at both ends of the grid (no saturation anywhere)."""
import contextlib

import numpy as np
import pytest

from conftest import ISAS, assert_close, on_isa, ref_swiglu
from ms_swiglu.backends.cpu import kernels
from ms_swiglu.checkpoint import from_bf16_bits, to_bf16_bits

DTYPES = ("float32", "float16", "bfloat16")
F32 = np.float32


def _x(n, k, dtype, seed, spread=1.0):
    """x [n, k] in the dtype (bfloat16 as its bits) and its exact float32 values."""
    x = (np.random.default_rng(seed).standard_normal((n, k)) * spread).astype(F32)
    if dtype == "bfloat16":
        bits = to_bf16_bits(x)
        return bits, from_bf16_bits(bits).astype(F32)
    x = x.astype(kernels.NP_DTYPES[dtype])
    return x, x.astype(F32)


def _quantize(x32, static):
    """(x_q - o as int64 [n, k], s [n, 1] float32): per token s = max|x| / 127 (1 for zeros), x_q = rint(x / s) in
    [-127, 127]; static: x_q = clip(rint(x / s_in + o), -128, 127), s = 1."""
    if static:
        s_in, o = static
        xq = np.clip(np.rint(x32 / F32(s_in) + F32(o)), -128, 127) - o
        return xq.astype(np.int64), np.ones((len(x32), 1), F32)
    amax = np.abs(x32).max(-1, keepdims=True) if x32.shape[-1] else np.zeros((len(x32), 1), F32)
    s = np.where(amax > 0, amax / F32(127), F32(1)).astype(F32)
    return np.clip(np.rint(x32 / s), -127, 127).astype(np.int64), s


def _projection(x32, q, scale, static):
    """float32 [n, m]: the exact sums, then float32(sum) * s_x * scale."""
    xq, s = _quantize(x32, static)
    return (xq @ q.astype(np.int64).T).astype(F32) * s * scale


def _to_dtype(a32, dtype):
    return to_bf16_bits(a32) if dtype == "bfloat16" else a32.astype(kernels.NP_DTYPES[dtype])


def _f64(y, dtype):
    return from_bf16_bits(y).astype(np.float64) if dtype == "bfloat16" else y.astype(np.float64)


def _weights(m, k, seed):
    """int8 rows over all of -128..127 (a row of -128 included) and float32 scales."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-128, 128, (m, k)).astype(np.int8)
    q[0] = -128
    return q, rng.uniform(0.5, 1.5, m).astype(F32) / (64 * np.sqrt(k))


STATIC = (F32(0.031), F32(-3.0))  # an input scale and an integer offset (msModelSlim's)


def _paths():
    """The paths to force on the ISA in use: None (the automatic choice) and, with VNNI's panel kernel, each."""
    return (None, "skinny", "onednn", "panel") if kernels.tuning()["w8a8_rows_max_tokens"] is not None else (None,)


@pytest.mark.parametrize("isa", list(ISAS))
def test_w8a8_projections_bit_exact_on_every_isa_and_path(isa):
    with on_isa(isa):
        limit = kernels.tuning()["w8a8_rows_max_tokens"] or 4
        for path in _paths():
            with kernels.forced_path(path) if path else contextlib.nullcontext():
                for dtype in DTYPES:
                    for k, m in ((67, 20), (300, 13), (3, 7)):
                        q, scale = _weights(m, k, seed=k)
                        for n in (0, 1, limit, limit + 1, 37, 70):
                            x, x32 = _x(n, k, dtype, seed=n + k)
                            for static in (None, STATIC):
                                op = "QLinear_w8a8_static" if static else "QLinear_w8a8"
                                extra = (np.array([static[0]]), np.array([static[1]])) if static else ()
                                y = kernels.run(op, x, q, scale, *extra, np.zeros((n, m), kernels.NP_DTYPES[dtype]),
                                                dtype=dtype)
                                want = _to_dtype(_projection(x32, q, scale, static), dtype)
                                assert np.array_equal(y.view(want.dtype), want), (isa, path, dtype, k, n, static)


@pytest.mark.parametrize("isa", list(ISAS))
def test_w8a8_gate_up_swiglu_on_every_isa(isa):
    """[gate; up] with the SwiGLU on the float32 values: the projections as above, the SwiGLU in float64 after."""
    with on_isa(isa):
        for dtype in DTYPES:
            q, scale = _weights(2 * 24, 130, seed=5)
            for n in (1, 6, 40):
                x, x32 = _x(n, 130, dtype, seed=n)
                for static in (None, STATIC):
                    op = "QGateUpSwiglu_w8a8_static" if static else "QGateUpSwiglu_w8a8"
                    extra = (np.array([static[0]]), np.array([static[1]])) if static else ()
                    h = kernels.run(op, x, q, scale, *extra, np.zeros((n, 24), kernels.NP_DTYPES[dtype]),
                                    dtype=dtype)
                    z = _projection(x32, q, scale, static).astype(np.float64)
                    assert_close(_f64(h, dtype), ref_swiglu(z), dtype, f"{isa} {dtype} n={n} static={static}")


def test_w8a8_sums_at_the_ends_of_the_grid_do_not_saturate():
    """Every weight -128 and every activation at the top of its grid (127; static: -128 after the offset), over
    k = 4099: sums of +-2^16 magnitude per pair of products and 6.7e7 in all, exact on every ISA and path
    (VPMADDUBSW on x + 128 would saturate the pairs; on |w| and x signed by w, 2 * 128 * 127 fits int16)."""
    k = 4099
    q = np.full((5, k), -128, np.int8)
    scale = np.full(5, 1e-6, F32)
    for isa in kernels.isas():
        with on_isa(isa):
            for x, static in ((np.full((3, k), -2.5, F32), None), (np.full((3, k), -9.0, F32), (F32(0.05), F32(0)))):
                op = "QLinear_w8a8_static" if static else "QLinear_w8a8"
                extra = (np.array([static[0]]), np.array([static[1]])) if static else ()
                for n, path in ((1, None), (3, None), (3, "panel")):
                    with kernels.forced_path(path) if path else contextlib.nullcontext():
                        y = kernels.run(op, x[:n], q, scale, *extra, np.zeros((n, 5), F32), dtype="float32")
                    want = _projection(x[:n], q, scale, static)
                    assert np.array_equal(y, want), (isa, static, n, path)


@pytest.mark.parametrize("isa", list(ISAS))
def test_w8a8_experts_on_every_isa(isa):
    """QMoeGateUpSwiglu / QMoeDownCombine over stacked W8A8 experts (static: each expert its own input scale and
    offset [E, 1]): h per row against the SwiGLU of the exact projections; the combine bit for bit against NumPy
    on the kernel's own h (each row quantized per token, float32 sums of the weighted rows in slot order); an id -1
    (another rank's expert) adds nothing."""
    e, top, hidden, inter = 4, 2, 68, 40
    with on_isa(isa):
        for dtype in ("float32", "bfloat16"):
            npd = kernels.NP_DTYPES[dtype]
            gu = [_weights(2 * inter, hidden, seed=10 + i) for i in range(e)]
            dn = [_weights(hidden, inter, seed=20 + i) for i in range(e)]
            for static in (False, True):
                s_in = np.array([[0.02 + 0.01 * i] for i in range(e)], F32)
                off = np.array([[float(i - 1)] for i in range(e)], F32)
                act = lambda i: (s_in[i, 0], off[i, 0]) if static else None  # noqa: E731
                a_gu = (s_in, off) if static else ()
                a_dn = (s_in * 2, off) if static else ()
                suffix = "_static" if static else ""
                for n in (1, 9):
                    x, x32 = _x(n, hidden, dtype, seed=30 + n)
                    rng = np.random.default_rng(n)
                    ids = np.stack([rng.permutation(e)[:top] for _ in range(n)]).astype(np.int32)
                    ids[0, 1] = -1
                    weights = rng.uniform(0.2, 1, (n, top)).astype(F32)
                    h = kernels.run(f"QMoeGateUpSwiglu_w8a8{suffix}", x, ids, np.stack([g[0] for g in gu]),
                                    np.stack([g[1] for g in gu]), *a_gu, np.zeros((n * top, inter), npd), dtype=dtype)
                    y = kernels.run(f"QMoeDownCombine_w8a8{suffix}", h, ids, weights, np.stack([d[0] for d in dn]),
                                    np.stack([d[1] for d in dn]), *a_dn, np.zeros((n, hidden), npd), dtype=dtype)
                    order = [r for ex in range(e) for r in range(n * top) if ids.flat[r] == ex]  # grouped rows
                    want = np.zeros((n, hidden), F32)
                    for p, r in enumerate(order):
                        t, ex = r // top, ids.flat[r]
                        z = _projection(x32[t:t + 1], *gu[ex], act(ex)).astype(np.float64)
                        assert_close(_f64(h[p:p + 1], dtype), ref_swiglu(z), dtype, f"{isa} {dtype} h row {p}")
                    for t in range(n):
                        for j in range(top):
                            r = t * top + j
                            if ids[t, j] < 0:
                                continue
                            hp = _f64(h[order.index(r):order.index(r) + 1], dtype).astype(F32)
                            sd = (s_in[ids[t, j], 0] * 2, off[ids[t, j], 0]) if static else None
                            want[t] = want[t] + weights[t, j] * _projection(hp, *dn[ids[t, j]], sd)[0]
                    got = y.view(_to_dtype(want, dtype).dtype)
                    assert np.array_equal(got, _to_dtype(want, dtype)), (isa, dtype, static, n)


def test_w8a8_bad_parts_are_refused_by_status():
    """A static offset off the integer grid (4), input scales of another count than one (3), and the dynamic op
    given the static op's parts (1) are refused; no token gives an empty output."""
    q, scale = _weights(8, 32, seed=1)
    x, out = np.ones((2, 32), F32), np.zeros((2, 8), F32)
    with pytest.raises(ValueError, match="status 4"):
        kernels.run("QLinear_w8a8_static", x, q, scale, np.array([0.1], F32), np.array([0.5], F32), out,
                    dtype="float32")
    with pytest.raises(ValueError, match="status 3"):
        kernels.run("QLinear_w8a8_static", x, q, scale, np.array([0.1, 0.2], F32), np.array([0.0, 0.0], F32), out,
                    dtype="float32")
    with pytest.raises(ValueError, match="status 1"):
        kernels.run("QLinear_w8a8", x, q, scale, np.array([0.1], F32), np.array([0.0], F32), out, dtype="float32")
    assert kernels.run("QLinear_w8a8", x[:0], q, scale, out[:0], dtype="float32").shape == (0, 8)


def test_w8a8_paths_by_token_count():
    """With VNNI the row kernel to the tuning table's limit, the library's panel kernel (VPDPBUSD) to its own,
    oneDNN's int8 matmul above (the panel kernel where oneDNN is unavailable); on AVX2 the panel kernel (VPMADDUBSW)
    at every count, oneDNN never (its VPMADDUBSW may saturate); AVX-512 without VNNI and the generic kernel: the row
    kernel at every count."""
    vnni = bool({"avx512_vnni", "avx_vnni"} & set(open("/proc/cpuinfo").read().split()))
    for isa in kernels.isas():
        with on_isa(isa):
            t = kernels.tuning()
            panel_dot = {"avx512amx": "tdpbssd", "avx512bf16": "vpdpbusd", "avx2": "vpmaddubsw"}.get(isa)
            assert t["w8a8_panel_dot"] == panel_dot, isa
            if panel_dot is None:
                assert t["w8a8_rows_max_tokens"] is None
                assert {kernels.path("bfloat16", n, "w8a8") for n in (1, 64, 512)} == {"skinny"}
                continue
            limit, panel = t["w8a8_rows_max_tokens"], t["w8a8_panel_max_tokens"]
            assert (limit > 0) == (isa in ("avx512amx", "avx512bf16")), isa  # (AVX2: its panel from 1 token)
            assert kernels.path("bfloat16", limit, "w8a8") == ("skinny" if limit else "panel")
            assert kernels.path("bfloat16", limit + 1, "w8a8") == "panel"
            dnn = vnni and kernels.onednn().startswith("oneDNN")
            assert (panel is not None) == dnn and (t["w8a8_onednn"] is not None) == dnn, isa
            assert kernels.path("float32", panel or 4096, "w8a8") == "panel"
            assert kernels.path("bfloat16", (panel or 4096) + 1, "w8a8") == ("onednn" if dnn else "panel")


@pytest.mark.parametrize("tiles", (True, False), ids=("tiles", "model"))
def test_w8a8_amx_int8_kernel_bit_exact(tiles):
    """W8A8's AMX-INT8 panel kernel (TDPBSSD: int8 x int8 summed in int32) against NumPy's int64 sums, bit for bit:
    on the tiles where the CPU has AMX-INT8 (else skipped, naming it), and on the scalar model of the tile
    instructions (Intel's pseudocode) on any CPU, so its packing and blocking are checked everywhere. k not a
    multiple of 64 or of 4, rows past a tile (16) and a panel (32), tokens past a group of 16, one token, a static
    offset; every value at the bottom of int8 over k = 4099 (sums of 6.9e7, a pair's products 2^15 each)."""
    if tiles and "avx512amx" not in kernels.isas():
        needs, flags = ISAS["avx512amx"]
        pytest.skip(f"needs {needs} ({', '.join(sorted(flags))}) with the tile data granted; this CPU runs "
                    f"{', '.join(kernels.isas())}")
    rng = np.random.default_rng(3)
    cases = [(rng.integers(-128, 128, (n, k)), rng.integers(-128, 128, (m, k)), o)
             for n, k, m in ((1, 64, 16), (17, 67, 20), (40, 300, 33), (3, 3, 7), (33, 1000, 48)) for o in (0, -3)]
    cases.append((np.full((3, 4099), -128), np.full((5, 4099), -128), 0))
    for xq, w, o in cases:
        got = kernels.amx_s8_sums(xq.astype(np.int8), w.astype(np.int8), o, tiles=tiles)
        want = (xq.astype(np.int64) - o) @ w.astype(np.int64).T
        assert got.shape == want.shape and np.array_equal(got, want), (xq.shape, w.shape, o)
