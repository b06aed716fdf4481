"""A NumPy model of a correct Ascend device running this package's networks, and their float64 golden output.

:func:`describe` reads a Cell (a PackedSwiGLUMLP, PackedMoE, FFNBlock or FFNStack, or a Cell holding them) into
NumPy arrays as stored: bfloat16/float16 weights as their exact values in float32, int8 weights with their float32
scales. :func:`device` evaluates it as a correct device does:

* GEMMs on the Cube: products in float32 (exact for 16-bit operands), each k-block of the tile (16 for
  float16/bfloat16, 8 for float32) summed by a float32 tree, the blocks' partial sums accumulated in float32 in
  reverse order (an order neither NumPy's dot nor the golden uses);
* every stored intermediate rounded to the dtype (bfloat16 by round-to-nearest-even on the bits, float16 by
  np.float16): the GEMM outputs, the SwiGLU output, the routed experts' combine, the shared expert's gated
  product, the adds, the RMSNorm output;
* int8 and int4 weights dequantized as WeightQuantBatchMatmul / GroupedMatmulV4's antiquant does: the scale cast
  to the activation dtype, ``q * scale`` rounded to the dtype (per output row, or per group of a row; int4's q
  is ``u - z``, exact);
* int8 activations (W8A8) quantized from the dtype's values in float32 (per token at max|x| / 127, or static
  with the checkpoint's scale and offset), the integer products exact, times the per-token step and the row's
  float32 scale (QuantBatchMatmul, GroupedMatmulV4's A8W8); the golden quantizes its float64 values;
* SwiGLU gate first, ``silu(g) * u`` in float32 then rounded; RMSNorm ``w * x / sqrt(mean(x^2) + eps)`` in
  float32, rounded; routers as ``ms_swiglu.routers`` computes them (softmax: logits in the dtype, softmax and
  renormalisation in float32; DeepSeek-V3: a float32 GEMM, sigmoid, the correction bias for the choice only,
  group top-k, renormalised, times routed_scaling_factor); the routing weights cast to the dtype (the ascend
  MoeTokenUnpermute takes them in the activations' dtype) and the weighted sum in float32, rounded;
  Qwen2-MoE's shared expert times ``sigmoid(shared_expert_gate(x))`` in float32, rounded.

:func:`golden` evaluates the same network in float64 without any intermediate rounding (int8 weights as
``q * scale`` exactly) and returns it as float32. Both return ``(out, ids)``: ids is the list of every MoE
block's chosen experts [T, k] (the golden's and the device's expert sets are compared to exclude near-ties).

``fault`` makes :func:`device` a wrong device (see :data:`FAULTS`).
"""
import numpy as np

FAULTS = {
    "gate_up_swapped": "silu(up) * gate",
    "silu_missing": "gate * up",
    "down_transposed": "down's weight read along the wrong axis (W^T; needs H == I)",
    "experts_reordered": "expert e computed with expert e+1's weights",
    "not_renormalised": "the top-k weights not renormalised where the family renormalises",
    "scaling_dropped": "routed_scaling_factor left out",
    "g128_neighbour_scale": "int8-g128: each row's last group dequantized with its neighbour group's scale",
    "shared_gate_ignored": "Qwen2-MoE's shared expert added without sigmoid(shared_expert_gate(x))",
    "row_scale_shifted": "int8 per row: each row dequantized with the next row's scale",
    "bias_in_weights": "DeepSeek-V3: the routing weights taken from the biased scores (the correction bias)",
    "offset_ignored": "W8A8 static: the activations' offset left in the integer products (no folded bias)",
    "gain": "one branch (``gain@i``: the i-th of :func:`branches`) computed 1% too large",
}  # (faults_for: those that apply to a network)
GAIN = 0.01

TILE_K = {"float32": 8, "float16": 16, "bfloat16": 16}


# ---------------------------------------------------------------------------------------------------- rounding
def rnd(a, dtype):
    """float32 values (float64 is taken to float32 first) rounded to ``dtype``, as float32."""
    a = np.asarray(a, np.float32)
    if dtype == "float32":
        return a
    if dtype == "float16":
        return a.astype(np.float16).astype(np.float32)
    bits = np.ascontiguousarray(a).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16  # round to nearest, ties to even
    return bits.astype(np.uint32).view(np.float32)


def _f32(t):
    """A MindSpore Tensor / Parameter as a float32 NumPy array (16-bit values exactly)."""
    import mindspore as ms  # noqa: PLC0415

    if t.dtype in (ms.int8, ms.uint8):
        return t.asnumpy()
    return t.astype(ms.float32).asnumpy()


