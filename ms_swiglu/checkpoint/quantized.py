"""Quantized checkpoints as they are published: compressed-tensors (``pack-quantized``, ``int-quantized``,
``naive-quantized``), GPTQ (v1 and v2), AWQ (``gemm``) and msModelSlim (``quant_model_description.json``). Each is an
:class:`Encoding`: which projections it stores quantized, in which weight format (``ms_swiglu.quant``), and how to
read a rank's block of one into that format's parts. Bit orders and zero-point conventions are the writers' own
(docs/quantization.md cites them); a split that would cut a packed word or a group is refused with the numbers.
Anything else in a ``quantization_config`` is refused by name. No MindSpore here.

Shapes: a projection is ``[N, K]`` (out, in); ``part`` = (rows, columns), slices of it, or None for all of it.
"""
import json
import os
import re

import numpy as np

from ms_swiglu import quant as formats
from ms_swiglu.errors import CheckpointError
from ms_swiglu.quant.base import Activation
from ms_swiglu.quant.int4 import pack_int4
from ms_swiglu.schema import INPUT_OFFSET, INPUT_SCALE, SCALE, ZERO

MODELSLIM_DESCRIPTION = "quant_model_description.json"
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds column 8 c + AWQ_ORDER[i]


def _span(part, n, axis):
    """(start, stop) of ``part``'s slice on ``axis`` of a dimension of ``n``."""
    if part is None:
        return 0, n
    start, stop, _ = part[axis].indices(n)
    return start, stop


