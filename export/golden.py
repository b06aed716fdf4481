"""The golden cases of a kit: inputs in the dtype, the float32 golden outputs of every graph output, the branches
added into each (what the acceptance fits a gain to), and the tokens whose routing a correct device may choose
otherwise.

    golden_cases(req, hidden, gold, twin) -> [Case]

``gold`` is the network in float32 holding exactly the exported weights (no intermediate rounding), ``twin`` the
computation in the dtype. Graph outputs: the network's output, and for an FFN stack each block's MLP (or MoE)
output after it (``FFNStack(branch_outputs=True)``). Branches of an output: a dense MLP block's output itself; a
MoE block's routed part and its shared expert's (gated) part; a stack's output: its blocks' outputs.

The multi-token case routes at least one token to every expert of every MoE block: random tokens, then, for the
experts none of them reaches, tokens aimed at them (along their router rows) in place of random ones, checked
through the golden routers; what cannot be reached within the case's shape is listed (``Case.unreached``).
"""
import dataclasses
import json

import numpy as np

from ms_swiglu.checkpoint import to_bf16_bits
from ms_swiglu.export.verify_on_device import UNIT_ROUNDOFF

DEFAULT_SHAPES = ((1, 1), (2, 8))  # 1 token (decode) and 16 tokens (prefill)
MAX_TOKENS = 512  # the multi-token case grows to reach every expert, up to this many tokens


@dataclasses.dataclass
class Case:
    """One golden case: ``x`` [B, S, H] (float32 values of the dtype), ``outputs`` (float32, one per graph
    output), ``branches`` (per output, the golden branches added into it), ``excluded`` (token indices whose
    routing is ambiguous), ``unreached`` ({MoE block index: experts no token of the case reaches})."""

    x: np.ndarray
    outputs: list
    branches: list
    excluded: list
    unreached: dict
    peak: float = 0.0  # the int8 activation quantizers' largest 127 s mean|x| / mean(x^2) (W8A8; else 0)


def raw(tensor, dtype):
    """(float32 values, little-endian bytes in ``dtype``: bfloat16 as its 16-bit patterns) of a Tensor."""
    import mindspore as ms  # noqa: PLC0415

    values = tensor.astype(ms.float32).asnumpy()
    data = to_bf16_bits(values) if dtype == "bfloat16" else values.astype(np.dtype(dtype).newbyteorder("<"))
    return values, data.tobytes()


def shapes(req):
    """The (B, S) of each case: two seeds at a static shape, else 1 and 16 tokens."""
    if req.static_shape:
        return [tuple(req.static_shape)] * 2
    return list(DEFAULT_SHAPES)


