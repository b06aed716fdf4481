"""Writes quantized checkpoint folders as the quantizers publish them (compressed-tensors ``pack-quantized`` and
``int-quantized``, AutoGPTQ v1 / GPTQModel v2, AutoAWQ GEMM, msModelSlim v1), for the tests.

Written from the formats' own documents and writers' sources (compressed-tensors' PackedQuantizationCompressor,
AutoGPTQ's ``QuantLinear.pack``, AutoAWQ's ``WQLinear_GEMM.from_linear``, msModelSlim's ``ascendv1`` saver),
independently of the package's reader (``ms_swiglu.checkpoint.quantized`` is neither imported nor copied): the
packers here loop over the nibble index with integer shifts, and the values the weights stand for are
dequantized here, from the scales as stored, in float32.
"""
import json
import os

import numpy as np
from safetensors import TensorSpec, serialize_file
from safetensors.numpy import load_file

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ gemm.py order_map: nibble i of a word holds column 8 c + AWQ_ORDER[i]
FORMATS = ("ct-w4a16", "ct-w8a16", "ct-w8a8", "gptq", "awq", "modelslim")
KWARGS = {"static", "input_scale", "input_offset", "checkpoint_format", "g_idx", "desc_act", "kind", "dtype",
          "ignore_extra"}
F32 = np.float32


def is_projection(name):
    """Whether ``name`` is a weight the quantizers convert: ``*_proj.weight`` or an expert's weight (Mixtral w1..w3)."""
    return name.endswith("_proj.weight") or (".experts." in name and name.endswith(".weight"))


# ---------------------------------------------------------------- storage helpers

def stored_scale(s, dtype):
    """(raw array, safetensors dtype, float32 values as stored) of the float32 scales ``s`` in ``dtype``;
    bfloat16 is rounded to nearest even on the bit pattern."""
    s = np.ascontiguousarray(s, F32)
    if dtype == "float32":
        return s, "float32", s.copy()
    if dtype == "float16":
        raw = s.astype(np.float16)
        return raw, "float16", raw.astype(F32)
    if dtype == "bfloat16":
        bits = s.view(np.uint32).astype(np.uint64)
        raw = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return raw, "bfloat16", (raw.astype(np.uint32) << 16).view(F32)
    raise ValueError(f"scale_dtype: expected float16, bfloat16 or float32, got {dtype!r}")


