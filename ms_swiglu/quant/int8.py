"""Symmetric weight-only int8, per output row (``int8``) or per 128 inputs of a row (``int8-g128``): the arrays'
arithmetic, in NumPy and in a MindSpore graph.

Shapes:
    w: [..., M, K] float    q: [..., M, K] int8    scale: [..., M] float32, or [..., M, K / group]
"""
import numpy as np

from ms_swiglu import initial
from ms_swiglu.errors import InputError, InputTypeError
from ms_swiglu.quant.base import QuantMethod
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
    stored = "int8"

    def __init__(self, name, group=None):
        self.name, self.group = name, group
        scales = f"a float32 scale per {group} inputs of each output row" if group else "a float32 scale per output row"
        self.summary = f"int8, {scales} (w = scale * q), activations in the dtype"

    def scale_shape(self, rows, k):
        if self.group is None:
            return tuple(rows)
        self.check_inputs(k)
        return (*rows, k // self.group)

    def check_inputs(self, k, what="input size"):
        if self.group and k % self.group:
            raise InputError(f"quant {self.name}: expected an {what} that is a multiple of {self.group}, got {k}")

    def quantize(self, w):
        return quantize_int8(w, self.group)

    def dequantize(self, q, scale):
        return dequantize_int8(q, scale)

    def dequantize_op(self):
        from ms_swiglu.quant.graph import dequantize_int8  # noqa: PLC0415 -- MindSpore, on first use only

        return dequantize_int8

    def shard_scale(self, scale, weight_inputs, columns):
        if self.group is None:
            return scale  # [..., M]: whole rows
        per = weight_inputs // scale.shape[-1]
        if columns.start % per or (columns.stop - columns.start) % per:
            raise InputError(f"quant {self.name}: expected a rank's columns to hold whole groups of {per}, got "
                             f"columns {columns.start}..{columns.stop - 1}")
        return scale[..., columns.start // per:columns.stop // per]

    def create_weights(self, cell, name, shape, dtype, stored=None):  # noqa: ARG002 -- int8 in every dtype
        from mindspore.common import dtype as mstype  # noqa: PLC0415

        stored, scale = stored or shape, self.scale_shape(shape[:-1], shape[-1])
        setattr(cell, name, initial.parameter(stored, mstype.int8, name, fill=lambda: np.zeros(stored, np.int8),
                                              requires_grad=False))
        setattr(cell, name + SCALE, initial.parameter(scale, mstype.float32, name + SCALE, requires_grad=False,
                                                      fill=lambda: np.ones(scale, np.float32)))


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
