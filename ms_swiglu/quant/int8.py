"""Symmetric weight-only int8, per output row (``int8``) or per 128 inputs of a row (``int8-g128``): the arrays'
arithmetic, in NumPy and in a MindSpore graph.

Shapes:
    w: [..., M, K] float    q: [..., M, K] int8    scale: [..., M] float32, or [..., M, K / group]
"""
import numpy as np

from ms_swiglu.errors import InputError, InputTypeError
from ms_swiglu.quant.base import Part, QuantMethod
from ms_swiglu.schema import SCALE


class Int8(QuantMethod):
    """Symmetric weight-only int8 (W8A16): ``w ~ scale * q``, ``q`` in [-127, 127], ``scale = max|w| / 127`` in
    float32 (1 where all are zero) over each output row (``group`` None), or over each ``group`` consecutive
    inputs of a row. Every row keeps its own scales, so packing ``[gate; up]`` and splitting rows stay row
    operations on ``(q, scale)``; a column split keeps whole groups.

    Shapes:
        w: [..., M, K] float    q: [..., M, K] int8    scale: [..., M] float32, or [..., M, K / group]
    """

    quantized = True
    bits = 8
    roundings = 2  # the scale in the activations' dtype, the dequantized weight rounded to it

    def __init__(self, name, group=None):
        # the library's row: per row, or grouped (any group size; the scales' shape gives it)
        self.name, self.group, self.kernel = name, group, "int8-group" if group else "int8"
        self.parts = (Part("", "int8", per=1), Part(SCALE, "float32", per=group or 0))
        scales = f"a float32 scale per {group} inputs of each output row" if group else "a float32 scale per output row"
        self.summary = f"int8, {scales} (w = scale * q), activations in the dtype"

    def quantize(self, w):
        """``(q, scale)`` of float weights ``[..., M, K]``."""
        return quantize_int8(w, self.group)

    def dequantize(self, q, scale):
        """The float32 weights ``scale * q``."""
        return dequantize_int8(q, scale)

    def encode(self, w):
        q, scale = self.quantize(w)
        return {"": q, SCALE: scale}

    def decode(self, parts):
        return dequantize_int8(parts[""], parts[SCALE])

    def dequantize_op(self):
        from ms_swiglu.quant.graph import dequantize_int8  # noqa: PLC0415 -- MindSpore, on first use only

        return dequantize_int8


INT8 = Int8("int8")
INT8_G128 = Int8("int8-g128", group=128)


def quantize_int8(w, group=None):
    """``(q, scale)`` with ``w ~ scale * q`` (:class:`~ms_swiglu.quant.base.Int8`): per output row (``group``
    None) or per ``group`` consecutive inputs of a row."""
    w = np.asarray(w, np.float32)
    if not np.isfinite(w).all():
        raise InputError(f"quantize: expected finite weights, got {int((~np.isfinite(w)).sum())} NaN/inf values "
                         f"in a {list(w.shape)} tensor")
    k = w.shape[-1]
    if group is not None:
        expected = f"quantize: expected a group of a positive int number of inputs (or None), got {group!r}"
        if isinstance(group, bool) or not isinstance(group, (int, np.integer)):
            raise InputTypeError(expected)
        if group < 1:
            raise InputError(expected)
        if k % group:
            raise InputError(f"quantize: expected an input size that is a multiple of the group {group}, got {k}")
    g = w.reshape(*w.shape[:-1], k // group, group) if group else w[..., None, :]  # [..., M, groups, g]
    amax = np.abs(g).max(-1) if g.shape[-1] else np.zeros(g.shape[:-1], np.float32)
    scale = np.where(amax > 0, amax / 127, 1).astype(np.float32)
    q = np.clip(np.rint(g / scale[..., None]), -127, 127).astype(np.int8).reshape(w.shape)
    return q, (scale if group else scale[..., 0])


def dequantize_int8(q, scale):
    """The float32 weights ``scale * q`` that an int8 ``(q, scale)`` stands for (exact); scales ``[..., M]`` (per
    row) or ``[..., M, groups]``."""
    q, scale = np.asarray(q, np.float32), np.asarray(scale, np.float32)
    rows, k = list(q.shape[:-1]), q.shape[-1]
    grouped = (scale.ndim == q.ndim and list(scale.shape[:-1]) == rows and scale.shape[-1] > 0
               and k % scale.shape[-1] == 0)
    if list(scale.shape) != rows and not grouped:
        raise InputError(f"dequantize: expected scales {rows} (per row) or {rows} + [groups] (groups dividing {k}) "
                         f"for int8 weights {list(q.shape)}, got {list(scale.shape)}")
    if grouped:
        return (q.reshape(*scale.shape, -1) * scale[..., None]).reshape(q.shape)
    return q * scale[..., None]