def pack_last(u, bits):
    """Unsigned values ``u`` [..., M] -> int32 words [..., ceil(M/pf)], pf = 32/bits: element m at bits
    ``bits * (m % pf)`` of word ``m // pf`` (low bits first); M is padded with 0."""
    pf = 32 // bits
    u = np.asarray(u, np.int64)
    assert u.min() >= 0 and u.max() < (1 << bits), "values out of the unsigned range"
    m = u.shape[-1]
    width = -(-m // pf) * pf
    padded = np.zeros(u.shape[:-1] + (width,), np.uint32)
    padded[..., :m] = u
    words = np.zeros(u.shape[:-1] + (width // pf,), np.uint32)
    for i in range(pf):  # nibble / byte index inside a word
        words |= padded[..., i::pf] << np.uint32(bits * i)
    return words.view(np.int32)


def pack_first(u, bits):
    """As :func:`pack_last` along axis 0: [M, C] -> [ceil(M/pf), C]."""
    return np.ascontiguousarray(pack_last(np.asarray(u).T, bits).T)


def pack_awq(u):
    """Unsigned 4-bit ``u`` [R, N] -> int32 [R, N/8] in AutoAWQ's GEMM order: nibble i of word c holds column
    8 c + AWQ_ORDER[i]."""
    u = np.asarray(u, np.int64)
    assert u.shape[1] % 8 == 0 and u.min() >= 0 and u.max() < 16
    words = np.zeros((u.shape[0], u.shape[1] // 8), np.uint32)
    for i in range(8):
        words |= u[:, AWQ_ORDER[i]::8].astype(np.uint32) << np.uint32(4 * i)
    return words.view(np.int32)


# ---------------------------------------------------------------- groups and quantizers

def group_index(k, group):
    """(g_idx int32 [k] = column // group, number of groups); ``group`` None: one group (per channel)."""
    g = k if group is None or group == -1 else group
    return (np.arange(k) // g).astype(np.int32), -(-k // g)


def group_min_max(w, g_idx, groups):
    """Per row and group, (min, max) of ``w`` [N, K] over the columns ``g_idx`` puts in the group: [N, groups]
    each (0 for an empty group)."""
    lo, hi = np.zeros((w.shape[0], groups), F32), np.zeros((w.shape[0], groups), F32)
    for g in range(groups):
        cols = np.flatnonzero(g_idx == g)
        if cols.size:
            lo[:, g], hi[:, g] = w[:, cols].min(1), w[:, cols].max(1)
    return lo, hi


def dequant(q, z, s, g_idx):
    """float32 ``(q - z[:, g_idx]) * s[:, g_idx]`` of ``q`` [N, K] with z, s [N, groups]."""
    return (q.astype(F32) - z[:, g_idx].astype(F32)) * s[:, g_idx]


def _scales(raw_scale, scale_dtype):
    """``stored_scale`` of a positive scale (0 -> 1, for an all-zero group)."""
    return stored_scale(np.where(raw_scale > 0, raw_scale, F32(1)), scale_dtype)


def quantize_ct(w, bits, g_idx, groups, symmetric, scale_dtype):
    """compressed-tensors' calculate_qparams + _quantize (signed int, range including 0): (q, z signed
    [N, groups], scale raw, scale dtype, scale float32); symmetric s = absmax / (2^b / 2), z = 0; asymmetric
    s = (max - min) / (2^b - 1), z = clip(round(-min / s) + qmin)."""
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    lo, hi = group_min_max(w, g_idx, groups)
    lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
    if symmetric:
        raw, kind, s = _scales(np.maximum(-lo, hi) / F32((qmax - qmin) / 2), scale_dtype)
        z = np.zeros_like(s, np.int64)
    else:
        raw, kind, s = _scales((hi - lo) / F32(qmax - qmin), scale_dtype)
        z = np.clip(np.rint(-lo / s) + qmin, qmin, qmax).astype(np.int64)
    q = np.clip(np.rint(w / s[:, g_idx]) + z[:, g_idx], qmin, qmax).astype(np.int64)
    return q, z, raw, kind, s


def quantize_gptq(w, g_idx, groups, symmetric, scale_dtype, zmin):
    """AutoGPTQ's Quantizer.find_params + quantize, 4 bits (range including 0): (q unsigned 0..15, z [N, groups],
    scale raw, dtype, float32); symmetric: s = 2 absmax / 15, z = 8; asymmetric s = (max - min) / 15,
    z = round(-min / s) clipped to ``zmin``..15."""
    lo, hi = group_min_max(w, g_idx, groups)
    lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
    if symmetric:
        hi = np.maximum(-lo, hi)
        lo = -hi
    raw, kind, s = _scales((hi - lo) / F32(15), scale_dtype)
    z = np.full(s.shape, 8, np.int64) if symmetric else np.clip(np.rint(-lo / s), zmin, 15).astype(np.int64)
    q = np.clip(np.rint(w / s[:, g_idx]) + z[:, g_idx], 0, 15).astype(np.int64)
    return q, z, raw, kind, s


def quantize_awq(w, g_idx, groups, scale_dtype):
    """AutoAWQ's pseudo_quantize_tensor with zero_point: s = max(max - min, 1e-5) / 15, z = clip(-round(min / s),
    0, 15), q = clip(round(w / s) + z, 0, 15): (q, z, scale raw, dtype, float32)."""
    lo, hi = group_min_max(w, g_idx, groups)
    raw, kind, s = _scales(np.maximum(hi - lo, F32(1e-5)) / F32(15), scale_dtype)
    z = np.clip(-np.rint(lo / s), 0, 15).astype(np.int64)
    q = np.clip(np.rint(w / s[:, g_idx]) + z[:, g_idx], 0, 15).astype(np.int64)
    return q, z, raw, kind, s


def quantize_rows_int8(w, scale_dtype):
    """Per-row symmetric int8: s = absmax / 127, q = clip(round(w / s), -127, 127): (q int8, raw, dtype, s [N, 1])."""
    raw, kind, s = _scales(np.abs(w).max(1, keepdims=True) / F32(127), scale_dtype)
    return np.clip(np.rint(w / s), -127, 127).astype(np.int8), raw, kind, s


# ---------------------------------------------------------------- one projection per format

def _per_prefix(value, prefix, default):
    """``value`` (None, one number, or {prefix: number}) for ``prefix``."""
    if isinstance(value, dict):
        return value.get(prefix, default)
    return default if value is None else value


def _ct_packed(p, w, o):
    """ct-w4a16 / ct-w8a16: weight_packed, weight_scale, weight_shape (+ weight_zero_point if asymmetric)."""
    bits = 4 if o["fmt"] == "ct-w4a16" else 8
    g_idx, groups = group_index(w.shape[1], o["group"])
    q, z, raw, kind, s = quantize_ct(w, bits, g_idx, groups, o["symmetric"], o["scale_dtype"])
    off = 1 << (bits - 1)
    out = {p + ".weight_packed": ("int32", pack_last(q + off, bits)), p + ".weight_scale": (kind, raw),
           p + ".weight_shape": ("int64", np.array(w.shape, np.int64))}
    if not o["symmetric"]:
        out[p + ".weight_zero_point"] = ("int32", pack_first(z + off, bits))
    return out, dequant(q, z, s, g_idx)


def _ct_int8(p, w, o):
    """ct-w8a8: weight int8 [N, K], weight_scale [N, 1] (+ input_scale float32 [1] when static)."""
    q, raw, kind, s = quantize_rows_int8(w, o["scale_dtype"])
    out = {p + ".weight": ("int8", q), p + ".weight_scale": (kind, raw)}
    if o["kw"].get("static"):
        x = F32(_per_prefix(o["kw"].get("input_scale"), p, 0.02))
        out[p + ".input_scale"] = ("float32", np.array([x], F32))
        o["extra"].setdefault("input_scale", {})[p] = float(x)
    return out, q.astype(F32) * s


def _gptq_g_idx(p, k, o):
    """The projection's g_idx: kw g_idx (an array of length K, {prefix: array}, or "shuffled": AutoGPTQ's
    desc_act map ``invperm[k] // G`` of a random permutation from ``seed``), else k // G."""
    given = o["kw"].get("g_idx")
    g = k if o["group"] in (None, -1) else o["group"]
    if isinstance(given, str) and given == "shuffled":
        perm = np.random.default_rng([o["seed"], k, len(o["extra"].get("g_idx", {}))]).permutation(k)
        return (np.argsort(perm) // g).astype(np.int32)
    if isinstance(given, dict):
        given = given.get(p)
    if given is None:
        return group_index(k, o["group"])[0]
    given = np.asarray(given, np.int32)
    if given.shape != (k,):
        raise ValueError(f"g_idx for {p}: expected {k} entries, got shape {given.shape}")
    return given


def _gptq(p, w, o):
    """gptq: qweight [K/8, N] along K, qzeros [K/G, N/8] along N (v1: z - 1), scales [K/G, N], g_idx [K]."""
    v1 = o["kw"].get("checkpoint_format", "gptq") == "gptq"
    g_idx = _gptq_g_idx(p, w.shape[1], o)
    groups = int(g_idx.max()) + 1
    q, z, raw, kind, s = quantize_gptq(w, g_idx, groups, o["symmetric"], o["scale_dtype"], 1 if v1 else 0)
    o["extra"].setdefault("g_idx", {})[p] = g_idx
    out = {p + ".qweight": ("int32", pack_first(q.T, 4)), p + ".qzeros": ("int32", pack_last(z.T - int(v1), 4)),
           p + ".scales": (kind, np.ascontiguousarray(raw.T)), p + ".g_idx": ("int32", g_idx)}
    return out, dequant(q, z, s, g_idx)


def _awq(p, w, o):
    """awq (GEMM): qweight [K, N/8] and qzeros [K/G, N/8] in AWQ_ORDER, scales [K/G, N]."""
    g_idx, groups = group_index(w.shape[1], o["group"])
    q, z, raw, kind, s = quantize_awq(w, g_idx, groups, o["scale_dtype"])
    out = {p + ".qweight": ("int32", pack_awq(q.T)), p + ".qzeros": ("int32", pack_awq(z.T)),
           p + ".scales": (kind, np.ascontiguousarray(raw.T))}
    return out, dequant(q, z, s, g_idx)


def _modelslim(p, w, o):
    """msModelSlim v1: W8A8_DYNAMIC / W8A16 weight, weight_scale, weight_offset (zeros) float32 [N, 1]; W8A8
    weight, input_scale, input_offset, deq_scale (float32 if bf16 model, else int64 of the float32 bits),
    quant_bias = round(0 / deq - input_offset * row sums)."""
    q, _, _, s = quantize_rows_int8(w, "float32")
    if o["kind"] != "W8A8":
        return {p + ".weight": ("int8", q), p + ".weight_scale": ("float32", s),
                p + ".weight_offset": ("float32", np.zeros_like(s))}, q.astype(F32) * s
    x = F32(_per_prefix(o["kw"].get("input_scale"), p, 0.02))
    off = F32(np.rint(_per_prefix(o["kw"].get("input_offset"), p, 3.0)))
    deq = (x * s[:, 0]).astype(F32)
    stored = deq if o["torch_dtype"] == "bfloat16" else np.frombuffer(deq.tobytes(), np.int32).astype(np.int64)
    bias = np.rint(-float(off) * q.astype(np.int64).sum(1).astype(np.float64)).astype(np.int32)
    for key, v in (("input_scale", float(x)), ("input_offset", float(off)), ("deq_scale", deq)):
        o["extra"].setdefault(key, {})[p] = v
    return {p + ".weight": ("int8", q), p + ".input_scale": ("float32", np.array([x], F32)),
            p + ".input_offset": ("float32", np.array([off], F32)),
            p + ".deq_scale": ("float32" if stored.dtype == F32 else "int64", stored),
            p + ".quant_bias": ("int32", bias)}, q.astype(F32) * s


WRITERS = {"ct-w4a16": _ct_packed, "ct-w8a16": _ct_packed, "ct-w8a8": _ct_int8, "gptq": _gptq, "awq": _awq,
           "modelslim": _modelslim}


# ---------------------------------------------------------------- config.json

def ct_config(o, ignore):
    """compressed-tensors quantization_config of ``o``'s format."""
    int8 = o["fmt"] == "ct-w8a8"
    bits = 4 if o["fmt"] == "ct-w4a16" else 8
    group = None if int8 or o["group"] in (None, -1) else o["group"]
    weights = {"num_bits": bits, "type": "int", "symmetric": True if int8 else o["symmetric"],
               "strategy": "group" if group else "channel", "group_size": group, "dynamic": False,
               "actorder": None, "observer": "minmax"}
    acts = None
    if int8:
        static = bool(o["kw"].get("static"))
        acts = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "tensor" if static else "token",
                "dynamic": not static, "group_size": None, "actorder": None,
                "observer": "minmax" if static else None}
    fmt = "int-quantized" if int8 else "pack-quantized"
    return {"quant_method": "compressed-tensors", "format": fmt,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts,
                                          "output_activations": None, "format": fmt}},
            "ignore": list(ignore) + ["lm_head"] + list(o["kw"].get("ignore_extra", ())),
            "quantization_status": "compressed", "sparsity_config": {}, "transform_config": {},
            "kv_cache_scheme": None, "version": "0.12.0"}


def gptq_config(o, ignore):
    """AutoGPTQ / GPTQModel quantization_config (4 bits)."""
    g_idx = o["extra"].get("g_idx", {}).values()
    desc_act = o["kw"].get("desc_act", any(bool(np.any(np.diff(g) < 0)) for g in g_idx))
    return {"quant_method": "gptq", "bits": 4, "group_size": -1 if o["group"] in (None, -1) else o["group"],
            "desc_act": desc_act, "sym": o["symmetric"], "checkpoint_format": o["kw"].get("checkpoint_format", "gptq"),
            "true_sequential": True, "damp_percent": 0.01, "static_groups": False,
            "modules_to_not_convert": list(ignore)}


def awq_config(o, ignore):
    """AutoAWQ's to_transformers_dict (GEMM, zero points)."""
    return {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": o["group"], "zero_point": True,
            "modules_to_not_convert": list(ignore)}


# ---------------------------------------------------------------- the folder

def write_safetensors(path, entries):
    """``{name: (safetensors dtype, array)}`` -> one safetensors file (metadata format pt)."""
    arrays = {n: (d, np.ascontiguousarray(a)) for n, (d, a) in entries.items()}
    specs = {n: TensorSpec(dtype=d, shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
             for n, (d, a) in arrays.items()}
    serialize_file(specs, path, metadata={"format": "pt"})


def _options(fmt, group, symmetric, scale_dtype, seed, kw, config):
    """The per-call settings the writers share (``extra`` is filled in by them)."""
    unknown = set(kw) - KWARGS
    if fmt not in FORMATS or unknown:
        raise ValueError(f"to_quantized: unknown format {fmt!r}" if fmt not in FORMATS else f"unknown kw {unknown}")
    kind = kw.get("kind", "W8A8_DYNAMIC")
    if fmt == "modelslim" and kind not in ("W8A8_DYNAMIC", "W8A8", "W8A16"):
        raise ValueError(f"modelslim kind: {kind!r}")
    torch_dtype = kw.get("dtype", config.get("torch_dtype"))
    return {"fmt": fmt, "group": group, "symmetric": symmetric if fmt != "awq" else False,
            "scale_dtype": scale_dtype, "seed": seed, "kw": kw, "kind": kind, "torch_dtype": torch_dtype,
            "extra": {"format": fmt, "prefixes": [], "ignored": []}}


def _write_config(src, dst, o, described):
    """config.json of ``src`` with the format's quantization fields (msModelSlim: quant_model_description.json)."""
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config.pop("quantization_config", None)
    if "dtype" in o["kw"]:
        config["torch_dtype"] = o["kw"]["dtype"]
    ignore = o["extra"]["ignored"]
    fmt = o["fmt"]
    if fmt == "modelslim":
        desc = {"model_quant_type": o["kind"], "version": "1.0.0", "group_size": 0, **described}
        with open(os.path.join(dst, "quant_model_description.json"), "w") as f:
            json.dump(desc, f, indent=2)
    else:
        build = ct_config if fmt.startswith("ct-") else gptq_config if fmt == "gptq" else awq_config
        config["quantization_config"] = build(o, ignore)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def to_quantized(src, dst, fmt, *, group=128, symmetric=True, scale_dtype="float16", skip=(), seed=0, **kw):
    """The float32 single-file checkpoint ``src`` rewritten to ``dst`` in ``fmt`` (one of FORMATS): every
    projection (``*_proj.weight``, expert weights) not in ``skip`` quantized, the rest as it was.

    kw: ct-w8a8 ``static``, ``input_scale``; gptq ``checkpoint_format`` ("gptq" | "gptq_v2"), ``g_idx`` (array,
    {prefix: array} or "shuffled", seeded by ``seed``), ``desc_act``; modelslim ``kind`` (W8A8_DYNAMIC | W8A8 |
    W8A16), ``input_scale``, ``input_offset``; any ``dtype`` (config torch_dtype); ct ``ignore_extra``.
    Returns ``(values, extra)``: values {tensor name: float32 values it stands for} (a projection: [N, K]
    dequantized here), extra {"format", "prefixes" (quantized), "ignored" (skipped prefixes), and per prefix
    "input_scale" / "input_offset" / "deq_scale" / "g_idx" where the format has them}."""
    with open(os.path.join(src, "config.json")) as f:
        o = _options(fmt, group, symmetric, scale_dtype, seed, kw, json.load(f))
    os.makedirs(dst, exist_ok=True)
    entries, values, described = {}, {}, {}
    for name, w in load_file(os.path.join(src, "model.safetensors")).items():
        w = np.ascontiguousarray(w, F32)
        if not is_projection(name) or name in skip:
            entries[name], values[name] = ("float32", w), w
            described[name] = "FLOAT"
            if is_projection(name):
                o["extra"]["ignored"].append(name[:-len(".weight")])
            continue
        prefix = name[:-len(".weight")]
        out, values[name] = WRITERS[fmt](prefix, w, o)
        entries.update(out)
        described.update({n: o["kind"] for n in out})
        o["extra"]["prefixes"].append(prefix)
    write_safetensors(os.path.join(dst, "model.safetensors"), entries)
    _write_config(src, dst, o, described)
    return values, o["extra"]
