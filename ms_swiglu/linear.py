"""Bias-free linear layers, ``y = x W^T`` with ``W`` stored ``[d_out, d_in]`` (nn.Dense and HuggingFace layout).

Shape legend: T = tokens (any leading dims).

:class:`Linear` runs its backend's GEMM (``Backend.linear``): on the ``cpu`` backend one C++ call with, for the
packed gate/up projection, SwiGLU as the GEMM's epilogue (``[T, 2I]`` never exists); elsewhere MindSpore's
MatMul followed by the backend's SwiGLU op.
"""
import math

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import HeUniform, initializer

from ms_swiglu.backends import resolve
from ms_swiglu.backends.matmul import cpu_upcast, matmul
from ms_swiglu.config import to_dtype
from ms_swiglu.errors import InputError
from ms_swiglu.packing import check_quant, scale_shape


class Dense(nn.Dense):
    """``nn.Dense`` without bias, by MindSpore's MatMul, beside the Cells of ``backend``: float16/bfloat16 are
    multiplied in float32 where that backend's MatMuls are (see :func:`~ms_swiglu.backends.matmul.cpu_upcast`).

    Shapes:
        x: [T, d_in]    weight: [d_out, d_in]    out: [T, d_out]
    """

    def __init__(self, d_in, d_out, dtype, backend="auto"):
        dtype = to_dtype(dtype)
        super().__init__(d_in, d_out, has_bias=False, dtype=dtype)
        self.upcast = cpu_upcast(dtype, resolve(backend))

    def construct(self, x):
        return matmul(self.matmul, x, self.weight, self.upcast)


def int8_parameters(shape, name, scale_shape):
    """An int8 weight Parameter ``name`` and its float32 scales ``{name}_scale`` (weight-only int8: inference
    only, filled by the loaders)."""
    return (Parameter(Tensor(np.zeros(shape, np.int8)), name=name, requires_grad=False),
            Parameter(Tensor(np.ones(scale_shape, np.float32)), name=f"{name}_scale", requires_grad=False))


class Linear(nn.Cell):
    """``x W^T`` (bias-free); with ``swiglu``, ``SiLU(gate) * up`` of the packed output ``[gate, up]``.

    ``quant="int8"``: weight-only int8 (W8A16), ``weight`` int8 and ``weight_scale`` float32 per output row
    (``ms_swiglu.packing.quantize_int8``); ``"int8-g128"``: a scale per 128 inputs of a row. ``x`` and the output
    stay in ``dtype``. Inference only.

    Shapes:
        x:            [T, d_in]
        weight:       [d_out, d_in]  (int8 with quant)
        weight_scale: [d_out]        (quant only; int8-g128: [d_out, d_in / 128])
        out:          [T, d_out], or [T, d_out / 2] with ``swiglu``
    """

    def __init__(self, d_in, d_out, *, dtype=ms.float32, backend="auto", swiglu=False, quant=None):
        super().__init__()
        if swiglu and d_out % 2:
            raise InputError(f"swiglu: expected an even d_out (2I, [gate, up]), got {d_out}")
        self.dtype, self.quant = to_dtype(dtype), check_quant(quant)
        self.backend = resolve(backend)
        if quant:
            self.weight, self.weight_scale = int8_parameters((d_out, d_in), "weight",
                                                             scale_shape(quant, (d_out,), d_in))
        else:
            self.weight = Parameter(initializer(HeUniform(math.sqrt(5)), [d_out, d_in], self.dtype), name="weight")
            self.weight_scale = None
        self.op = self.backend.linear(self.dtype, swiglu, quant)

    def construct(self, x):
        return self.op(x, self.weight, self.weight_scale)