def _dtype_name(dt):
    return {"Float32": "float32", "Float16": "float16", "BFloat16": "bfloat16"}[str(dt)]


# ------------------------------------------------------------------------------------------------ describing
def _weight(cell, name, quant, unstore=None):
    """A projection weight ``cell.{name}`` in the canonical layout [..., out, in] (``unstore``: from the layout its
    Cell holds it in): float32 values, or the integers ``q`` with ``w = q * scale`` (per row or group: int8, and
    int4 as ``u - z``) and, for int8 activations (W8A8), how they are quantized (``act``: "dynamic", or "static"
    with ``scale`` the row's whole dequantization scale ``s_x s_w``, ``input_scale`` and ``input_offset``)."""
    from ms_swiglu import quant as formats  # noqa: PLC0415
    from ms_swiglu.schema import INPUT_OFFSET, INPUT_SCALE, SCALE, ZERO  # noqa: PLC0415

    method = formats.get(quant)
    arr = getattr(cell, name).asnumpy() if method.quantized else _f32(getattr(cell, name))
    if unstore is not None:
        arr = unstore(arr)
    if not method.quantized:
        return {"w": arr.astype(np.float32), "q": None}
    scale = _f32(getattr(cell, name + SCALE)).astype(np.float32)
    if method.bits == 4:
        from ms_swiglu.quant.int4 import unpack_int4  # noqa: PLC0415

        u = unpack_int4(arr).astype(np.int16)
        z = getattr(cell, name + ZERO).asnumpy().astype(np.int16) if method.zero_point else np.full(scale.shape, 8)
        q = (u.reshape(*scale.shape, -1) - z[..., None]).reshape(u.shape)
    else:
        q = arr.astype(np.int16)
    out = {"w": None, "q": q, "scale": scale, "quant": quant, "act": None}
    if method.quantizes_activations:
        out["act"] = method.activation.name.lower()
        if out["act"] == "static":
            out.update(input_scale=float(_f32(getattr(cell, name + INPUT_SCALE)).reshape(-1)[0]),
                       input_offset=float(_f32(getattr(cell, name + INPUT_OFFSET)).reshape(-1)[0]))
    return out


def describe(net):
    """The NumPy description of ``net`` (its parameters as stored and its settings)."""
    from ms_swiglu.ffn import FFNBlock, FFNStack  # noqa: PLC0415
    from ms_swiglu.mlp import PackedSwiGLUMLP  # noqa: PLC0415
    from ms_swiglu.moe import PackedMoE  # noqa: PLC0415

    if isinstance(net, FFNStack):
        return {"kind": "stack", "blocks": [describe(b) for b in net.blocks]}
    if isinstance(net, FFNBlock):
        norm = net.post_attention_layernorm
        eps = norm.norm.eps
        eps = float(eps.asnumpy().reshape(-1)[0]) if hasattr(eps, "asnumpy") else float(eps)
        return {"kind": "ffn", "dtype": _dtype_name(norm.weight.dtype), "norm": _f32(norm.weight), "eps": eps,
                "mlp": describe(net.mlp)}
    if isinstance(net, PackedSwiGLUMLP):
        gu, dn = net.gate_up_proj, net.down_proj
        return {"kind": "mlp", "dtype": _dtype_name(net.compute_dtype),
                "gate_up": _weight(gu, "weight", net.quant), "down": _weight(dn, "weight", net.quant)}
    if isinstance(net, PackedMoE):
        r, ex = net.router, net.experts
        sigmoid = hasattr(r, "e_score_correction_bias")
        router = {"scoring": "sigmoid" if sigmoid else "softmax", "w": _f32(r.weight), "k": net.top_k,
                  "renormalize": bool(r.renormalize), "dtype": _dtype_name(r.weight.dtype)}
        if sigmoid:
            router.update(bias=_f32(r.e_score_correction_bias), n_group=r.n_group, topk_group=r.topk_group,
                          scale=float(r.scale))
        return {"kind": "moe", "dtype": _dtype_name(net.compute_dtype), "router": router,
                "gate_up": _weight(ex, "gate_up_proj", net.quant, ex.unstore),
                "down": _weight(ex, "down_proj", net.quant, ex.unstore),
                "shared": None if net.shared_expert is None else describe(net.shared_expert),
                "shared_gate": None if net.shared_expert_gate is None else _f32(net.shared_expert_gate.weight)}
    blocks = [c for _, c in net.cells_and_names() if isinstance(c, (FFNStack, FFNBlock, PackedMoE, PackedSwiGLUMLP))]
    if not blocks:
        raise TypeError(f"describe: no block of this package in {type(net).__name__}")
    return describe(blocks[0])


