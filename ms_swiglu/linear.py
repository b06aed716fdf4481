"""Bias-free linear layers, ``y = x W^T`` with ``W`` stored ``[d_out, d_in]`` (nn.Dense and HuggingFace layout).

Shape legend: T = tokens (any leading dims).

:class:`Linear` runs its backend's GEMM (``Backend.linear``): on the ``cpu`` backend one C++ call with, for the
packed gate/up projection, SwiGLU as the GEMM's epilogue (``[T, 2I]`` never exists); elsewhere MindSpore's
MatMul followed by the backend's SwiGLU op.
"""
import mindspore as ms
import numpy as np
from mindspore import nn

from ms_swiglu import initial
from ms_swiglu import quant as formats
from ms_swiglu.backends import resolve
from ms_swiglu.backends.matmul import cpu_upcast, matmul
from ms_swiglu.config import to_dtype
from ms_swiglu.errors import InputError


class Dense(nn.Dense):
    """``nn.Dense`` without bias, by MindSpore's MatMul, beside the Cells of ``backend``: float16/bfloat16 are
    multiplied in float32 where that backend's MatMuls are (see :func:`~ms_swiglu.backends.matmul.cpu_upcast`).

    Shapes:
        x: [T, d_in]    weight: [d_out, d_in]    out: [T, d_out]
    """

    def __init__(self, d_in, d_out, dtype, backend="auto"):
        dtype = to_dtype(dtype)
        # a Cell built to be loaded starts from zeros, not random values (ms_swiglu.initial)
        super().__init__(d_in, d_out, has_bias=False, dtype=dtype,
                         weight_init="zeros" if initial.building_empty() else None)
        self.upcast = cpu_upcast(dtype, resolve(backend))

    def construct(self, x):
        return matmul(self.matmul, x, self.weight, self.upcast)


class Linear(nn.Cell):
    """``x W^T`` (bias-free); with ``swiglu``, ``SiLU(gate) * up`` of the packed output ``[gate, up]``.

    ``quant``: the weight format (``ms_swiglu.quant``: a name or a method), which makes the Parameters and whose
    scales the backend applies: ``"int8"``, weight-only int8 (W8A16), ``weight`` int8 and ``weight_scale`` float32
    per output row; ``"int8-g128"``, a scale per 128 inputs of a row. ``x`` and the output stay in ``dtype``;
    quantized weights are for inference only.

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
        self.dtype, method = to_dtype(dtype), formats.get(quant)
        self.backend, self.quant = resolve(backend), formats.name(method)
        self.op = self.backend.linear(self.dtype, swiglu, method)
        # weight (as the op holds it) and its format's other parts (weight_scale, ...), which the op takes after it,
        # then what the op derives from them at load (``derive``)
        parts = method.create_weights(self, "weight", (d_out, d_in), self.dtype, self.form)
        self._derived = getattr(self.op, "derived", ())
        for d in self._derived:
            setattr(self, "weight" + d.suffix, initial.parameter(
                (d_out,), getattr(ms, d.dtype), "weight" + d.suffix, requires_grad=False,
                fill=lambda d=d: np.zeros((d_out,), d.dtype)))
        self.aux = ms.ParameterTuple(parts + tuple(getattr(self, "weight" + d.suffix) for d in self._derived))

    @property
    def form(self):
        """How the op holds the weight (``ms_swiglu.backends.spec.WeightForm``; None: as the format stores it)."""
        return getattr(self.op, "form", None)

    def derive(self, state):
        """``{parameter name: array}`` of the values the op derives from this Cell's weight parts in ``state``
        (``{parameter name: array}``, as the format stores them)."""
        parts = {name[len("weight"):]: w for name, w in state.items() if name.startswith("weight")}
        return {"weight" + d.suffix: d.compute(parts) for d in self._derived}

    def forms(self):
        """``{parameter name: WeightForm}`` of the weights held in a form of the op's own."""
        return {"weight": self.form} if self.form is not None else {}

    def construct(self, x):
        return self.op(x, self.weight, *self.aux)

