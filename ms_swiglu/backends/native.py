"""MindSpore's own ops for the rest of the FFN block, where a backend fuses nothing: RMSNorm and the residual add.

Shape legend: T = tokens (any leading dims), H = hidden_size.
"""
from mindspore import nn, ops
from mindspore.common import dtype as mstype


class RMSNormOp(nn.Cell):
    """``x / sqrt(mean(x^2) + eps) * w``, statistics and scaling in float32, rounded once (the reference).

    Shapes:
        x: [T, H]    w: [H]    out: [T, H]
    """

    def __init__(self, eps):
        super().__init__()
        self.eps = eps

    def construct(self, x, w):
        x32 = x.astype(mstype.float32)
        var = ops.mean(x32 * x32, -1, keep_dims=True)  # [T, H] -> [T, 1], float32
        return (x32 * ops.rsqrt(var + self.eps) * w.astype(mstype.float32)).astype(x.dtype)


class AddOp(nn.Cell):
    """``a + b``: the residual connection."""

    def construct(self, a, b):
        return a + b