# ------------------------------------------------------------------------------------------------ arithmetic
class _Golden:
    """float64, no intermediate rounding, int8 dequantized exactly."""

    def __init__(self):
        self.ids, self.parts, self.blocks, self.peaks = [], [], [], [0.0]

    fault = gain_at = None
    wide = np.float64

    def r(self, a, dtype):
        return np.asarray(a, np.float64)

    def gemm(self, a, w, dtype):
        return np.asarray(a, np.float64) @ np.asarray(w, np.float64).T

    def quantize(self, a, p):
        xq, step = _quantize(np.asarray(a, np.float64), p)
        self.peaks.append(quantizer_peak_of(a, p, step))
        return xq, step

    def weight(self, p, dtype, which=None):
        if p["q"] is None:
            return p["w"].astype(np.float64)
        q, s = p["q"].astype(np.float64), p["scale"].astype(np.float64)
        return _dequant(q, s)


def _dequant(q, s):
    if s.ndim == q.ndim:  # per group: [..., M, G]
        g = s.shape[-1]
        return (q.reshape(*q.shape[:-1], g, -1) * s[..., None]).reshape(q.shape)
    return q * s[..., None]


class _Device:
    """float32 arithmetic, Cube-tiled GEMMs, every stored intermediate rounded to the dtype."""

    wide = np.float32

    def __init__(self, fault=None):
        self.fault, self.ids, self.parts, self.blocks = fault, [], [], []
        self.gain_at = None
        if fault is not None and fault.startswith("gain@"):
            self.fault, self.gain_at = "gain", int(fault.split("@")[1])

    def r(self, a, dtype):
        return rnd(a, dtype)

    def gemm(self, a, w, dtype):
        return tiled_gemm(np.asarray(a, np.float32), np.asarray(w, np.float32), TILE_K[dtype])

    def quantize(self, a, p):
        return _quantize(np.asarray(a, np.float32), p, self.fault)

    def weight(self, p, dtype, which=None):
        if p["q"] is None:
            return p["w"]
        s = rnd(p["scale"], dtype)  # the antiquant scale in the activations' dtype
        if self.fault == "g128_neighbour_scale" and s.ndim == p["q"].ndim and s.shape[-1] > 1:
            s = s.copy()
            s[..., -1] = s[..., -2]
        if self.fault == "row_scale_shifted" and s.ndim < p["q"].ndim:
            s = np.roll(s, -1, axis=-1)
        return rnd(_dequant(p["q"].astype(np.float32), s), dtype)  # q * scale exact in float32, rounded


def _quantize(a, p, fault=None):
    """int8 activations as the device's quantizer gives them, in ``a``'s float type: (x_q - o [T, K] integers, the
    per-token step [T, 1]); dynamic: ``s = max|x| / 127``, ``x_q = round(x / s)``; static: ``x_q = clip(round(x /
    s_x + o), -128, 127)``, step 1 (the row scale holds ``s_x``). ``offset_ignored``: the offset left in."""
    wide = a.dtype.type
    if p["act"] == "dynamic":
        amax = np.abs(a).max(-1, keepdims=True)
        step = np.where(amax > 0, amax / wide(127), wide(1)).astype(a.dtype)
        return np.clip(np.rint(a / step), -127, 127), step
    o = wide(p["input_offset"])
    q = np.clip(np.rint(a / wide(p["input_scale"]) + o), -128, 127)
    return (q if fault == "offset_ignored" else q - o), np.ones((a.shape[0], 1), a.dtype)


def quantizer_peak_of(a, p, step):
    """The largest ``127 s mean|x| / mean(x^2)`` over the rows x of a quantizer's input ``a`` (s its step: the
    per-token step, or the static input scale), rows of zeros left out."""
    a = np.abs(np.asarray(a, np.float64))
    s = np.asarray(step, np.float64) if p["act"] == "dynamic" else np.full((a.shape[0], 1), p["input_scale"])
    ms_ = np.mean(a * a, -1, keepdims=True)
    live = ms_[:, 0] > 0
    return float(np.max((127 * s * np.mean(a, -1, keepdims=True) / np.where(live[:, None], ms_, 1))[live],
                        initial=0.0))