def golden_cases(req, hidden, gold, twin):
    """The request's golden cases (:class:`Case`) from the float32 network ``gold``; ``twin`` (in the dtype)
    decides which tokens' routing is ambiguous."""
    import mindspore as ms  # noqa: PLC0415

    cases = []
    for case, (b, s) in enumerate(shapes(req)):
        rng = np.random.default_rng(req.seed * 1000 + case)
        x = rng.standard_normal((b * s, hidden)).astype(np.float32)
        unreached = {}
        if b * s > 1:
            x, unreached = _reach_every_expert(gold, x, rng, grow=not req.static_shape)
            if len(x) != b * s:  # grown: two sequences where the count allows
                b, s = (2, len(x) // 2) if len(x) % 2 == 0 else (1, len(x))
        xd = ms.Tensor(x.reshape(b, s, hidden)).astype(getattr(ms, req.dtype))
        x_values, _ = raw(xd, req.dtype)
        outputs, branches = _outputs(gold, ms.Tensor(x_values))
        cases.append(Case(x_values, outputs, branches, _ambiguous(gold, twin, ms.Tensor(x_values), xd, req.dtype),
                          unreached, quantizer_peak(gold, x_values)))
    return cases


def quantizer_peak(gold, x):
    """The largest ``127 s mean|v| / mean(v^2)`` over the rows v of every int8 activation quantizer's input (s the
    row's quantization step) when the float32 network ``gold`` runs on ``x``: the data's part of the acceptance's
    bound on rounding flips (``verify_on_device.acceptance``); 0 for a network without such quantizers. The
    inputs are read by running ``gold`` once in PyNative mode with the quantizers observed."""
    import mindspore as ms  # noqa: PLC0415
    from ms_swiglu import quant as formats  # noqa: PLC0415
    from ms_swiglu.quant import graph  # noqa: PLC0415

    if not any(formats.get(getattr(c, "quant", None)).quantizes_activations for _, c in gold.cells_and_names()):
        return 0.0
    peaks, tokens, static = [0.0], graph.quantize_tokens, graph.quantize_static

    def observe(v, step):
        a = np.abs(v.astype(ms.float32).asnumpy().astype(np.float64))
        a = a.reshape(-1, a.shape[-1])
        s = np.broadcast_to(np.asarray(step, np.float64).reshape(-1, 1), (a.shape[0], 1))
        mean_sq = np.mean(a * a, -1, keepdims=True)
        live = mean_sq[:, 0] > 0
        if live.any():
            peaks.append(float(np.max((127 * s * np.mean(a, -1, keepdims=True) / np.where(live[:, None], mean_sq,
                                                                                               1))[live])))

    def observe_tokens(v):
        q, s = tokens(v)
        observe(v, s.asnumpy())
        return q, s

    def observe_static(v, scale, offset):
        observe(v, scale.asnumpy())
        return static(v, scale, offset)

    mode = ms.get_context("mode")
    graph.quantize_tokens, graph.quantize_static = observe_tokens, observe_static
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        gold(ms.Tensor(x))
    finally:
        ms.set_context(mode=mode)
        graph.quantize_tokens, graph.quantize_static = tokens, static
    return max(peaks)


def _outputs(gold, x):
    """(every graph output, the branches of each) of the float32 network on ``x`` [B, S, H]."""
    from ms_swiglu.ffn import FFNStack  # noqa: PLC0415

    if isinstance(gold, FFNStack):
        h, mlps, parts = x, [], []
        for block in gold.blocks:
            n = block.post_attention_layernorm(h)
            h, m = block.step(h)
            mlps.append(m)
            parts.append(_parts(block.mlp, n, m))
        outputs = [h.asnumpy()] + [m.asnumpy() for m in mlps]
        return outputs, [outputs[1:]] + parts
    y = gold(x)
    return [y.asnumpy()], [_parts(gold, x, y)]


def _parts(block, x, y):
    """The branches of one block's output ``y`` on its input ``x``: a MoE block with a shared expert: (routed,
    shared); otherwise the output itself."""
    import mindspore as ms  # noqa: PLC0415
    from ms_swiglu.moe import PackedMoE  # noqa: PLC0415

    if not (isinstance(block, PackedMoE) and block.shared_expert is not None):
        return [y.asnumpy()]
    shared = block.shared_expert(x)
    if block.shared_expert_gate is not None:
        shared = ms.ops.sigmoid(block.shared_expert_gate(x)) * shared
    shared = shared.asnumpy()
    return [y.asnumpy() - shared, shared]


def moe_routers(gold, x):
    """[(block index, router ids [T, k], number of experts)] of every MoE block of the float32 network on the
    tokens ``x`` [T, H] (a stack's later blocks see what the earlier ones made of them)."""
    import mindspore as ms  # noqa: PLC0415
    from ms_swiglu.ffn import FFNStack  # noqa: PLC0415
    from ms_swiglu.moe import PackedMoE  # noqa: PLC0415

    blocks = list(gold.blocks) if isinstance(gold, FFNStack) else [gold]
    if not any(isinstance(getattr(b, "mlp", b), PackedMoE) for b in blocks):
        return []  # (no graph to compile for a dense network)
    h, found = ms.Tensor(x), []
    for i, block in enumerate(blocks):
        mlp, n = (block.mlp, block.post_attention_layernorm(h)) if isinstance(gold, FFNStack) else (block, h)
        if isinstance(mlp, PackedMoE):
            found.append((i, mlp.router(n)[1].asnumpy(), mlp.num_experts, mlp))
        if isinstance(gold, FFNStack):
            h = block(h)
    return found


def _reach_every_expert(gold, x, rng, grow):
    """Tokens ``x`` [T, H] with tokens aimed at the experts no token reaches: after them (``grow``, up to
    MAX_TOKENS in all) or in place of the last random ones; (the tokens, {block: experts still unreached})."""
    import mindspore as ms  # noqa: PLC0415

    random_tokens, aimed, hidden = x, np.zeros((0, x.shape[1]), np.float32), x.shape[1]
    for _ in range(8):
        routers = moe_routers(gold, x)
        missing = _unreached(routers)
        if not missing:
            return x, {}
        new = []
        for i, moe in ((i, moe) for i, _, _, moe in routers if i in missing):
            w = moe.router.weight.astype(ms.float32).asnumpy()  # [E, H]: a token along row e scores e highest
            for start in range(0, len(missing[i]), moe.top_k):
                rows = w[missing[i][start:start + moe.top_k]]
                d = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).sum(0)
                new.append(d / np.linalg.norm(d) * np.sqrt(hidden) + 0.1 * rng.standard_normal(hidden))
        aimed = np.concatenate([aimed, np.asarray(new, np.float32)])
        if grow:
            x = np.concatenate([random_tokens, aimed])[:max(MAX_TOKENS, len(random_tokens))]
        else:
            keep = max(len(random_tokens) - len(aimed), 0)
            x = np.concatenate([random_tokens[:keep], aimed[-len(random_tokens):]])
    return x, _unreached(moe_routers(gold, x))


