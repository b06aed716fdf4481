"""Bias-free linear layers, ``y = x W^T`` with ``W`` stored ``[d_out, d_in]`` (nn.Dense and HuggingFace layout).

Shape legend: T = tokens (any leading dims).

``Linear(backend="cpu")`` is one call into the project's C++ library: a skinny GEMM that streams each weight row
once for all tokens (decode), or oneDNN's GEMM (the library MindSpore's own CPU MatMul uses) for more tokens.
Weights stay in their dtype (bfloat16 x bfloat16 products are exact in float32; float16 is widened as it is
read), every sum is float32, and the result is rounded once. With ``swiglu=True`` the SwiGLU of the packed
``[gate, up]`` output is the GEMM's epilogue, so ``[T, 2I]`` is never materialised.

float32 between ``MATMUL_TOKENS`` takes MindSpore's MatMul (then the fused SwiGLU op) instead: measured
here (``ms-swiglu bench``, interleaved), oneDNN's sgemm ran at 0.68x of MindSpore's MatMul at N=64 and 0.80x at
N=128, and 1.07x at N=512. The choice is a runtime branch on N inside the one compiled graph. A graph for
export drops the branch (:func:`without_token_branch`): MindSpore 2.10 cannot run a reloaded MindIR that has
it at N in that range ("The actor already exists: Default/Switch-op0...", measured).

Other backends run MindSpore's MatMul followed by the :class:`~ms_swiglu.activation.SwiGLU` of that backend.
"""
import math

import mindspore as ms
from mindspore import Parameter, nn, ops
from mindspore.common import dtype as mstype
from mindspore.common.initializer import HeUniform, initializer

from ms_swiglu import _cpu_kernel
from ms_swiglu.activation import SwiGLU, aot_op, resolve_backend
from ms_swiglu.config import to_dtype

MATMUL_TOKENS = (33, 256)  # float32 token counts where the cpu backend uses MindSpore's MatMul (see above)


def cpu_upcast(dtype, backend="auto"):
    """Whether float16/bfloat16 MatMuls run in float32: on the CPU, which has no bfloat16 MatMul and whose
    float16 MatMul is ~10x slower than float32. Never for Ascend, nor for a graph built for Ascend."""
    return (to_dtype(dtype) != mstype.float32 and ms.get_context("device_target") == "CPU"
            and resolve_backend(backend) != "ascend")


def _matmul(matmul, x, w, upcast):
    dtype = x.dtype
    if upcast:
        x, w = x.astype(mstype.float32), w.astype(mstype.float32)
    shape = ops.shape(x)
    y = matmul(x.reshape(-1, shape[-1]), w)  # [T, d_in] x [d_out, d_in]^T -> [T, d_out]
    return y.reshape(shape[:-1] + (ops.shape(y)[-1],)).astype(dtype)


class Dense(nn.Dense):
    """``nn.Dense`` without bias; with ``upcast``, low-precision weights are multiplied in float32.

    Shapes:
        x: [T, d_in]    weight: [d_out, d_in]    out: [T, d_out]
    """

    def __init__(self, d_in, d_out, dtype, upcast):
        super().__init__(d_in, d_out, has_bias=False, dtype=dtype)
        self.upcast = upcast

    def construct(self, x):
        return _matmul(self.matmul, x, self.weight, self.upcast)


def _cpu_op(swiglu):
    """``Linear`` or ``GateUpSwiglu`` from the .so (shape and dtype from its C++ InferShape/InferType). The
    backward runs MindSpore's MatMul in float32; with ``swiglu`` it recomputes ``[gate, up]`` first."""
    f32 = mstype.float32
    _cpu_kernel.gemm()  # binds oneDNN (MindSpore's libdnnl) in the .so
    mm, mm_ta, mm_tb = ops.MatMul(), ops.MatMul(transpose_a=True), ops.MatMul(transpose_b=True)
    swiglu_bwd = aot_op("SwigluBwd", 2)

    def bprop(x, w, out, dout):
        # float32 before any reshape: the CPU has no bfloat16 Reshape
        x2, w2 = x.astype(f32).reshape(-1, ops.shape(w)[1]), w.astype(f32)  # [T, d_in], [d_out, d_in]
        dy = dout.astype(f32).reshape(-1, ops.shape(dout)[-1])  # [T, d_out] (swiglu: [T, d_out / 2])
        if swiglu:
            dy = swiglu_bwd(mm_tb(x2, w2), dy)  # [T, 2I]: d_gate, d_up
        return mm(dy, w2).reshape(ops.shape(x)).astype(x.dtype), mm_ta(dy, x2).astype(w.dtype)

    return aot_op("GateUpSwiglu" if swiglu else "Linear", 2, bprop)


class Linear(nn.Cell):
    """``x W^T`` (bias-free); with ``swiglu``, ``SiLU(gate) * up`` of the packed output ``[gate, up]``.

    backend ``cpu``: one C++ call, weights in their own dtype, SwiGLU as the GEMM's epilogue. Other backends:
    MindSpore's MatMul (in float32 on the CPU for float16/bfloat16, see :func:`cpu_upcast`), then SwiGLU.

    Shapes:
        x:      [T, d_in]
        weight: [d_out, d_in]
        out:    [T, d_out], or [T, d_out / 2] with ``swiglu``
    """

    def __init__(self, d_in, d_out, *, dtype=ms.float32, backend="auto", swiglu=False):
        super().__init__()
        if swiglu and d_out % 2:
            raise ValueError(f"swiglu: expected an even d_out (2I, [gate, up]), got {d_out}")
        dtype = to_dtype(dtype)
        self.backend = resolve_backend(backend)
        self.weight = Parameter(initializer(HeUniform(math.sqrt(5)), [d_out, d_in], dtype), name="weight")
        self.fused = self.backend == "cpu"
        self.matmul_tokens = MATMUL_TOKENS if self.fused and dtype == mstype.float32 else None
        self.matmul, self.upcast = ops.MatMul(transpose_b=True), cpu_upcast(dtype, self.backend)
        # the SwiGLU op runs after MindSpore's MatMul: every backend but cpu, and cpu's float32 branch
        self.act = SwiGLU(self.backend) if swiglu and (not self.fused or self.matmul_tokens) else None
        if self.fused:
            self.op = _cpu_op(swiglu)

    def construct(self, x):
        if self.fused and self.matmul_tokens is None:
            return self.op(x, self.weight)
        if self.fused:
            n = ops.shape(x.reshape(-1, ops.shape(self.weight)[1]))[0]  # tokens: a runtime value
            if n < self.matmul_tokens[0] or n > self.matmul_tokens[1]:
                return self.op(x, self.weight)
            y = _matmul(self.matmul, x.astype(mstype.float32), self.weight, False)  # amp may have cast x
            return (y if self.act is None else self.act(y)).astype(x.dtype)
        y = _matmul(self.matmul, x, self.weight, self.upcast)
        return y if self.act is None else self.act(y)


def without_token_branch(net):
    """``net`` with every float32 cpu :class:`Linear` running the C++ GEMMs at every N (no runtime branch on
    N): for MindIR export, whose reload cannot take the branch. Call before the first compile."""
    for _, cell in net.cells_and_names():
        if isinstance(cell, Linear):
            cell.matmul_tokens = None
    return net
