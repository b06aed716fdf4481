"""PackedMoE: routers and whole blocks (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3) against NumPy references written
from transformers' modelling code; the grouped kernels; static shapes; loading the four families."""
import os
import signal
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest

from ms_swiglu import PackedMoE, load_moe, read_config
from ms_swiglu.backends.cpu import kernels
from ms_swiglu.checkpoint import load_moe_layer
from ms_swiglu.checkpoint.load import load_block
from ms_swiglu.export import op_types
from ms_swiglu.export.mindir import op_counts
from ms_swiglu.routers import SigmoidGroupTopK, SoftmaxTopK
from conftest import DTYPES, TOL, cli_batch, q_op, to_f64, to_tensor
from hf_checkpoint import make_checkpoint
from moe_reference import ref_block, ref_mlp, ref_sigmoid_router, ref_softmax_router, rnd, silu, stored_params

H, I, E, K = 16, 24, 8, 2


FAMILIES = {  # PackedMoE keyword arguments of each family's block
    "mixtral": {},
    "qwen2_moe": dict(renormalize=False, shared_intermediate_size=32, shared_expert_gate=True),
    "qwen3_moe": dict(renormalize=True),
    "deepseek_v3": dict(scoring="sigmoid", n_group=4, topk_group=2, routed_scaling_factor=2.5,
                        shared_intermediate_size=16),
}


def _moe(family="mixtral", dtype="float32", backend="cpu", seed=0, experts=E, top_k=K):
    ms.set_seed(seed)
    moe = PackedMoE(H, I, experts, top_k, dtype=DTYPES[dtype], backend=backend, **FAMILIES[family])
    rng = np.random.default_rng(seed)
    w = ms.Tensor(rng.standard_normal((experts, H)).astype(np.float32)).astype(DTYPES[dtype])  # a dtype's values
    moe.router.weight.set_data(w.astype(moe.router.weight.dtype))  # DeepSeek-V3's router keeps float32
    if family == "deepseek_v3":
        moe.router.e_score_correction_bias.set_data(ms.Tensor(rng.standard_normal(experts).astype(np.float32) * 0.3))
    return moe


def _params(moe):
    """The block's weights as float64 arrays (canonical [E, out, in] layout) and its router settings."""
    layout = moe.experts.unstore
    p = {"router": to_f64(moe.router.weight), "gate_up": layout(to_f64(moe.experts.gate_up_proj)),
         "down": layout(to_f64(moe.experts.down_proj)), "k": moe.top_k, "renormalize": moe.router.renormalize}
    if isinstance(moe.router, SigmoidGroupTopK):
        p.update(bias=to_f64(moe.router.e_score_correction_bias), n_group=moe.router.n_group,
                 topk_group=moe.router.topk_group, scale=moe.router.scale)
    if moe.shared_expert is not None:
        p.update(shared_gate_up=to_f64(moe.shared_expert.gate_up_proj.weight),
                 shared_down=to_f64(moe.shared_expert.down_proj.weight))
    if moe.shared_expert_gate is not None:
        p["shared_gate"] = to_f64(moe.shared_expert_gate.weight)
    return p


