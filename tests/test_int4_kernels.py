"""The cpu library's int4 row (``int4-group``: QLinear_int4_group, QGateUpSwiglu_int4_group) against NumPy on every
instruction set the CPU has (conftest.on_isa: the others skip naming theirs): one token on the skinny kernels (the
nibbles widened in registers: float32 FMAs, or bfloat16 x on VDPBF16PS with the weights as 128 + u), more tokens on
the rows dequantized a block at a time into the GEMM's dtype. Groups of 32, 64, 128 and whole rows, with and without
zero points; k that no chunk of 128 divides (the VDPBF16PS kernel's unit: the float kernel then), and 0, 1, 2, 9 and
40 tokens. Reference: the format's NumPy decoding (ms_swiglu.quant.int4), rounded to the dtype where the kernels
dequantize into it (above one token), and the GEMM in float64."""
import numpy as np
import pytest

from conftest import ISAS, assert_close, needs_amx, on_isa, ref_swiglu
from ms_swiglu.backends.cpu import kernels
from ms_swiglu.checkpoint import from_bf16_bits, to_bf16_bits
from ms_swiglu.quant.int4 import Int4, pack_int4

DTYPES = ("float32", "float16", "bfloat16")


def _weights(m, k, group, zero_point, seed):
    """(packed u [m, k/2], scale [m, k/g] float32, zero [m, k/g] uint8 or None, w float64 [m, k]) with outputs O(1)
    on O(1) inputs; u over all of 0..15 (the nibbles' ends)."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 16, (m, k)).astype(np.uint8)
    u[0, :2], u[1, :2] = 0, 15
    groups = k // group
    scale = (rng.uniform(0.5, 1.5, (m, groups)) / (4 * np.sqrt(k))).astype(np.float32)
    zero = rng.integers(0, 16, (m, groups)).astype(np.uint8) if zero_point else None
    parts = {"": pack_int4(u), "_scale": scale, **({"_zero": zero} if zero_point else {})}
    return parts[""], scale, zero, Int4(group, zero_point).decode(parts).astype(np.float64)


def _x(n, k, dtype, seed):
    """x [n, k] in the dtype (bfloat16 as its bits) and its exact values in float64."""
    x = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    if dtype == "bfloat16":
        bits = to_bf16_bits(x)
        return bits, from_bf16_bits(bits).astype(np.float64)
    x = x.astype(kernels.NP_DTYPES[dtype])
    return x, x.astype(np.float64)


def _as_read(w64, dtype, n):
    """The weights as the path of ``n`` tokens reads them: exactly at one token (the skinny kernels apply the
    scales to each group's float32 sum) and where oneDNN reads float32 rows (16-bit dtypes it has no matmul for
    here); else (u - z) * scale rounded once to the dtype (as Ascend's antiquant does), exact products after."""
    taken = kernels.path(dtype, n, "int4-g128")
    if n == 1 or (kernels.tuning()["onednn_float32_for"][dtype] and taken in ("onednn", "onednn-swapped")):
        return w64
    if dtype == "bfloat16":
        return from_bf16_bits(to_bf16_bits(w64.astype(np.float32))).astype(np.float64)
    return w64.astype(kernels.NP_DTYPES[dtype]).astype(np.float64)


def _out(y, dtype):
    return from_bf16_bits(y).astype(np.float64) if dtype == "bfloat16" else y.astype(np.float64)


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_int4_rows_against_numpy_on_every_isa(isa, dtype):
    np_dtype = kernels.NP_DTYPES[dtype]
    with on_isa(isa):
        for k, group, m in ((256, 32, 48), (256, 64, 32), (512, 128, 40), (128, 128, 36), (96, 32, 34),
                            (320, 64, 32)):  # (96 and 320: no chunk of 128; 128: one group a row)
            for zero_point in (False, True):
                w, scale, zero, w64 = _weights(m, k, group, zero_point, seed=k + group + zero_point)
                parts = (w, scale) + ((zero,) if zero_point else ())
                for n in (1, 2, 9, 40):
                    x, x64 = _x(n, k, dtype, seed=n)
                    z = x64 @ _as_read(w64, dtype, n).T
                    what = f"{isa} {dtype} k={k} g={group} zp={zero_point} n={n}"
                    zp = "_zp" if zero_point else ""
                    y = kernels.run(f"QLinear_int4_group{zp}", x, *parts, np.zeros((n, m), np_dtype), dtype=dtype)
                    assert_close(_out(y, dtype), z, dtype, f"Linear {what}")
                    h = kernels.run(f"QGateUpSwiglu_int4_group{zp}", x, *parts, np.zeros((n, m // 2), np_dtype),
                                    dtype=dtype)
                    assert_close(_out(h, dtype), ref_swiglu(z), dtype, f"GateUpSwiglu {what}")


def test_int4_rows_on_the_amx_path_packed_into_the_tiles():
    """Above one tile of tokens the amx path packs int4 rows into its tiles as bfloat16((u - z) * scale), rounded to
    nearest even as the dequantized rows are: 1100 tokens x k = 1024 (x beyond the tuning table's
    amx_dequant_x_bytes), 300 rows (a call of 256 and a ragged one), groups of 64 with zero points and groups of 32
    without, against the rows rounded once to bfloat16 and the GEMM in float64."""
    needs_amx()
    n, k, m = 1100, 1024, 300
    assert n * k * 2 > kernels.tuning()["amx_dequant_x_bytes"]
    x, x64 = _x(n, k, "bfloat16", seed=4)
    for group, zero_point in ((64, True), (32, False)):
        w, scale, zero, w64 = _weights(m, k, group, zero_point, seed=group)
        parts, zp = ((w, scale, zero), "_zp") if zero_point else ((w, scale), "")
        with kernels.forced_path("amx"):
            y = kernels.run(f"QLinear_int4_group{zp}", x, *parts, np.zeros((n, m), np.uint16), dtype="bfloat16")
            z = x64 @ _as_read(w64, "bfloat16", n).T
        assert_close(_out(y, "bfloat16"), z, "bfloat16", f"QLinear_int4_group{zp} g={group} on the amx path")


def test_no_token_and_bad_parts_are_refused_by_status():
    """No token: an empty output and status 0. The library refuses (ValueError naming the status) int8 weights
    for the int4 op (1), scales of another group count than the rows' (3), and zero points shaped otherwise than
    the scales (3)."""
    w, scale, zero, _ = _weights(32, 128, 32, True, seed=1)
    x = np.zeros((0, 128), np.float32)
    assert kernels.run("QLinear_int4_group_zp", x, w, scale, zero, np.zeros((0, 32), np.float32),
                       dtype="float32").shape == (0, 32)
    x = np.ones((1, 128), np.float32)
    out = np.zeros((1, 32), np.float32)
    with pytest.raises(ValueError, match="status 1"):
        kernels.run("QLinear_int4_group", x, w.view(np.int8), scale, out, dtype="float32")
    with pytest.raises(ValueError, match="status 3"):
        kernels.run("QLinear_int4_group", x, w, scale[:, :3], out, dtype="float32")
    with pytest.raises(ValueError, match="status 3"):
        kernels.run("QLinear_int4_group_zp", x, w, scale, zero[:, :2], out, dtype="float32")


@pytest.mark.parametrize("isa", list(ISAS))
def test_int4_experts_against_numpy_on_every_isa(isa):
    """QMoeGateUpSwiglu / QMoeDownCombine over stacked int4 experts (with zero points: the _zp ops) against NumPy:
    each row's expert, its SwiGLU, the down projection and the weighted sum of every token's k rows; 1 and 9
    tokens (one row per expert at most, and several), an id -1 (another rank's expert) adding nothing."""
    e, k_top, hidden, inter, group = 4, 2, 128, 64, 32
    with on_isa(isa):
        for dtype in ("float32", "bfloat16"):
            np_dtype = kernels.NP_DTYPES[dtype]
            gu = [_weights(2 * inter, hidden, group, True, seed=10 + i) for i in range(e)]
            dn = [_weights(hidden, inter, group, True, seed=20 + i) for i in range(e)]
            stack = [np.stack([p[j] for p in parts]) for parts in (gu, dn) for j in range(3)]
            for n in (1, 9):
                x, x64 = _x(n, hidden, dtype, seed=30 + n)
                rng = np.random.default_rng(n)
                ids = np.stack([rng.permutation(e)[:k_top] for _ in range(n)]).astype(np.int32)
                ids[0, 1] = -1
                weights = rng.uniform(0.2, 1, (n, k_top)).astype(np.float32)
                h = kernels.run("QMoeGateUpSwiglu_int4_group_zp", x, ids, *stack[:3],
                                np.zeros((n * k_top, inter), np_dtype), dtype=dtype)
                y = kernels.run("QMoeDownCombine_int4_group_zp", h, ids, weights, *stack[3:],
                                np.zeros((n, hidden), np_dtype), dtype=dtype)
                want = np.zeros((n, hidden))
                for t in range(n):
                    for j in range(k_top):
                        if ids[t, j] < 0:
                            continue
                        rows = 1 if n == 1 else n  # the path each expert's rows take: their own count
                        a = ref_swiglu(x64[t] @ _as_read(gu[ids[t, j]][3], dtype, rows).T)
                        a = _out(_to_dtype(a, dtype), dtype)  # h is stored in the dtype
                        want[t] += weights[t, j] * (a @ _as_read(dn[ids[t, j]][3], dtype, rows).T)
                assert_close(_out(y, dtype), want, dtype, f"{isa} {dtype} n={n}")


def _to_dtype(a, dtype):
    """float64 values as the dtype holds them (bfloat16 as its bits)."""
    return to_bf16_bits(a.astype(np.float32)) if dtype == "bfloat16" else a.astype(kernels.NP_DTYPES[dtype])


def _split_x(x64):
    """The AVX2 kernels' x at one token (isa_linear.inc: split_x): per block of 32 elements, max |x| < 2^e, each
    element rounded to nearest-even on the grid 2^(e - 15) and clamped to +-32767 units."""
    xt = x64.reshape(-1, 32)
    top = np.abs(xt).max(1, keepdims=True)
    e = np.frexp(top)[1].astype(np.float64)  # top < 2^e (0 for a block of zeros)
    unit = np.where(top > 0, 2.0 ** (e - 15), 0.0)
    parts = np.clip(np.rint(np.divide(xt, unit, out=np.zeros_like(xt), where=unit > 0)), -32767, 32767)
    return (parts * unit).reshape(x64.shape), (top * np.ones_like(xt)).reshape(x64.shape)


def _run_one_token(w, scale, zero, x32, dtype):
    """QLinear_int4_group[_zp] on one token: (y in float64, x in float64 as the dtype holds it)."""
    x = to_bf16_bits(x32[None]) if dtype == "bfloat16" else x32[None].astype(np.float16)
    parts = (w, scale) + ((zero,) if zero is not None else ())
    y = kernels.run(f"QLinear_int4_group{'_zp' if zero is not None else ''}", x, *parts,
                    np.zeros((1, len(w)), kernels.NP_DTYPES[dtype]), dtype=dtype)
    return _out(y, dtype)[0], _out(x, dtype)[0]


def _model(w64, scale, zero, group, x64):
    """The AVX2 kernel's sum in float64: the nibbles and the zero points' term against x as split_x rounds it;
    the sum of the terms' magnitudes; and the rows' sum |w| * block max (x's rounding is below 2^-15 of it)."""
    s = np.repeat(scale, group, 1).astype(np.float64)
    z = np.repeat(zero, group, 1).astype(np.float64) if zero is not None else 8.0
    u = w64 / s + z
    xr, top = _split_x(x64)
    return (u * s) @ xr - (z * s) @ xr, np.abs(u * s) @ np.abs(xr) + np.abs(z * s) @ np.abs(xr), np.abs(w64) @ top


UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}  # of y's final rounding to the dtype


def test_int4_one_token_on_avx2_vpmaddwd_against_its_modelled_rounding():
    """AVX2 at one token of 16-bit x (``int4_one_token_dot``: VPMADDWD): x rounded to int16 parts per block of 32
    (:func:`_split_x`), the nibbles' products summed exactly in int32 per block, the group's scale after, less
    z * s times the group's sum of the same rounded x. Against that model in float64 the kernel's float32 sums differ by
    at most (k / 32 + groups + 16) * 2^-24 * sum |terms| (each rounding <= 2^-24 of its running sum, in chains of
    k / 32 blocks, the groups, the eight lanes' sum and the term), then y's rounding to the dtype (its unit
    roundoff). The model differs from the exact product by x's rounding: an element moves by at most half its unit,
    2^(e - 16), below 2^-15 of its block's max |x| (>= 2^(e - 1)). x spans 2^-12..2^4 within each row, so blocks of very different scales meet; and a block whose
    small elements round to 0 beside a large one (its weight 0) gives 0, as the model does."""
    with on_isa("avx2"):
        assert kernels.tuning()["int4_one_token_dot"] == "vpmaddwd"
        for k, group, zero_point in ((4096, 128, False), (768, 32, True), (320, 64, True)):
            w, scale, zero, w64 = _weights(24, k, group, zero_point, seed=k)
            rng = np.random.default_rng(k)
            x32 = (rng.standard_normal(k) * 2.0 ** rng.uniform(-12, 4, k)).astype(np.float32)
            for dtype in ("bfloat16", "float16"):
                y, x64 = _run_one_token(w, scale, zero, x32, dtype)
                model, terms, moved = _model(w64, scale, zero, group, x64)
                bound = (k / 32 + k / group + 16) * 2.0 ** -24 * terms
                assert np.all(np.abs(y - model) <= bound + UNIT_ROUNDOFF[dtype] * (np.abs(model) + bound)), (k, dtype)
                assert np.all(np.abs(model - w64 @ x64) <= 2.0 ** -15 * moved), (k, group, dtype)
        # one block: x[0] = 16 (its weight 0), the rest 3 * 2^-13, below half of the block's unit 2^-10
        w, scale, zero, w64 = _weights(8, 256, 32, True, seed=3)
        x32 = np.zeros(256, np.float32)
        x32[:32] = 3 * 2.0 ** -13
        x32[0] = 16.0
        for dtype in ("bfloat16", "float16"):
            w_zero = w64.copy()
            w_zero[:, 0] = 0.0
            packed = pack_int4(np.round(w_zero / np.repeat(scale, 32, 1) + np.repeat(zero, 32, 1)).astype(np.uint8))
            y, x64 = _run_one_token(packed, scale, zero, x32, dtype)
            model, terms, moved = _model(w_zero, scale, zero, 32, x64)
            assert np.all(np.abs(model) <= 1e-12) and np.all(np.abs(w_zero @ x64) > 1e-6)  # rounded away
            assert np.all(np.abs(y) <= (8 + 8 + 16) * 2.0 ** -24 * terms), dtype
            assert np.all(np.abs(model - w_zero @ x64) <= 2.0 ** -15 * moved), dtype
