"""The weight formats' dequantization inside MindSpore graphs (the native backends' path and the reference).

Shapes: w [..., M, K] int8; scale [..., M] (per row) or [..., M, G] (per K / G inputs); out [..., M, K].
"""
from mindspore import ops
from mindspore.common import dtype as mstype


def dequantize_int8(w, scale, dtype):
    """``scale * q`` in ``dtype`` (float32 inside)."""
    q = w.astype(mstype.float32)
    if scale.ndim < q.ndim:
        return (q * scale.expand_dims(-1)).astype(dtype)
    shape = ops.shape(q)  # [..., M, K] -> [..., M, G, K / G]
    groups = q.reshape(shape[:-1] + (ops.shape(scale)[-1], -1))
    return (groups * scale.expand_dims(-1)).reshape(shape).astype(dtype)