def quantizer_peak(spec, x):
    """The golden run's largest quantizer peak (:func:`quantizer_peak_of`) on ``x``: every int8 activation
    quantizer's input, MoE experts on their routed rows."""
    ctx = _Golden()
    _block(ctx, spec, rnd(x, dtype_of(spec)).astype(np.float64))
    return max(ctx.peaks)


def project(ctx, a, p, dtype):
    """``a W^T`` of a projection: its GEMM on the weight as the device reads it, or, for int8 activations, the
    integer products (exact) times the per-token step and the row scales, in the context's float type."""
    if p["q"] is None or p["act"] is None:
        return ctx.gemm(a, ctx.weight(p, dtype), dtype)
    xq, step = ctx.quantize(a, p)
    scale = p["scale"]
    if ctx.fault == "row_scale_shifted":
        scale = np.roll(scale, -1, axis=-1)
    acc = xq.astype(np.float64) @ p["q"].astype(np.float64).T  # exact: |sum| < 2^53
    return (acc.astype(ctx.wide) * step * scale.astype(ctx.wide)).astype(ctx.wide)


def tiled_gemm(a, w, tile):
    """``a w^T`` [T, K] x [N, K] -> [T, N] in float32: products, a float32 tree over each k-block of ``tile``,
    the blocks accumulated in float32 from the last to the first."""
    t, k = a.shape
    n = w.shape[0]
    pad = -k % tile
    if pad:
        a, w = np.pad(a, ((0, 0), (0, pad))), np.pad(w, ((0, 0), (0, pad)))
    nb = (k + pad) // tile
    out = np.empty((t, n), np.float32)
    step = max(1, (1 << 22) // max(1, n * (k + pad)))  # tokens per chunk: ~16 MB of products
    for s in range(0, t, step):
        p = (a[s:s + step, None, :] * w[None, :, :]).reshape(-1, n, nb, tile)  # float32 products
        while p.shape[-1] > 1:
            p = p[..., 0::2] + p[..., 1::2]
        p = p[..., 0]
        acc = np.zeros(p.shape[:2], np.float32)
        for b in range(nb - 1, -1, -1):
            acc = acc + p[..., b]
        out[s:s + step] = acc
    return out


def _sigmoid(v):
    return 1 / (1 + np.exp(-v))


# ---------------------------------------------------------------------------------------------------- blocks
def _mlp(ctx, gate_up, down, x, dtype):
    """One packed SwiGLU MLP: [T, H] -> [T, H]."""
    if x.shape[0] == 0:
        return np.zeros((0, down["q" if down["w"] is None else "w"].shape[-2]), ctx.wide)
    h = ctx.r(project(ctx, x, gate_up, dtype), dtype)  # [T, 2I]
    inter = h.shape[-1] // 2
    g, u = h[:, :inter], h[:, inter:]
    if ctx.fault == "gate_up_swapped":
        g, u = u, g
    act = g * u if ctx.fault == "silu_missing" else g * _sigmoid(g) * u  # in the wide type, then rounded
    a = ctx.r(act, dtype)
    if ctx.fault == "down_transposed":
        w = down["w"] if down["q"] is None else down["q"]
        if w.shape[0] != w.shape[1]:
            raise ValueError("down_transposed needs H == I")
        down = dict(down, **({"w": w.T} if down["q"] is None else {"q": w.T, "scale": down["scale"]}))
    return ctx.r(project(ctx, a, down, dtype), dtype)


def _topk(v, k):
    idx = np.argsort(-v, axis=-1, kind="stable")[:, :k]
    return np.take_along_axis(v, idx, -1), idx


def _router(ctx, r, x, dtype):
    wide = ctx.wide
    if r["scoring"] == "softmax":
        logits = ctx.r(ctx.gemm(x, r["w"], r["dtype"]), r["dtype"]).astype(wide)  # in the model dtype
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
        weights, idx = _topk(p, r["k"])
        if r["renormalize"] and ctx.fault != "not_renormalised":
            weights = weights / weights.sum(-1, keepdims=True)
        return weights.astype(wide), idx
    logits = ctx.r(ctx.gemm(x, r["w"], "float32"), "float32").astype(wide)  # float32 GEMM
    scores = _sigmoid(logits)
    choice = scores + r["bias"].astype(wide)
    t, e = choice.shape
    ng, size = r["n_group"], e // r["n_group"]
    if ng > 1:
        groups = np.sort(choice.reshape(t, ng, size), -1)[..., -2:].sum(-1)
        _, keep = _topk(groups, r["topk_group"])
        mask = np.zeros((t, ng), bool)
        np.put_along_axis(mask, keep, True, -1)
        choice = np.where(np.repeat(mask, size, -1), choice, -np.inf)
    _, idx = _topk(choice, r["k"])
    weights = np.take_along_axis(choice if ctx.fault == "bias_in_weights" else scores, idx, -1)
    if r["renormalize"] and ctx.fault != "not_renormalised":
        weights = weights / (weights.sum(-1, keepdims=True) + wide(1e-20))
    if ctx.fault != "scaling_dropped":
        weights = weights * wide(r["scale"])
    return weights.astype(wide), idx


def _expert(p, e):
    if p["q"] is None:
        return {"w": p["w"][e], "q": None}
    return dict(p, q=p["q"][e], scale=p["scale"][e])


def _moe(ctx, s, x):
    dtype = s["dtype"]
    weights, idx = _router(ctx, s["router"], x, dtype)
    ctx.ids.append(idx)
    if ctx.wide is np.float32:  # the ascend MoeTokenUnpermute takes the routing weights in the activations' dtype
        weights = rnd(weights, dtype)
    n_exp = s["router"]["w"].shape[0]
    t, k = idx.shape
    h = x.shape[1]
    ys = np.zeros((t, k, h), ctx.wide)
    for e in range(n_exp):
        rows, slots = np.nonzero(idx == e)
        if rows.size == 0:
            continue
        src = (e + 1) % n_exp if ctx.fault == "experts_reordered" else e
        ys[rows, slots] = _mlp(ctx, _expert(s["gate_up"], src), _expert(s["down"], src), x[rows], dtype)
    out = _part(ctx, ctx.r((weights[..., None] * ys).sum(1, dtype=ctx.wide), dtype))  # weighted in float32
    if s["shared"] is not None:
        sh = s["shared"]
        shared = _mlp(ctx, sh["gate_up"], sh["down"], x, sh["dtype"])
        if s["shared_gate"] is not None and ctx.fault != "shared_gate_ignored":
            gl = ctx.r(ctx.gemm(x, s["shared_gate"], dtype), dtype).astype(ctx.wide)  # [T, 1] in the dtype
            shared = ctx.r(_sigmoid(gl) * shared, dtype)
        out = ctx.r(out + _part(ctx, shared), dtype)
    return out


def _part(ctx, a):
    """A branch as computed (a dense MLP's output, a MoE block's routed or shared part), noted in order of
    evaluation; the ``gain`` fault scales the one it names."""
    if ctx.fault == "gain" and ctx.gain_at == len(ctx.parts):
        a = ctx.r(a * ctx.wide(1 + GAIN), "float32")
    ctx.parts.append(np.asarray(a, np.float64))
    return a


def _ffn(ctx, s, x):
    dtype, wide = s["dtype"], ctx.wide
    xw = x.astype(wide)
    var = np.mean(xw * xw, -1, keepdims=True)
    n = ctx.r(xw / np.sqrt(var + wide(s["eps"])) * s["norm"].astype(wide), dtype)
    m = _block(ctx, s["mlp"], n)
    ctx.blocks.append((np.asarray(m, np.float64), len(ctx.parts)))  # the block's branch, the parts up to it
    return ctx.r(xw + m.astype(wide), dtype)


def _block(ctx, s, x):
    kind = s["kind"]
    if kind == "stack":
        for b in s["blocks"]:
            x = _block(ctx, b, x)
        return x
    if kind == "ffn":
        return _ffn(ctx, s, x)
    if kind == "moe":
        return _moe(ctx, s, x)
    return _part(ctx, _mlp(ctx, s["gate_up"], s["down"], x, s["dtype"]))


def _walk(spec):
    """Every block description in ``spec`` (itself, its blocks, their MLPs and shared experts)."""
    yield spec
    for b in spec.get("blocks", ()):
        yield from _walk(b)
    for key in ("mlp", "shared"):
        if spec.get(key) is not None:
            yield from _walk(spec[key])


def _projections(spec):
    for s in _walk(spec):
        if s["kind"] in ("mlp", "moe"):
            yield "gate_up", s["gate_up"]
            yield "down", s["down"]


def faults_for(spec):
    """The faults of :data:`FAULTS` that change what ``spec``'s network computes."""
    blocks = list(_walk(spec))
    moes = [s for s in blocks if s["kind"] == "moe"]
    out = ["gate_up_swapped", "silu_missing"]
    down = [p["w"] if p["q"] is None else p["q"] for name, p in _projections(spec) if name == "down"]
    if all(w.shape[-1] == w.shape[-2] for w in down):
        out.append("down_transposed")
    if moes:
        out.append("experts_reordered")
    if any(m["router"]["renormalize"] for m in moes):
        out.append("not_renormalised")
    if any(m["router"]["scoring"] == "sigmoid" and m["router"]["scale"] != 1 for m in moes):
        out.append("scaling_dropped")
    if any(p["q"] is not None and p["scale"].ndim == p["q"].ndim and p["scale"].shape[-1] > 1
           for _, p in _projections(spec)):
        out.append("g128_neighbour_scale")
    if any(m["shared_gate"] is not None for m in moes):
        out.append("shared_gate_ignored")
    if any(p["q"] is not None and p["scale"].ndim < p["q"].ndim for _, p in _projections(spec)):
        out.append("row_scale_shifted")
    if any(m["router"]["scoring"] == "sigmoid" and np.any(m["router"]["bias"] != 0) for m in moes):
        out.append("bias_in_weights")
    if any(p["q"] is not None and p["act"] == "static" and p["input_offset"] for _, p in _projections(spec)):
        out.append("offset_ignored")
    return out


def dtype_of(spec):
    while spec["kind"] == "stack":
        spec = spec["blocks"][0]
    return spec["dtype"]


def device(spec, x, fault=None, outputs=False):
    """A correct (or, with ``fault``, a wrong) device's output float32 [T, H] for input ``x`` (values of the
    dtype), and every MoE block's expert ids; ``outputs``: every output of the kit's graph instead of the first
    (:func:`graph_outputs`)."""
    if fault is not None and fault.split("@")[0] not in FAULTS:
        raise ValueError(f"fault: expected one of {sorted(FAULTS)}, got {fault!r}")
    ctx = _Device(fault)
    out = _block(ctx, spec, rnd(x, dtype_of(spec)))
    if outputs:
        return [np.asarray(o, np.float32) for o in graph_outputs(spec, out, ctx)[0]], ctx.ids
    return np.asarray(out, np.float32), ctx.ids


def golden(spec, x, outputs=False):
    """The float64 evaluation of the network on ``x`` (rounded to the dtype first, as the device gets it), as
    float32, and every MoE block's expert ids; ``outputs``: (every output of the kit's graph, the branches added
    into each) instead of the first (:func:`graph_outputs`)."""
    ctx = _Golden()
    out = _block(ctx, spec, rnd(x, dtype_of(spec)).astype(np.float64))
    if outputs:
        outs, branches = graph_outputs(spec, out, ctx)
        return ([o.astype(np.float32) for o in outs], [[b.astype(np.float32) for b in bs] for bs in branches]), ctx.ids
    return out.astype(np.float32), ctx.ids


def graph_outputs(spec, out, ctx):
    """The outputs of a kit's graph (a stack: its output, then each block's MLP or MoE output; otherwise the
    block's output) and, for each, the branches added into it (a stack's output: its blocks; a block: its dense
    MLP, or its MoE's routed and shared parts)."""
    if spec["kind"] != "stack":
        return [out], [ctx.parts]
    starts = [0] + [end for _, end in ctx.blocks]
    outs = [out] + [m for m, _ in ctx.blocks]
    branches = [[m for m, _ in ctx.blocks]] + [ctx.parts[a:b] for a, b in zip(starts, starts[1:])]
    return outs, branches


def branches(spec):
    """How many branches the network has (the ``gain@i`` faults): every dense MLP and MoE part, in order."""
    ctx = _Golden()
    h = (spec["blocks"][0] if spec["kind"] == "stack" else spec)
    h = h["norm"].shape[0] if h["kind"] == "ffn" else (h["gate_up"]["w"] if h["gate_up"]["w"] is not None
                                                        else h["gate_up"]["q"]).shape[-1]
    _block(ctx, spec, np.zeros((1, h)))
    return len(ctx.parts)


def routing_differs(ids_a, ids_b):
    """Token indices whose expert set differs in any MoE block between two runs' ids."""
    bad = set()
    for a, b in zip(ids_a, ids_b):
        sa, sb = np.sort(a, -1), np.sort(b, -1)
        bad.update(np.nonzero((sa != sb).any(-1))[0].tolist())
    return sorted(bad)
