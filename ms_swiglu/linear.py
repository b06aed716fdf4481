"""Bias-free linear layers, ``y = x W^T`` with ``W`` stored ``[d_out, d_in]`` (nn.Dense and HuggingFace layout).

Shape legend: T = tokens (any leading dims).

``Linear(backend="cpu")`` is one call into the project's C++ library: a skinny GEMM that streams each weight row
once for all tokens (decode), or oneDNN's matmul (from the libdnnl MindSpore ships) for more tokens, reading
the weights in place; for mid token counts with the roles swapped (``y^T = W x^T``), which runs faster here
(``tools/bench_linear.py``; :func:`ms_swiglu._cpu_kernel.route` tells which). Weights stay in their dtype
(bfloat16 and float16 products are exact in float32), every sum is float32, and the result is rounded once.
With ``swiglu=True`` the SwiGLU of the packed ``[gate, up]`` output is the GEMM's epilogue, so ``[T, 2I]`` is
never materialised.

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
        if self.fused:
            self.op = _cpu_op(swiglu)
        else:
            self.matmul, self.upcast = ops.MatMul(transpose_b=True), cpu_upcast(dtype, self.backend)
            self.act = SwiGLU(self.backend) if swiglu else None

    def construct(self, x):
        if self.fused:
            return self.op(x, self.weight)
        y = _matmul(self.matmul, x, self.weight, self.upcast)
        return y if self.act is None else self.act(y)