def _close(y, expected, dtype, what):
    # The reference rounds where the block rounds; float32 vs float64 sums can still move a rounding by one ulp at
    # each of the (up to four) rounding points of a 16-bit block, hence 4x the one-rounding tolerance there.
    atol, rtol = TOL[dtype]
    scale = 1 if dtype == "float32" else 4
    np.testing.assert_allclose(to_f64(y), expected, atol=scale * atol, rtol=scale * rtol, err_msg=what)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("backend", ["cpu", "composite"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_block_matches_numpy(family, backend, dtype):
    ms.set_context(mode=ms.GRAPH_MODE)
    moe = _moe(family, dtype, backend, seed=3)
    moe.set_inputs(ms.Tensor(shape=[None, H], dtype=DTYPES[dtype]))
    p = _params(moe)
    for tokens in (1, 3, 17, 64):
        x, x64 = to_tensor(np.random.default_rng(tokens).standard_normal((tokens, H)), dtype)
        y = moe(x)
        assert y.dtype == DTYPES[dtype] and y.shape == (tokens, H)
        _close(y, ref_block(x64, p, dtype)[0], dtype, f"{family} {backend} {dtype} T={tokens}")


@pytest.mark.parametrize("renormalize", [True, False])
def test_softmax_router_and_its_ties(renormalize, mode):
    router = SoftmaxTopK(H, E, 3, renormalize=renormalize, backend="cpu")
    x, x64 = to_tensor(np.random.default_rng(1).standard_normal((9, H)), "float32")
    weights, idx = router(x)
    want_w, want_idx = ref_softmax_router(x64, to_f64(router.weight), 3, renormalize)
    np.testing.assert_array_equal(idx.asnumpy(), want_idx)
    np.testing.assert_allclose(weights.asnumpy(), want_w, atol=TOL["float32"][0], rtol=TOL["float32"][1])
    router.weight.set_data(ms.Tensor(np.zeros((E, H), np.float32)))  # every expert scores the same
    np.testing.assert_array_equal(router(x)[1].asnumpy(), np.tile([0, 1, 2], (9, 1)))


def test_sigmoid_group_router(mode):
    rng = np.random.default_rng(2)
    router = SigmoidGroupTopK(H, 16, 4, n_group=4, topk_group=2, renormalize=True, routed_scaling_factor=2.5)
    router.e_score_correction_bias.set_data(ms.Tensor(rng.standard_normal(16).astype(np.float32)))
    x, x64 = to_tensor(rng.standard_normal((33, H)), "float32")
    weights, idx = router(x)
    w, b = to_f64(router.weight), to_f64(router.e_score_correction_bias)
    want_w, want_idx = ref_sigmoid_router(x64, w, b, 4, 4, 2, True, 2.5)
    np.testing.assert_array_equal(idx.asnumpy(), want_idx)
    np.testing.assert_allclose(weights.asnumpy(), want_w, atol=TOL["float32"][0], rtol=TOL["float32"][1])
    np.testing.assert_allclose(weights.asnumpy().sum(-1), 2.5, rtol=1e-6)  # renormalised, then scaled
    # the bias chooses, the unbiased scores weigh: a large bias on expert 15 puts it in every top-k, with its own
    # (unbiased) sigmoid score as weight
    router.e_score_correction_bias.set_data(ms.Tensor(np.eye(16, dtype=np.float32)[15] * 100))
    weights, idx = router(x)
    assert (idx.asnumpy()[:, 0] == 15).all()
    scores = 1 / (1 + np.exp(-(x64 @ w.T)))
    raw = np.take_along_axis(scores, idx.asnumpy(), -1)
    np.testing.assert_allclose(weights.asnumpy(), 2.5 * raw / raw.sum(-1, keepdims=True), atol=TOL["float32"][0],
                               rtol=TOL["float32"][1])
    # experts of the groups left out are never chosen, even where their score beats a kept group's
    router.e_score_correction_bias.set_data(ms.Tensor(np.repeat([0.0, 0.0, -5.0, -5.0], 4).astype(np.float32)))
    assert (router(x)[1].asnumpy() < 8).all()


def test_router_arguments_are_checked():
    with pytest.raises(ValueError, match=r"top_k: expected 1..num_experts \(8\), got 9"):
        PackedMoE(H, I, E, 9)
    with pytest.raises(ValueError, match="scoring: expected one of softmax, sigmoid, got 'relu'"):
        PackedMoE(H, I, E, 2, scoring="relu")
    with pytest.raises(ValueError, match=r"expected n_group dividing num_experts \(8\)"):
        PackedMoE(H, I, E, 2, scoring="sigmoid", n_group=3)
    with pytest.raises(ValueError, match=r"top_k: expected at most topk_group \* num_experts / n_group \(2\), got 3"):
        PackedMoE(H, I, E, 3, scoring="sigmoid", n_group=4, topk_group=1)


def test_expert_without_tokens_single_token_and_every_expert(mode):
    moe = _moe(seed=3)
    router = moe.router.weight.asnumpy()
    router[E - 1] = -10.0 * np.abs(router).max()  # expert 7: never chosen for these inputs
    moe.router.weight.set_data(ms.Tensor(router))
    x, x64 = to_tensor(np.abs(np.random.default_rng(3).standard_normal((40, H))), "float32")
    expected, idx = ref_block(x64, _params(moe))
    assert E - 1 not in idx
    _close(moe(x), expected, "float32", "expert without tokens")
    x1, x1_64 = to_tensor(np.random.default_rng(4).standard_normal((1, H)), "float32")
    _close(moe(x1), ref_block(x1_64, _params(moe))[0], "float32", "single token")
    moe = _moe(seed=5)
    x, x64 = to_tensor(np.random.default_rng(5).standard_normal((64, H)), "float32")
    expected, idx = ref_block(x64, _params(moe))
    assert set(idx.ravel()) == set(range(E))
    _close(moe(x), expected, "float32", "every expert")


# ---- no tokens at all ------------------------------------------------------------------------------------------

HQ = 128  # hidden and intermediate sizes of the blocks below: int8-g128 takes multiples of 128
NO_TOKEN_BLOCKS = [  # (family, backend, dtype, quant, tp_size): every kind of block (qwen3_moe's is mixtral's),
    # backend, dtype and quantization
    (family, backend, dtype, quant, 1) for family in ("mixtral", "qwen2_moe", "deepseek_v3")
    for backend in ("cpu", "composite")
    for dtype in ("float32", "bfloat16") for quant in (None, "int8", "int8-g128")] + [
    ("deepseek_v3", "cpu", "bfloat16", "int8", 2), ("qwen2_moe", "composite", "float32", None, 2)]


def _block_with_weights(family, backend, dtype, quant, tp_size, seed):
    """A block of :data:`FAMILIES` (hidden and intermediate size 128) with random weights, its experts quantized by
    ``quant``; with ``tp_size`` 2 rank 0's block before its AllReduce (one process here: the reduce left out)."""
    from ms_swiglu.mlp import load_weights  # noqa: PLC0415
    from ms_swiglu.quant import quantize_state_dict  # noqa: PLC0415

    kw = dict(FAMILIES[family])
    if "shared_intermediate_size" in kw:
        kw["shared_intermediate_size"] = HQ
    moe = PackedMoE(HQ, HQ, E, K, dtype=DTYPES[dtype], backend=backend, quant=quant, tp_size=tp_size, **kw)
    if tp_size > 1:
        moe.reduce = ms.nn.Identity()
    rng = np.random.default_rng(seed)
    state = {name: (rng.standard_normal(p.shape) / (2 * np.sqrt(p.shape[-1]) if "proj" in name else 1)).astype(
        np.float32) for name, p in moe.parameters_and_names() if not name.endswith("_scale")}  # outputs O(0.1)
    return load_weights(moe, quantize_state_dict(state, quant) if quant else state)


def _reference_params(moe):
    """:func:`_params` with int8 weights dequantized (exactly, as the kernels widen them)."""
    from ms_swiglu.quant.int8 import dequantize_int8  # noqa: PLC0415

    p = _params(moe)
    if moe.quant:
        p["gate_up"] = dequantize_int8(moe.experts.gate_up_proj.asnumpy(), moe.experts.gate_up_proj_scale.asnumpy())
        p["down"] = dequantize_int8(moe.experts.down_proj.asnumpy(), moe.experts.down_proj_scale.asnumpy())
        if moe.shared_expert is not None:
            for part in ("gate_up", "down"):
                proj = getattr(moe.shared_expert, f"{part}_proj")
                p[f"shared_{part}"] = dequantize_int8(proj.weight.asnumpy(), proj.weight_scale.asnumpy())
    return {k: v.astype(np.float64) if isinstance(v, np.ndarray) else v for k, v in p.items()}


class _Blocks(ms.nn.Cell):
    """Every block on the input of its dtype, in one graph: one build for all of them."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = ms.nn.CellList(blocks)
        self.wide = [b.compute_dtype == ms.float32 for b in blocks]

    def construct(self, x32, x16):
        out = ()
        for i in range(len(self.wide)):
            out = out + (self.blocks[i](x32 if self.wide[i] else x16),)
        return out


def _no_tokens():
    """The body of :func:`test_no_tokens_give_no_rows_and_leave_the_block_working`, in a process of its own."""
    ms.set_context(mode=ms.GRAPH_MODE)
    blocks = [_block_with_weights(*b, seed=i) for i, b in enumerate(NO_TOKEN_BLOCKS)]
    refs = [_reference_params(b) for b in blocks]
    names = [" ".join(map(str, b)) for b in NO_TOKEN_BLOCKS]
    dtypes = [b[2] for b in NO_TOKEN_BLOCKS]

    def run(cell, shape):
        x = np.random.default_rng(len(shape)).standard_normal(shape)
        (x32, x32_64), (x16, x16_64) = to_tensor(x, "float32"), to_tensor(x, "bfloat16")
        outs = cell(x32, x16)
        for y, name, dtype in zip(outs, names, dtypes):
            assert y.shape == shape and y.dtype == DTYPES[dtype], f"{name}: got {y.shape} {y.dtype} for {shape}"
        return outs, {"float32": x32_64.reshape(-1, HQ), "bfloat16": x16_64.reshape(-1, HQ)}

    def check_rows(cell, shape, what):
        outs, x64 = run(cell, shape)
        for y, p, name, dtype in zip(outs, refs, names, dtypes):
            _close(y.reshape(-1, HQ), ref_block(x64[dtype], p, dtype)[0], dtype, f"{name}: {what}")
        return [to_f64(y) for y in outs]

    static = _Blocks(blocks)  # one graph per shape
    for shape in ((0, HQ), (1, 0, HQ)):
        run(static, shape)
    for spec, empty, rows in (([None, None, HQ], [(1, 0, HQ), (0, 3, HQ)], (2, 3, HQ)),
                              ([None, HQ], [(0, HQ)], (5, HQ))):
        dynamic = _Blocks(blocks)
        dynamic.set_inputs(ms.Tensor(shape=spec, dtype=ms.float32), ms.Tensor(shape=spec, dtype=ms.bfloat16))
        before = check_rows(dynamic, rows, f"{rows} in a {spec} graph")
        for shape in empty:
            run(dynamic, shape)
        after = check_rows(dynamic, rows, f"{rows} in a {spec} graph after {empty}")
        for b, a, name in zip(before, after, names):  # and bit for bit as before
            np.testing.assert_array_equal(a, b, err_msg=f"{name}: {rows} after {empty}")


NO_TOKENS = "test_no_tokens_give_no_rows_and_leave_the_block_working"


@pytest.fixture(scope="module", autouse=True)
def no_tokens_process(request, tmp_path_factory):
    """The process of :data:`NO_TOKENS` (this file run as ``python test_moe.py no-tokens``), started with the
    module's first test when that test is selected, so that its minute of graph builds runs beside the module's
    other tests (NO_TOKENS is the module's last test and waits for it): (Popen, its working folder, where its
    stdout and stderr go). Ended at the module's end if still running."""
    if not any(item.module is request.module and item.originalname == NO_TOKENS for item in request.session.items):
        yield None
        return
    cwd = tmp_path_factory.mktemp("no_tokens")
    with open(cwd / "stdout", "wb") as out, open(cwd / "stderr", "wb") as err:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "no-tokens"], stdout=out, stderr=err,
                                cwd=cwd, env=dict(os.environ, GLOG_v="3"))
    yield proc, cwd
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_grouped_kernels_compute_t_times_k_rows_grouped_by_expert(dtype):
    """MoeGateUpSwiglu writes T*k rows (never T*E), grouped by expert, stably; MoeDownCombine sums each token's k
    rows with its weights in float32, rounded once."""
    rng = np.random.default_rng(0)
    np_dtype = kernels.NP_DTYPES[dtype]
    tokens, k, experts, hidden, inter = 13, 3, 6, 20, 12

    def cast(a):
        t, t64 = to_tensor(a, dtype)
        return (t.asnumpy().view(np.uint16) if dtype == "bfloat16" else t.asnumpy()), t64

    x, x64 = cast(rng.standard_normal((tokens, hidden)))
    w1, w1_64 = cast(rng.standard_normal((experts, 2 * inter, hidden)) / 4)
    w2, w2_64 = cast(rng.standard_normal((experts, hidden, inter)) / 4)
    ids = rng.integers(0, experts - 1, (tokens, k)).astype(np.int32)  # the last expert gets no row
    weights = rng.random((tokens, k)).astype(np.float32)
    h = kernels.run("MoeGateUpSwiglu", x, ids, w1, np.zeros((tokens * k, inter), np_dtype), dtype=dtype)
    order = np.argsort(ids.ravel(), kind="stable")  # row p of the grouped order is (token, slot) order[p]
    g = np.einsum("ph,pih->pi", x64[order // k], w1_64[ids.ravel()[order]])
    want_h = rnd(silu(g[:, :inter]) * g[:, inter:], dtype)
    h64 = (np.asarray(h, np.uint32) << 16).view(np.float32).astype(np.float64) if dtype == "bfloat16" else h
    np.testing.assert_allclose(h64, want_h, atol=TOL[dtype][0], rtol=TOL[dtype][1])
    out = kernels.run("MoeDownCombine", h, ids, weights, w2, np.zeros((tokens, hidden), np_dtype), dtype=dtype)
    y = np.einsum("pi,phi->ph", h64, w2_64[ids.ravel()[order]])  # grouped rows' outputs, float64
    back = np.empty_like(order)
    back[order] = np.arange(order.size)
    want = rnd((weights.astype(np.float64)[..., None] * y[back].reshape(tokens, k, hidden)).sum(1), dtype)
    out64 = (np.asarray(out, np.uint32) << 16).view(np.float32).astype(np.float64) if dtype == "bfloat16" else out
    np.testing.assert_allclose(out64, want, atol=TOL[dtype][0], rtol=TOL[dtype][1])
    with pytest.raises(ValueError, match="status 4"):  # an expert id outside [0, E)
        kernels.run("MoeGateUpSwiglu", x, ids + experts, w1, np.zeros((tokens * k, inter), np_dtype), dtype=dtype)


def test_kernels_take_no_rows():
    """Every op of the library on T = 0 (its shape checks and its loops; no graph): no row, no error."""
    from ms_swiglu.quant.int8 import quantize_int8  # noqa: PLC0415

    k, experts, hidden, inter = 2, 4, 128, 128
    for dtype, np_dtype in kernels.NP_DTYPES.items():
        x, ids, weights = np.zeros((0, hidden), np_dtype), np.zeros((0, k), np.int32), np.zeros((0, k), np.float32)
        w1, w2 = np.zeros((experts, 2 * inter, hidden), np_dtype), np.zeros((experts, hidden, inter), np_dtype)
        h = kernels.run("MoeGateUpSwiglu", x, ids, w1, np.zeros((0, inter), np_dtype), dtype=dtype)
        kernels.run("MoeDownCombine", h, ids, weights, w2, np.zeros((0, hidden), np_dtype), dtype=dtype)
        for group in (None, 128):
            (q1, s1), (q2, s2) = quantize_int8(np.ones(w1.shape), group), quantize_int8(np.ones(w2.shape), group)
            h = kernels.run(q_op("MoeGateUpSwiglu", q1, s1), x, ids, q1, s1, np.zeros((0, inter), np_dtype), dtype=dtype)
            kernels.run(q_op("MoeDownCombine", q2, s2), h, ids, weights, q2, s2, np.zeros((0, hidden), np_dtype), dtype=dtype)
            kernels.run(q_op("GateUpSwiglu", q1[0], s1[0]), x, q1[0], s1[0], np.zeros((0, inter), np_dtype), dtype=dtype)
            kernels.run(q_op("Linear", q1[0], s1[0]), x, q1[0], s1[0], np.zeros((0, 2 * inter), np_dtype), dtype=dtype)
        kernels.run("GateUpSwiglu", x, w1[0], np.zeros((0, inter), np_dtype), dtype=dtype)
        kernels.run("Linear", x, w1[0], np.zeros((0, 2 * inter), np_dtype), dtype=dtype)
        kernels.run("RmsNorm", x, np.ones(hidden, np_dtype), np.ones(1, np.float32), np.zeros_like(x), dtype=dtype)
        kernels.run("Add", x, x, np.zeros_like(x), dtype=dtype)


@pytest.mark.parametrize("path", ["onednn", "onednn-swapped"])
def test_experts_on_onednn_in_parallel_threads(path):
    """The experts' GEMMs run in the pool's threads at once, each on oneDNN with primitives that another thread
    created: every call right (oneDNN's own per-thread scratchpad gave 137 of 200 wrong here before the kernels
    gave each call the caller's)."""
    rng = np.random.default_rng(0)
    tokens, k, experts, hidden, inter = 64, 2, 8, 256, 192  # 16 rows per expert: every expert in its own thread
    x, x64 = to_tensor(rng.standard_normal((tokens, hidden)), "bfloat16")
    w, w64 = to_tensor(rng.standard_normal((experts, 2 * inter, hidden)) / 16, "bfloat16")
    ids = np.stack([rng.permutation(experts)[:k] for _ in range(tokens)]).astype(np.int32)
    order = np.argsort(ids.ravel(), kind="stable")
    g = np.einsum("ph,pih->pi", x64[order // k], w64[ids.ravel()[order]])
    want = rnd(silu(g[:, :inter]) * g[:, inter:], "bfloat16")
    xb, wb = x.asnumpy().view(np.uint16), w.asnumpy().view(np.uint16)
    with kernels.forced_path(path):
        assert kernels.path("bfloat16", 16) == path  # oneDNN runs bfloat16 here
        for _ in range(40):
            h = kernels.run("MoeGateUpSwiglu", xb, ids, wb, np.zeros((tokens * k, inter), np.uint16), dtype="bfloat16")
            got = (np.asarray(h, np.uint32) << 16).view(np.float32).astype(np.float64)
            np.testing.assert_allclose(got, want, atol=TOL["bfloat16"][0], rtol=TOL["bfloat16"][1])


def test_one_launch_per_grouped_gemm_and_one_compile_for_every_token_count():
    """The router's logits are one Linear; the experts are two calls, whatever T."""
    ms.set_context(mode=ms.GRAPH_MODE)
    moe = _moe(seed=8)
    moe.set_inputs(ms.Tensor(shape=[None, H], dtype=ms.float32))
    p = _params(moe)
    for t in (1, 5, 100):
        x, x64 = to_tensor(np.random.default_rng(t).standard_normal((t, H)), "float32")
        before = kernels.launches()
        _close(moe(x), ref_block(x64, p)[0], "float32", f"T={t}")
        after = kernels.launches()
        assert {op: after[op] - before[op] for op in after} == dict.fromkeys(kernels.ops(), 0) | {
            "Linear": 1, "MoeGateUpSwiglu": 1, "MoeDownCombine": 1}
    assert len(moe.compile_cache) == 1


@pytest.mark.parametrize("backend", ["cpu", "composite", "ascend"])
def test_the_graph_does_not_grow_with_the_experts(backend, tmp_path):
    """The exported graph of an E=8 and an E=64 block hold the same nodes: no per-expert loop anywhere."""
    ms.set_context(mode=ms.GRAPH_MODE)
    nodes = {}
    for experts in (8, 64):
        moe = _moe("deepseek_v3", backend=backend, experts=experts, top_k=2)
        name = str(tmp_path / f"e{experts}")
        ms.export(moe, ms.Tensor(shape=[None, H], dtype=ms.float32), file_name=name, file_format="MINDIR")
        nodes[experts] = op_counts(name + ".mindir")
    assert nodes[8] == nodes[64]
    if backend == "ascend":
        assert {"MoeInitRoutingV2", "GroupedMatmulV4", "Swiglu"} <= set(op_types(str(tmp_path / "e8.mindir")))


def test_ascend_stores_the_experts_in_out_and_loads_them_transposed(tmp_path):
    make_checkpoint(tmp_path / "q", model_type="qwen3_moe", hidden=H, inter=40, moe_inter=I, experts=E, top_k=K,
                    layers=1, config_extra={"norm_topk_prob": True})
    moe = load_moe(str(tmp_path / "q"), 0, backend="ascend")
    w, _ = load_moe_layer(str(tmp_path / "q"), 0)
    assert moe.experts.gate_up_proj.shape == (E, H, 2 * I) and moe.experts.down_proj.shape == (E, I, H)
    np.testing.assert_array_equal(moe.experts.gate_up_proj.asnumpy(), np.swapaxes(w["gate_up"], 1, 2))
    np.testing.assert_array_equal(moe.experts.down_proj.asnumpy(), np.swapaxes(w["down"], 1, 2))


# ---- checkpoints of the four families ----------------------------------------------------------------------

CKPTS = {  # make_checkpoint arguments: sparse layers and the config.json keys that make them sparse
    "mixtral": dict(layers=2),
    "qwen2_moe": dict(layers=4, moe_inter=I, shared_inter=32, sparse=[1, 3],
                      config_extra={"decoder_sparse_step": 2, "mlp_only_layers": [], "norm_topk_prob": False,
                                    "shared_expert_intermediate_size": 32}),
    "qwen3_moe": dict(layers=3, moe_inter=I, sparse=[0, 2],
                      config_extra={"decoder_sparse_step": 1, "mlp_only_layers": [1], "norm_topk_prob": True}),
    "deepseek_v3": dict(layers=3, moe_inter=I, shared_inter=I, sparse=[1, 2],
                        config_extra={"first_k_dense_replace": 1, "n_shared_experts": 1, "n_group": 4,
                                      "topk_group": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
                                      "scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1}),
}


@pytest.fixture(scope="module")
def family_ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: (str(root / f), make_checkpoint(root / f, model_type=f, hidden=H, inter=40 if f != "mixtral" else I,
                                               experts=E, top_k=K, seed=9, dtype="bfloat16" if f == "deepseek_v3"
                                               else "float32", **kw)) for f, kw in CKPTS.items()}


@pytest.mark.parametrize("family", list(CKPTS))
def test_each_family_loads_its_sparse_and_dense_layers(family_ckpts, family):
    ms.set_context(mode=ms.GRAPH_MODE)
    folder, stored = family_ckpts[family]
    config = read_config(folder)
    want_sparse = set(CKPTS[family].get("sparse", range(CKPTS[family]["layers"])))
    assert config.sparse_layers == want_sparse
    dtype = "bfloat16" if family == "deepseek_v3" else "float32"
    x, x64 = to_tensor(np.random.default_rng(1).standard_normal((6, H)), dtype)
    for layer in range(config.num_hidden_layers):
        block = load_block(folder, layer, backend="cpu")
        if layer in want_sparse:
            assert isinstance(block, PackedMoE)
            if family == "deepseek_v3":  # stored float32 on the Hub and kept so: it only chooses
                assert block.router.e_score_correction_bias.dtype == ms.float32
            _close(block(x), ref_block(x64, stored_params(family, stored, layer), dtype)[0], dtype,
                   f"{family} layer {layer}")
        else:
            p = f"model.layers.{layer}.mlp."
            gate_up = np.concatenate([stored[p + "gate_proj.weight"], stored[p + "up_proj.weight"]]).astype(np.float64)
            _close(block(x), ref_mlp(x64, gate_up, stored[p + "down_proj.weight"].astype(np.float64), dtype), dtype,
                   f"{family} dense layer {layer}")


def test_config_keys_left_out_take_transformers_defaults():
    """A config.json without the optional keys reads as transformers' config classes define them
    (configuration_deepseek_v3.py: n_group 8, topk_group 4, routed_scaling_factor 2.5, n_shared_experts 1,
    first_k_dense_replace 3, norm_topk_prob True; configuration_qwen2_moe.py: shared_expert_intermediate_size
    5632, decoder_sparse_step 1, norm_topk_prob False); a hidden_act other than SiLU is refused."""
    from ms_swiglu.checkpoint.hf import parse_config  # noqa: PLC0415

    base = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32}
    ds = parse_config(dict(base, model_type="deepseek_v3", n_routed_experts=16), "c.json")
    assert ds.sparse_layers == {3, 4, 5} and ds.moe.router.n_group == 8 and ds.moe.router.topk_group == 4
    assert ds.moe.router.routed_scaling_factor == 2.5 and ds.moe.shared_intermediate_size == 32
    assert ds.moe.router.renormalize and ds.moe.router.scoring == "sigmoid"
    qw = parse_config(dict(base, model_type="qwen2_moe", num_experts=16), "c.json")
    assert qw.sparse_layers == set(range(6)) and qw.moe.shared_intermediate_size == 5632
    assert qw.moe.shared_expert_gate and not qw.moe.router.renormalize
    assert parse_config(dict(base, model_type="qwen3_moe", num_experts=16), "c.json").moe.shared_intermediate_size == 0
    with pytest.raises(ValueError, match="c.json: expected hidden_act one of 'silu', 'swish', got 'gelu'"):
        parse_config(dict(base, model_type="llama", hidden_act="gelu"), "c.json")


def test_experts_keep_their_own_dtype_beside_a_router_of_another(tmp_path):
    """Experts stored float32 beside a float16 router stay float32 (they were stacked in the router's dtype:
    1e5 became inf); experts of mixed dtypes are refused."""
    from safetensors.numpy import load_file, save_file  # noqa: PLC0415

    stored = make_checkpoint(tmp_path, model_type="qwen3_moe", hidden=H, inter=40, moe_inter=I, experts=E,
                             top_k=K, layers=1, config_extra={"norm_topk_prob": True})
    path = tmp_path / "model.safetensors"
    tensors = load_file(str(path))
    p = "model.layers.0.mlp."
    tensors[p + "gate.weight"] = tensors[p + "gate.weight"].astype(np.float16)
    tensors[p + "experts.1.up_proj.weight"][0, 0] = 1e5
    save_file(tensors, str(path), metadata={"format": "pt"})
    out, dtype = load_moe_layer(str(tmp_path), 0)
    assert dtype == "float32" and out["gate_up"].dtype == np.float32 and out["router"].dtype == np.float16
    assert out["gate_up"][1, I, 0] == 1e5
    np.testing.assert_array_equal(out["down"][2], stored[p + "experts.2.down_proj.weight"])
    tensors[p + "experts.3.down_proj.weight"] = tensors[p + "experts.3.down_proj.weight"].astype(np.float16)
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="expected gate, up and down in one dtype, got float32, float32, float16"):
        load_moe_layer(str(tmp_path), 0)
    for part in ("gate", "up", "down"):
        name = f"{p}experts.3.{part}_proj.weight"
        tensors[name] = tensors[name].astype(np.float16)
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="expected every expert in one dtype, got float32 for expert 0 and float16 "
                                         "for expert 3"):
        load_moe_layer(str(tmp_path), 0)


@pytest.mark.parametrize("family", ["qwen2_moe", "deepseek_v3"])
def test_tensor_parallel_ranks_sum_to_the_whole_block(family_ckpts, family):
    """Each rank reads its [gate_r; up_r] and down[:, r] of every expert and of the shared expert; the ranks'
    blocks before their AllReduce (built here with tp_size 1 on the rank's weights) sum to the whole block."""
    from ms_swiglu.checkpoint.load import layer_state
    from ms_swiglu.mlp import load_weights

    ms.set_context(mode=ms.GRAPH_MODE)
    folder, _ = family_ckpts[family]
    config, layer = read_config(folder), 1
    x, _ = to_tensor(np.random.default_rng(2).standard_normal((5, H)), "float32")
    whole = to_f64(load_moe(folder, layer, backend="cpu", dtype="float32")(x))
    parts = []
    for rank in range(2):
        w, _ = load_moe_layer(folder, layer, tp_size=2, rank=rank)
        m = config.moe
        kwargs = dict(m.block_kwargs(), shared_intermediate_size=m.shared_intermediate_size // 2)
        moe = PackedMoE(H, I // 2, E, K, backend="cpu", **kwargs)
        parts.append(to_f64(load_weights(moe, layer_state(config, layer, w), stored=True)(x)))
    np.testing.assert_allclose(parts[0] + parts[1], whole, atol=1e-5, rtol=1e-5)
    assert w["gate_up"].shape == (E, I, H) and w["shared_down"].shape[1] * 2 == CKPTS[family]["shared_inter"]


def test_cli_runs_and_converts_every_family(family_ckpts, tmp_path):
    from ms_swiglu.checkpoint import read_safetensors

    x = np.random.default_rng(2).standard_normal((2, 7, H)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    layers = {family: sorted(read_config(folder).sparse_layers)[-1] for family, (folder, _) in family_ckpts.items()}
    cases = []  # per family: run its last sparse layer, convert it --tp-size 2; in one process (conftest.cli_batch)
    for family, (folder, _) in family_ckpts.items():
        cases += [["run", "--checkpoint", folder, "--layer", layers[family], "--input", tmp_path / "x.npy",
                   "--output", tmp_path / f"{family}.npy", "--dtype", "float32"],
                  ["convert", "--checkpoint", folder, "--output", tmp_path / f"{family}.safetensors", "--tp-size", 2]]
    done = iter(cli_batch(cases))
    for family, (folder, stored) in family_ckpts.items():
        layer, r = layers[family], next(done)
        assert r.returncode == 0, r.stderr
        assert f"MoE 8 experts top-2 layer {layer} of {family}" in r.stdout
        want, _ = ref_block(x.reshape(-1, H).astype(np.float64), stored_params(family, stored, layer))
        np.testing.assert_allclose(np.load(tmp_path / f"{family}.npy"), want.reshape(x.shape), atol=1e-5, rtol=1e-5)
        r = next(done)
        assert r.returncode == 0, r.stderr
        tensors, _ = read_safetensors(str(tmp_path / f"{family}-tp1-of-2.safetensors"))
        q = f"model.layers.{layer}." + ("block_sparse_moe." if family == "mixtral" else "mlp.")
        assert tensors[q + "experts.gate_up_proj.weight"].shape == (E, I, H)  # [gate_1; up_1] of every expert
        np.testing.assert_array_equal(tensors[q + "gate.weight"], stored[q + "gate.weight"])
        if family == "deepseek_v3":  # the correction bias stays float32 in a bfloat16 file
            np.testing.assert_array_equal(tensors[q + "gate.e_score_correction_bias"],
                                          stored[q + "gate.e_score_correction_bias"])


def test_dense_and_sparse_layers_are_told_apart(family_ckpts):
    folder, _ = family_ckpts["deepseek_v3"]
    with pytest.raises(ValueError, match="layer 0: expected a mixture-of-experts layer, got a dense layer"):
        load_moe_layer(folder, 0)
    from ms_swiglu import load_dense_layer
    with pytest.raises(ValueError, match="layer 1: expected a dense layer, got a mixture-of-experts layer"):
        load_dense_layer(folder, 1)


if __name__ == "__main__" and sys.argv[1:] == ["no-tokens"]:
    _no_tokens()


# ---- a router is one config and one Cell ---------------------------------------------------------------------

class _FirstExperts(ms.nn.Cell):
    """A toy router: every token to experts 0..k-1, equal weights."""

    def __init__(self, num_experts, top_k):
        super().__init__()
        self.ids = ms.Tensor(np.arange(top_k, dtype=np.int32))
        self.top_k = top_k

    def construct(self, x):
        tokens = ms.ops.shape(x)[0]
        ids = ms.ops.broadcast_to(self.ids.reshape(1, -1), (tokens, self.top_k))
        return ms.ops.ones((tokens, self.top_k), ms.float32) / self.top_k, ids


class _FirstConfig:
    scoring = "first"

    def build(self, hidden_size, num_experts, top_k, *, dtype, backend):  # noqa: ARG002
        return _FirstExperts(num_experts, top_k)


def test_a_new_router_is_a_config_that_builds_its_cell_and_the_old_keywords_still_name_theirs():
    """PackedMoE takes any router config (here a toy one, defined in this test: nothing else changes) and the
    block computes the mean of the first k experts; scoring= and a router's own keywords build the registered
    configs; options of another router, or a config together with keywords, are refused."""
    from ms_swiglu.routing import ROUTERS, SigmoidGroups, Softmax  # noqa: PLC0415

    ms.set_context(mode=ms.GRAPH_MODE)
    moe = PackedMoE(H, I, E, K, backend="composite", router=_FirstConfig())
    x = np.random.default_rng(1).standard_normal((3, H)).astype(np.float32).astype(np.float64)
    gate_up, down = to_f64(moe.experts.gate_up_proj), to_f64(moe.experts.down_proj)
    got = to_f64(moe(ms.Tensor(x.astype(np.float32))))
    want = sum(ref_mlp(x, gate_up[e], down[e], "float32") for e in range(K)) / K
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    assert set(ROUTERS) == {"softmax", "sigmoid"}
    assert isinstance(PackedMoE(H, I, E, K, renormalize=False).router, SoftmaxTopK)
    ds = PackedMoE(H, I, E, K, scoring="sigmoid", n_group=4, topk_group=2)
    assert isinstance(ds.router, SigmoidGroupTopK) and (ds.router.n_group, ds.router.topk_group) == (4, 2)
    assert Softmax().scoring == "softmax" and SigmoidGroups(n_group=2).n_group == 2
    with pytest.raises(ValueError, match="router softmax: expected options among renormalize, got n_group"):
        PackedMoE(H, I, E, K, n_group=4)
    with pytest.raises(ValueError, match="expected a router config or scoring and its options, got both"):
        PackedMoE(H, I, E, K, router=Softmax(), renormalize=False)


def test_no_tokens_give_no_rows_and_leave_the_block_working(no_tokens_process):
    """An input without tokens ([0, H], [1, 0, H]) gives [..., 0, H] of its dtype, static and dynamic shapes, for
    every family, backend (cpu, composite), dtype and quantization (and a rank's block of tp_size 2); a
    dynamic-shape graph gives the same rows as before once it has run one. MindSpore's CPU kernels crashed on it
    (StridedSlice along dim 1 of [0, E]: SIGFPE; TopK on [0, G, 0]; OneHot) or ran wrong afterwards (Transpose):
    a process of its own (no_tokens_process), so that a crash fails this test only."""
    proc, cwd = no_tokens_process
    returncode = proc.wait(timeout=600)
    out, err = ((cwd / name).read_text(errors="replace") for name in ("stdout", "stderr"))
    status = f"signal {signal.Signals(-returncode).name}" if returncode < 0 else f"exit status {returncode}"
    assert returncode == 0, f"{status}:\n{out[-2000:]}{err[-4000:]}"