def _whole(what, start, stop, unit, name, why):
    """The span divided by ``unit`` (a packed word's or a group's inputs), or the split is refused."""
    if start % unit or stop % unit:
        raise CheckpointError(f"{name}: expected a rank's {what} {start}..{stop - 1} to hold whole {why} of {unit}, "
                              f"got a split that cuts one (choose a --tp-size whose block is a multiple of {unit})")
    return slice(start // unit, stop // unit)


def _nibbles(words, axis):
    """int32 words -> their eight 4-bit values, low bits first, along ``axis`` (0 or 1): [n, w] -> [8n, w] or
    [n, 8w] (uint8)."""
    u = np.asarray(words).astype(np.uint32)
    v = np.stack([(u >> (4 * i)) & 15 for i in range(8)], axis=axis + 1).astype(np.uint8)
    return v.reshape(-1, v.shape[-1]) if axis == 0 else v.reshape(v.shape[0], -1)


def _bytes(words, axis):
    """int32 words -> their four 8-bit values, low bits first, along ``axis``."""
    u = np.asarray(words).astype(np.uint32)
    v = np.stack([(u >> (8 * i)) & 255 for i in range(4)], axis=axis + 1).astype(np.uint8)
    return v.reshape(-1, v.shape[-1]) if axis == 0 else v.reshape(v.shape[0], -1)


def _finite_scales(name, scale):
    scale = np.asarray(scale, np.float32)
    bad = int((~(np.isfinite(scale) & (scale > 0))).sum())
    if bad:
        raise CheckpointError(f"{name}: expected finite positive scales, got {bad} of {scale.size} that are not")
    return scale


def _read(shards, name, shape, part=None):
    if name not in shards.weight_map:
        raise CheckpointError(f"checkpoint: expected tensor {name}, found none")
    return shards.read(name, shape, part)[0]


class Encoding:
    """A quantized checkpoint's projections: ``method`` (the weight format they are read into), ``dtype`` (the
    compute dtype: the config's), and for each projection (its weight's name without ``.weight``) whether it is
    stored quantized and its parts."""

    method = None
    dtype = "bfloat16"
    source = ""  # the format's name, for messages

    def stored(self, prefix):  # noqa: ARG002
        """Whether the projection ``prefix`` is stored quantized (not ignored)."""
        return True

    def method_of(self, prefix):  # noqa: ARG002
        """The weight format the projection ``prefix`` is read into."""
        return self.method

    def read(self, shards, prefix, shape, part=None):
        """``{suffix: array}`` of the rank's block ``part`` of the projection ``prefix`` (``[N, K]``)."""
        raise NotImplementedError


def _int4(group, zero_point, name):
    if not isinstance(group, int) or isinstance(group, bool) or group < 2 or group % 2:
        raise CheckpointError(f"{name}: expected a positive even group size, got {group!r} (per-channel int4, "
                              f"group -1, is not supported)")
    return formats.get(f"int4-g{group}" + ("-zp" if zero_point else ""))


def _int8(group, name):
    if group is None:
        return formats.get("int8")
    if not isinstance(group, int) or isinstance(group, bool) or group < 1:
        raise CheckpointError(f"{name}: expected a positive group size, got {group!r}")
    return formats.get(f"int8-g{group}")


# ---- compressed-tensors -----------------------------------------------------------------------------------------

class CompressedTensors(Encoding):
    """``quant_method: compressed-tensors``: one config group whose weights are int (4 or 8 bits, ``pack-quantized``:
    int32 ``weight_packed`` along K, low bits first, stored + 2^(bits-1); ``weight_scale`` [N, K/G] or [N, 1];
    ``weight_zero_point`` packed along N), or int8 ``int-quantized`` / ``naive-quantized`` with dynamic per-token
    or static per-tensor int8 activations; ``ignore`` names (exact or ``re:``, anchored at the start) stay float."""

    source = "compressed-tensors"

    def __init__(self, qc, path, dtype):
        self.dtype = dtype
        where = f"{path}: quantization_config"
        for key in ("sparsity_config", "transform_config"):
            if qc.get(key):
                raise CheckpointError(f"{where}.{key}: expected none (no sparsity or transforms), got {qc[key]!r}")
        groups = qc.get("config_groups")
        if not isinstance(groups, dict) or len(groups) != 1:
            raise CheckpointError(f"{where}.config_groups: expected one group (one scheme for the MLPs), got "
                                  f"{groups!r}"[:300])
        (gname, scheme), = groups.items()
        where = f"{where}.config_groups.{gname}"
        if not isinstance(scheme, dict):
            raise CheckpointError(f"{where}: expected a scheme, got {scheme!r}")
        if scheme.get("output_activations"):
            raise CheckpointError(f"{where}.output_activations: expected none, got {scheme['output_activations']!r}")
        w, a = scheme.get("weights") or {}, scheme.get("input_activations")
        fmt = scheme.get("format") or qc.get("format")
        bits, kind, strategy = w.get("num_bits"), w.get("type", "int"), w.get("strategy")
        symmetric, group, actorder = w.get("symmetric", True), w.get("group_size"), w.get("actorder")
        if strategy is None:
            strategy = "tensor" if group is None else "channel" if group == -1 else "group"
        self.targets, self.ignore = scheme.get("targets") or [], qc.get("ignore") or []
        if kind != "int" or bits not in (4, 8):
            raise CheckpointError(f"{where}.weights: expected int weights of 4 or 8 bits, got {kind} {bits} bits "
                                  f"(float8 and other schemes are not read)")
        if actorder == "group" or (actorder is True):
            raise CheckpointError(f"{where}.weights.actorder: expected none or 'weight' (group act-order stores a "
                                  f"g_idx this package does not read), got {actorder!r}")
        if a is None:
            if fmt != "pack-quantized" or strategy not in ("group", "channel"):
                raise CheckpointError(f"{where}: expected weight-only int weights in format pack-quantized with "
                                      f"strategy group or channel, got format {fmt!r}, strategy {strategy!r}")
            if strategy == "channel" and bits == 4:
                raise CheckpointError(f"{where}.weights: expected groups for int4 (per-channel int4 is not "
                                      f"supported), got strategy channel")
            self.bits, self.group = bits, group if strategy == "group" else None
            self.method = (_int4(group, not symmetric, where) if bits == 4 else
                           _int8(self.group, where) if symmetric else None)
            if self.method is None:
                raise CheckpointError(f"{where}.weights: expected symmetric int8 weights, got asymmetric ones")
            self.packed = True
            return
        if fmt not in ("int-quantized", "naive-quantized") or bits != 8 or strategy != "channel" or not symmetric:
            raise CheckpointError(f"{where}: expected W8A8 as int-quantized: int8 symmetric per-channel weights, "
                                  f"got format {fmt!r}, {bits} bits, strategy {strategy!r}, symmetric {symmetric}")
        a_strategy, dynamic = a.get("strategy"), a.get("dynamic", False)
        if a.get("num_bits") != 8 or a.get("type", "int") != "int" or not a.get("symmetric", True):
            raise CheckpointError(f"{where}.input_activations: expected symmetric int8, got {a!r}")
        if (a_strategy, dynamic) == ("token", True):
            self.method = formats.get("w8a8")
        elif (a_strategy, dynamic) == ("tensor", False):
            self.method = formats.get("w8a8-static")
        else:
            raise CheckpointError(f"{where}.input_activations: expected dynamic per-token or static per-tensor int8, "
                                  f"got strategy {a_strategy!r}, dynamic {dynamic!r}")
        self.bits, self.group, self.packed = 8, None, False

    def stored(self, prefix):
        for target in self.ignore:
            if (re.match(target[3:], prefix) is not None) if target.startswith("re:") else target == prefix:
                return False
        return True

    def read(self, shards, prefix, shape, part=None):
        n, k = shape
        (r0, r1), (c0, c1) = _span(part, n, 0), _span(part, k, 1)
        if not self.packed:  # int8 [N, K], weight_scale [N, 1]
            q = _read(shards, f"{prefix}.weight", (n, k), part)
            if q.dtype != np.int8:
                raise CheckpointError(f"{prefix}.weight: expected int8 (int-quantized), got {q.dtype}")
            scale = _finite_scales(f"{prefix}.weight_scale",
                                   _read(shards, f"{prefix}.weight_scale", (n, 1), (slice(r0, r1), slice(None))))
            out = {"": q, SCALE: scale[:, 0]}
            if self.method.activation is Activation.STATIC:
                s = _finite_scales(f"{prefix}.input_scale", _read(shards, f"{prefix}.input_scale", (1,)))
                out[INPUT_SCALE], out[INPUT_OFFSET] = s.reshape(1), np.zeros(1, np.float32)
                out[SCALE] = out[SCALE] * s[0]  # the format's scale is the row's whole dequantization scale
            return out
        per = 32 // self.bits
        words = _whole("inputs", c0, c1, per, f"{prefix}.weight_packed", "32-bit words")
        shape_name = f"{prefix}.weight_shape"
        if shape_name in shards.weight_map:
            stored_shape = [int(v) for v in _read(shards, shape_name, (2,))]
            if stored_shape != [n, k]:
                raise CheckpointError(f"{shape_name}: expected [{n}, {k}] from config.json, got {stored_shape}")
        w = _read(shards, f"{prefix}.weight_packed", (n, k // per), (slice(r0, r1), words))
        if w.dtype != np.int32:
            raise CheckpointError(f"{prefix}.weight_packed: expected int32 words, got {w.dtype}")
        g = self.group
        scale_cols = (slice(None) if g is None else _whole("inputs", c0, c1, g, f"{prefix}.weight_scale", "groups"))
        scale = _read(shards, f"{prefix}.weight_scale", (n, 1 if g is None else k // g), (slice(r0, r1), scale_cols))
        scale = _finite_scales(f"{prefix}.weight_scale", scale)
        if self.bits == 8:  # stored + 128 -> int8
            q = (_bytes(w, 1).astype(np.int16) - 128).astype(np.int8)
            return {"": q, SCALE: scale[:, 0] if g is None else scale}
        out = {"": pack_int4(_nibbles(w, 1)), SCALE: scale}
        if self.method.zero_point:  # int8 [N, K/G] stored + 8, packed along N: [N/8, K/G]
            rows = _whole("rows", r0, r1, 8, f"{prefix}.weight_zero_point", "32-bit words")
            z = _read(shards, f"{prefix}.weight_zero_point", (n // 8, k // g), (rows, scale_cols))
            out[ZERO] = _nibbles(z, 0)
        return out


# ---- GPTQ / AWQ ---------------------------------------------------------------------------------------------------

class GPTQ(Encoding):
    """``quant_method: gptq``: ``qweight`` int32 [K/8, N] (4 bits along K, low bits first), ``qzeros`` [K/G, N/8]
    along N (v1 ``gptq``: stored minus one), ``scales`` [K/G, N], ``g_idx`` [K] (act-order with a non-monotonic
    g_idx refused); ``w = (q - z) * s``."""

    source = "GPTQ"

    def __init__(self, qc, path, dtype):
        self.dtype, where = dtype, f"{path}: quantization_config"
        bits, group, sym = qc.get("bits"), qc.get("group_size"), qc.get("sym", True)
        fmt = qc.get("checkpoint_format", "gptq")
        if bits != 4:
            raise CheckpointError(f"{where}.bits: expected 4 (GPTQ int4), got {bits!r}")
        if fmt not in ("gptq", "gptq_v2"):
            raise CheckpointError(f"{where}.checkpoint_format: expected gptq or gptq_v2, got {fmt!r}")
        self.v1, self.group = fmt == "gptq", group
        self.method = _int4(group, not sym, f"{where}.group_size")
        self.skip = list(qc.get("modules_to_not_convert") or [])

    def stored(self, prefix):
        return not any(m in prefix for m in self.skip)

    def _zeros(self, z):
        return z + 1 if self.v1 else z  # v1 stores z - 1 (a zero of 0 wraps to 15 and reads as 16: refused)

    def _block(self, prefix, shape, part):
        """(n, k, the rows r0..r1 and inputs c0..c1 of the rank's block, the slice of the scales' groups)."""
        n, k = shape
        (r0, r1), (c0, c1) = _span(part, n, 0), _span(part, k, 1)
        return n, k, (r0, r1), (c0, c1), _whole("inputs", c0, c1, self.group, f"{prefix}.scales", "groups")

    def read(self, shards, prefix, shape, part=None):
        n, k, (r0, r1), (c0, c1), groups = self._block(prefix, shape, part)
        g = self.group
        krows = _whole("inputs", c0, c1, 8, f"{prefix}.qweight", "32-bit words")
        cols = slice(r0, r1)
        gidx = f"{prefix}.g_idx"
        if gidx in shards.weight_map:
            idx = _read(shards, gidx, (k,))
            if not np.array_equal(np.asarray(idx, np.int64), np.arange(k) // g):
                raise CheckpointError(f"{gidx}: expected groups in input order (k // {g}), got a permuted g_idx "
                                      f"(act-order, desc_act: not supported)")
        u = _nibbles(_read(shards, f"{prefix}.qweight", (k // 8, n), (krows, cols)), 0).T  # [N_r, K_r]
        scale = _finite_scales(f"{prefix}.scales", _read(shards, f"{prefix}.scales", (k // g, n), (groups, cols)).T)
        zrows = _whole("rows", r0, r1, 8, f"{prefix}.qzeros", "32-bit words")
        z = self._zeros(_nibbles(_read(shards, f"{prefix}.qzeros", (k // g, n // 8), (groups, zrows)), 1).astype(
            np.int16)).T  # [N_r, K_r/G]
        if not self.method.zero_point:
            if np.any(z != 8):
                raise CheckpointError(f"{prefix}.qzeros: expected zero points 8 (sym: true), got {np.unique(z)[:8]}")
            return {"": pack_int4(np.ascontiguousarray(u)), SCALE: np.ascontiguousarray(scale)}
        if np.any((z < 0) | (z > 15)):
            raise CheckpointError(f"{prefix}.qzeros: expected zero points 0..15, got {int(z.min())}..{int(z.max())}")
        return {"": pack_int4(np.ascontiguousarray(u)), SCALE: np.ascontiguousarray(scale),
                ZERO: np.ascontiguousarray(z.astype(np.uint8))}


class AWQ(GPTQ):
    """``quant_method: awq``, ``version: gemm``: ``qweight`` int32 [K, N/8] along N in the order
    [0, 2, 4, 6, 1, 3, 5, 7], ``qzeros`` [K/G, N/8] the same (not stored minus one), ``scales`` [K/G, N];
    ``w = (q - z) * s``."""

    source = "AWQ"

    def __init__(self, qc, path, dtype):  # noqa: PLW0231 -- its own fields
        self.dtype, where = dtype, f"{path}: quantization_config"
        bits, group = qc.get("bits", qc.get("w_bit")), qc.get("group_size", qc.get("q_group_size"))
        version = str(qc.get("version", "gemm")).lower()
        if bits != 4 or version != "gemm":
            raise CheckpointError(f"{where}: expected AWQ int4 version gemm, got bits {bits!r}, version {version!r}")
        if not qc.get("zero_point", True):
            raise CheckpointError(f"{where}.zero_point: expected true (AWQ gemm), got false")
        self.v1, self.group = False, group
        self.method = _int4(group, True, f"{where}.group_size")
        self.skip = list(qc.get("modules_to_not_convert") or [])

    def read(self, shards, prefix, shape, part=None):
        n, k, (r0, r1), (c0, c1), groups = self._block(prefix, shape, part)
        g = self.group
        words = _whole("rows", r0, r1, 8, f"{prefix}.qweight", "32-bit words")
        order = np.argsort(AWQ_ORDER)  # column j of a word's eight: nibble order.index(j)

        def columns(words_):  # [rows, W] -> [rows, 8 W] in column order
            v = _nibbles(words_, 1).reshape(words_.shape[0], -1, 8)
            return v[:, :, order].reshape(words_.shape[0], -1)

        u = columns(_read(shards, f"{prefix}.qweight", (k, n // 8), (slice(c0, c1), words))).T  # [N_r, K_r]
        scale = _finite_scales(f"{prefix}.scales", _read(shards, f"{prefix}.scales", (k // g, n),
                                                         (groups, slice(r0, r1))).T)
        z = columns(_read(shards, f"{prefix}.qzeros", (k // g, n // 8), (groups, words))).T
        return {"": pack_int4(np.ascontiguousarray(u)), SCALE: np.ascontiguousarray(scale),
                ZERO: np.ascontiguousarray(z)}


# ---- msModelSlim --------------------------------------------------------------------------------------------------

class ModelSlim(Encoding):
    """msModelSlim's export: ``quant_model_description.json`` names each tensor's type. Per projection:
    ``W8A8_DYNAMIC`` (int8 ``weight``, ``weight_scale`` [N, 1], zero ``weight_offset``: int8 activations per token),
    ``W8A8`` (static: ``input_scale``, ``input_offset``, ``deq_scale`` = input scale x weight scale, int64 holding
    float32 bits for float16 models, ``quant_bias`` = -input_offset x row sums for a bias-free layer), ``W8A16``
    (``weight_scale``, ``weight_offset`` [N, 1]: ``w = (q - offset) * scale``, msModelSlim's own dequantization;
    Ascend's kernel adds its antiquant offset, so its exporters negate it), ``FLOAT``."""

    source = "msModelSlim"
    TYPES = {"W8A8_DYNAMIC": "w8a8", "W8A8": "w8a8-static", "W8A16": "int8"}

    def __init__(self, description, path, dtype):
        self.dtype, self.description, self.path = dtype, description, path
        types = {v for k, v in description.items() if k.endswith(".weight") and isinstance(v, str)}
        quantized = sorted(types - {"FLOAT"})
        unknown = [t for t in quantized if t not in self.TYPES]
        if unknown:
            raise CheckpointError(f"{path}: expected weight types FLOAT, {', '.join(self.TYPES)}, got {unknown[0]}")
        self.method = None  # per projection: method_of

    def type_of(self, prefix):
        t = self.description.get(f"{prefix}.weight")
        if t is None:
            raise CheckpointError(f"{self.path}: expected {prefix}.weight in it, found none")
        return t

    def stored(self, prefix):
        return self.type_of(prefix) != "FLOAT"

    def method_of(self, prefix):
        return formats.get(self.TYPES[self.type_of(prefix)])

    def read(self, shards, prefix, shape, part=None):
        n, k = shape
        kind = self.type_of(prefix)
        (r0, r1), _ = _span(part, n, 0), _span(part, k, 1)
        rows = (slice(r0, r1), slice(None))
        q = _read(shards, f"{prefix}.weight", (n, k), part)
        if q.dtype != np.int8:
            raise CheckpointError(f"{prefix}.weight: expected int8 ({kind}), got {q.dtype}")
        if kind == "W8A8":
            s_x = _finite_scales(f"{prefix}.input_scale", _read(shards, f"{prefix}.input_scale", (1,)))
            o_x = np.asarray(_read(shards, f"{prefix}.input_offset", (1,)), np.float32)
            if o_x[0] != np.rint(o_x[0]) or not -128 <= o_x[0] <= 127:
                raise CheckpointError(f"{prefix}.input_offset: expected an integer in -128..127, got {o_x[0]}")
            deq = _read(shards, f"{prefix}.deq_scale", (n,), slice(r0, r1))
            if deq.dtype == np.int64:  # float16 models: the float32 bits in an int64
                deq = deq.astype(np.uint32).view(np.float32)
            deq = _finite_scales(f"{prefix}.deq_scale", deq)
            bias = _read(shards, f"{prefix}.quant_bias", (n,), slice(r0, r1)).astype(np.int64)
            full = _read(shards, f"{prefix}.weight", (n, k), (slice(r0, r1), slice(None)))
            folded = -int(o_x[0]) * full.astype(np.int64).sum(1)
            if not np.array_equal(bias, folded):
                bad = int(np.argmax(bias != folded))
                raise CheckpointError(f"{prefix}.quant_bias: expected -input_offset x each row's sum (a bias-free "
                                      f"projection), got {bias[bad]} for row {r0 + bad} (expected {folded[bad]})")
            return {"": q, SCALE: deq, INPUT_SCALE: s_x.reshape(1), INPUT_OFFSET: o_x.reshape(1)}
        scale = _finite_scales(f"{prefix}.weight_scale", _read(shards, f"{prefix}.weight_scale", (n, 1), rows))[:, 0]
        offset = np.asarray(_read(shards, f"{prefix}.weight_offset", (n, 1), rows), np.float32)[:, 0]
        if kind == "W8A8_DYNAMIC" or not np.any(offset):
            if np.any(offset):
                raise CheckpointError(f"{prefix}.weight_offset: expected zeros (symmetric {kind}), got "
                                      f"{int(np.count_nonzero(offset))} nonzero")
            return {"": q, SCALE: scale}
        raise CheckpointError(f"{prefix}.weight_offset: expected zeros (symmetric W8A16; asymmetric int8 weights, "
                              f"w = (q - offset) * scale, are not supported), got {int(np.count_nonzero(offset))} "
                              f"nonzero")


def encoding(raw, path, folder):
    """The quantized encoding of a checkpoint (config.json's ``raw``; its ``folder``), or None where it is not a
    quantized format of this module."""
    dtype = str(raw.get("torch_dtype") or raw.get("dtype") or "bfloat16")
    desc = os.path.join(folder, MODELSLIM_DESCRIPTION)
    if os.path.isfile(desc):
        try:
            with open(desc) as f:
                description = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{desc}: expected msModelSlim's JSON, got {exc}") from None
        if not isinstance(description, dict):
            raise CheckpointError(f"{desc}: expected an object of tensor names, got {type(description).__name__}")
        return ModelSlim(description, desc, dtype)
    qc = raw.get("quantization_config")
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    readers = {"compressed-tensors": CompressedTensors, "gptq": GPTQ, "awq": AWQ}
    return readers[method](qc, path, dtype) if method in readers else None
