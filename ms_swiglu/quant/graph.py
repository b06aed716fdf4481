"""The weight formats inside MindSpore graphs: dequantization (the path of every backend without a kernel for a
format, and the reference) and the int8 activations of W8A8. ``aux``: the tuple of a weight's parts after it, in
its format's order (``QuantMethod.parts``).

Shapes: w [..., M, K] int8 (int4: [..., M, K/2] uint8); scale [..., M] (per row) or [..., M, G] (per K / G
inputs); zero [..., M, G] uint8; out [..., M, K]; x [T, K].
"""
from mindspore import ops
from mindspore.common import dtype as mstype


def _grouped(q, scale):
    """``q`` [..., M, K] float32 times ``scale`` per row [..., M] or per group [..., M, G]."""
    if scale.ndim < q.ndim:
        return q * scale.expand_dims(-1)
    shape = ops.shape(q)  # [..., M, K] -> [..., M, G, K / G]
    groups = q.reshape(shape[:-1] + (ops.shape(scale)[-1], -1))
    return (groups * scale.expand_dims(-1)).reshape(shape)


def dequantize_int8(w, aux, dtype):
    """``scale * q`` in ``dtype`` (float32 inside); ``aux``: (scale,)."""
    return _grouped(w.astype(mstype.float32), aux[0]).astype(dtype)


_FLOOR_DIV, _FLOOR_MOD, _CONCAT = ops.FloorDiv(), ops.FloorMod(), ops.Concat(-1)  # (primitives with GE adapters)


def unpack_int4(w):
    """[..., M, K/2] uint8, two values a byte (the even input in the low nibble) -> [..., M, K] float32 in 0..15."""
    b = w.astype(mstype.int32)
    low, high = _FLOOR_MOD(b, 16).expand_dims(-1), _FLOOR_DIV(b, 16).expand_dims(-1)
    shape = ops.shape(w)
    return _CONCAT((low, high)).reshape(shape[:-1] + (-1,)).astype(mstype.float32)


def dequantize_int4(w, aux, dtype):
    """``(u - z) * scale`` per group in ``dtype`` (float32 inside); ``aux``: (scale,) with z = 8, or (scale, zero)."""
    u = unpack_int4(w)
    if len(aux) == 1:
        return _grouped(u - 8.0, aux[0]).astype(dtype)
    shape = ops.shape(u)  # [..., M, G, K / G] minus each group's zero point
    groups = u.reshape(shape[:-1] + (ops.shape(aux[1])[-1], -1)) - aux[1].astype(mstype.float32).expand_dims(-1)
    return _grouped(groups.reshape(shape), aux[0]).astype(dtype)


def quantize_tokens(x):
    """Dynamic int8 per token, as Ascend's DynamicQuant: ``s = max|x| / 127`` per row (1 for a row of zeros),
    ``x_q = round(x / s)`` (half to even) in [-127, 127]; x [T, K] -> (x_q float32 [T, K], s float32 [T, 1])."""
    x = x.astype(mstype.float32)
    amax = ops.abs(x).max(axis=-1, keepdims=True)
    s = ops.select(amax > 0, amax / 127.0, ops.ones_like(amax))
    return ops.clamp(ops.round(x / s), -127.0, 127.0), s


def quantize_static(x, scale, offset):
    """Static int8 per tensor: ``x_q = clip(round(x / s + o), -128, 127)``; returns ``x_q - o`` (an integer) and
    1 (the format's row scales hold ``s`` already: the dequantization scale of each row)."""
    x = x.astype(mstype.float32)
    q = ops.clamp(ops.round(x / scale + offset), -128.0, 127.0)
    return q - offset, ops.ones_like(scale)
