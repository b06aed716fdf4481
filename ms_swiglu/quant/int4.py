"""Weight-only int4 per group (W4A16): the form GPTQ, AWQ and compressed-tensors' ``pack-quantized`` checkpoints are
read into, and ``int4-g128`` for float ones. NumPy only.

A weight is ``w = (u - z) * scale``, ``u`` in 0..15 stored two a byte along K (the even input in the low nibble),
``scale`` per group of G inputs of a row, ``z`` = 8 (symmetric) or its group's zero point (asymmetric, 0..15,
one a byte).

Shapes:
    w: [..., M, K] float    u: [..., M, K/2] uint8    scale: [..., M, K/G] float32    zero: [..., M, K/G] uint8
"""
import numpy as np

from ms_swiglu.errors import InputError
from ms_swiglu.quant.base import Part, QuantMethod
from ms_swiglu.schema import SCALE, ZERO


def pack_int4(u):
    """[..., K] values 0..15 (K even) -> [..., K/2] uint8: input 2j in the low nibble of byte j, 2j + 1 high."""
    u = np.asarray(u, np.uint8)
    return (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)


def unpack_int4(b):
    """The inverse of :func:`pack_int4`: [..., K/2] uint8 -> [..., K] uint8 in 0..15."""
    b = np.asarray(b, np.uint8)
    out = np.empty((*b.shape[:-1], 2 * b.shape[-1]), np.uint8)
    out[..., 0::2], out[..., 1::2] = b & 15, b >> 4
    return out


class Int4(QuantMethod):
    """int4 per group of ``group`` inputs, symmetric (z = 8) or with a zero point per group (``zero_point``).
    Quantizing float weights (``encode``, round to nearest) takes the checkpoints' symmetric convention (GPTQ's and
    compressed-tensors'): ``scale = max|w| / 7.5`` per group, ``u = clip(round(w / scale), -8, 7) + 8``."""

    quantized = True
    bits = 4
    kernel = "int4-group"  # the C++ library's row (its dense ops; experts dequantized in the graph)
    roundings = 2  # the scale (and offset) in the activations' dtype, the dequantized weight rounded to it

    def __init__(self, group, zero_point=False):
        self.group, self.zero_point = group, zero_point
        self.quantizes = not zero_point  # zero points come from a checkpoint's asymmetric rounding
        self.name = f"int4-g{group}" + ("-zp" if zero_point else "")
        self.parts = (Part("", "uint8", per=2), Part(SCALE, "float32", per=group),
                      *([Part(ZERO, "uint8", per=group)] if zero_point else []))
        zp = "a zero point and a float32 scale" if zero_point else "a float32 scale (zero point 8)"
        self.summary = (f"int4, {zp} per {group} inputs of each output row (w = (u - z) * scale), activations in "
                        f"the dtype")

    def encode(self, w):
        w = np.asarray(w, np.float32)
        if self.zero_point:
            raise InputError(f"quantize: expected a symmetric int4 format (int4-g{self.group}), got {self.name}")
        self.check_inputs(w.shape[-1])
        if not np.isfinite(w).all():
            raise InputError(f"quantize: expected finite weights, got {int((~np.isfinite(w)).sum())} NaN/inf values "
                             f"in a {list(w.shape)} tensor")
        g = w.reshape(*w.shape[:-1], -1, self.group)  # [..., M, K/G, G]
        amax = np.abs(g).max(-1)
        scale = np.where(amax > 0, amax / 7.5, 1).astype(np.float32)
        q = np.clip(np.rint(g / scale[..., None]), -8, 7).astype(np.int16) + 8
        return {"": pack_int4(q.reshape(w.shape)), SCALE: scale}

    def decode(self, parts):
        u = unpack_int4(parts[""]).astype(np.float32)  # [..., M, K]
        scale = np.asarray(parts[SCALE], np.float32)
        z = np.asarray(parts[ZERO], np.float32) if self.zero_point else np.full(scale.shape, 8, np.float32)
        g = u.reshape(*scale.shape, -1)  # [..., M, K/G, G]
        return ((g - z[..., None]) * scale[..., None]).reshape(u.shape)

    def dequantize_op(self):
        from ms_swiglu.quant.graph import dequantize_int4  # noqa: PLC0415 -- MindSpore, on first use only

        return dequantize_int4
