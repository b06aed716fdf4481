"""The native GEMM: MindSpore's MatMul, then the backend's SwiGLU. The composite, akg and ascend backends use it,
and so do the unpacked baseline and the MoE router (``ms_swiglu.linear.Dense``).

Shape legend: T = tokens (any leading dims), K = d_in, M = d_out.
"""
import mindspore as ms
from mindspore import nn, ops
from mindspore.common import dtype as mstype


def cpu_upcast(dtype, backend):
    """Whether the MatMuls of ``backend`` take ``dtype`` in float32: float16/bfloat16 on a CPU device, which has
    no bfloat16 MatMul and whose float16 MatMul is ~10x slower than float32; never in a graph built for Ascend."""
    return dtype != mstype.float32 and backend.upcasts_on_cpu and ms.get_context("device_target") == "CPU"


def matmul(mm, x, w, upcast):
    """``x w^T`` by the MatMul primitive ``mm`` (transpose_b), in float32 with ``upcast``: [..., K] -> [..., M]."""
    dtype = x.dtype
    if upcast:
        x, w = x.astype(mstype.float32), w.astype(mstype.float32)
    shape = ops.shape(x)
    y = mm(x.reshape(-1, shape[-1]), w)  # [T, K] x [M, K]^T -> [T, M]
    return y.reshape(shape[:-1] + (ops.shape(y)[-1],)).astype(dtype)


class MatMulLinear(nn.Cell):
    """``x W^T`` by MindSpore's MatMul, then (with ``swiglu``) the backend's SwiGLU op.

    Shapes:
        x: [T, K]    w: [M, K]    out: [T, M], or [T, M/2] with ``swiglu``
    """

    def __init__(self, backend, dtype, swiglu):
        super().__init__()
        self.mm, self.upcast = ops.MatMul(transpose_b=True), cpu_upcast(dtype, backend)
        self.act = backend.swiglu() if swiglu else None

    def construct(self, x, w):
        y = matmul(self.mm, x, w, self.upcast)
        return y if self.act is None else self.act(y)


def materialised_bytes(n, hidden, inter, itemsize):
    """Intermediates of the native path: gate_up [T, 2I], the activation [T, I] and the output [T, H]."""
    return (3 * n * inter + n * hidden) * itemsize