def _unreached(routers):
    """{block: the experts none of its router's top-k reaches} for the blocks that have such experts."""
    out = {}
    for i, ids, experts, _ in routers:
        missing = sorted(set(range(experts)) - set(ids.reshape(-1).tolist()))
        if missing:
            out[i] = missing
    return out


def _ambiguous(gold, twin, x32, xd, dtype):
    """Tokens of a top-level MoE block whose experts a correct device may choose otherwise: the last chosen and the
    first passed-over router score within 8 roundings of a tie (the logits rounded to the dtype by softmax routers,
    summed over H in float32 by DeepSeek's), or a top-k that differs between the golden network and the
    computation in the dtype. A device that takes the other expert is off by a whole expert's output there."""
    from ms_swiglu.moe import PackedMoE  # noqa: PLC0415
    from ms_swiglu.routers import SigmoidGroupTopK  # noqa: PLC0415

    if not isinstance(gold, PackedMoE):
        return []
    h, k, router = x32.shape[-1], gold.top_k, gold.router
    x = x32.asnumpy().reshape(-1, h).astype(np.float64)
    scores = x @ router.weight.asnumpy().astype(np.float64).T  # [T, E]
    if isinstance(router, SigmoidGroupTopK):
        scores = 1 / (1 + np.exp(-scores)) + router.e_score_correction_bias.asnumpy()
        u = 2.0 ** -24 * np.sqrt(h)
    else:
        u = UNIT_ROUNDOFF[dtype] + 2.0 ** -24 * np.sqrt(h)
    ranked = -np.sort(-scores, -1)
    near = np.zeros(len(x), bool)
    if k < scores.shape[-1]:
        near = ranked[:, k - 1] - ranked[:, k] <= 8 * u * (np.abs(ranked[:, k - 1]) + np.abs(ranked[:, k]))
    a = np.sort(gold.router(x32.reshape(-1, h))[1].asnumpy(), -1)
    b = np.sort(twin.router(xd.reshape(-1, h))[1].asnumpy(), -1)
    return [int(t) for t in np.nonzero(near | (a != b).any(-1))[0]]


def save_cases(path, cases):
    """The cases to one .npz (the expert-parallel ranks read them from the exporting process)."""
    arrays, layout = {}, []
    for i, c in enumerate(cases):
        arrays[f"x{i}"] = c.x
        for j, (y, parts) in enumerate(zip(c.outputs, c.branches)):
            arrays[f"y{i}_{j}"], arrays[f"b{i}_{j}"] = y, np.stack(parts)
        layout.append({"outputs": len(c.outputs), "excluded": c.excluded, "peak": c.peak,
                       "unreached": {str(k): v for k, v in c.unreached.items()}})
    np.savez(path, layout=np.array(json.dumps(layout)), **arrays)


def load_cases(path):
    """The cases :func:`save_cases` wrote."""
    with np.load(path) as f:
        layout = json.loads(str(f["layout"]))
        return [Case(f[f"x{i}"], [f[f"y{i}_{j}"] for j in range(c["outputs"])],
                     [list(f[f"b{i}_{j}"]) for j in range(c["outputs"])], c["excluded"],
                     {int(k): v for k, v in c["unreached"].items()}, c["peak"]) for i, c in enumerate(layout)]
