"""Fused SwiGLU over a packed tensor: ``out = SiLU(gate) * up``.

Shapes:
    x:   [..., 2I]  packed ``[gate, up]`` along the last dim (gate first, Megatron-LM order)
    out: [..., I]

Backends (chosen once, when the Cell is built):
    composite  split + silu + mul; always available and the reference.
    cpu        the project's C++ kernel (``ops.Custom`` aot) with a fused C++ backward.
    akg        a hybrid-DSL kernel compiled by AKG; static shapes only.
    ascend     MindSpore's builtin ``Swiglu`` (aclnnSwiGlu). Not run on hardware here.
    auto       ``ascend`` when the device target is Ascend, else ``cpu``.
"""
import functools

import mindspore as ms
from mindspore import nn, ops
from mindspore.common import dtype as mstype
from mindspore.ops import DataType, kernel
from mindspore.ops import CustomRegOp

from ms_swiglu._cpu_kernel import kernel_path
from ms_swiglu.config import BACKENDS

DTYPES = (mstype.float32, mstype.float16, mstype.bfloat16)


def resolve_backend(backend):
    """Map a backend name to the concrete backend; ``auto`` looks at the device target."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        return "ascend" if ms.get_context("device_target") == "Ascend" else "cpu"
    return backend


@ops.constexpr
def _check(rank, last, dtype):
    if dtype not in DTYPES:
        raise TypeError(f"swiglu: expected dtype float32, float16 or bfloat16, got {dtype}")
    if rank == 0:
        raise ValueError("swiglu: expected a tensor of rank >= 1 whose last dim is 2I, got a 0-d tensor")
    if last is not None and (last == 0 or last % 2):  # None: a dynamic last dim, checked by the kernel
        raise ValueError(f"swiglu: expected an even, non-zero last dim (2I), got {last}")


def _composite(x):
    dtype = x.dtype
    x = x.astype(mstype.float32)  # SiLU and the product in float32, rounded once
    gate, up = ops.chunk(x, 2, -1)
    return (ops.silu(gate) * up).astype(dtype)


def _ascend(x):
    return ops.swiglu(x, -1)


def aot_op(name, n_inputs, bprop=None):
    """The .so's function ``name`` as an aot Custom op on the CPU: ``n_inputs`` inputs and one output of one
    dtype (float32, float16 or bfloat16); output shape and dtype come from its C++ {name}InferShape/InferType."""
    reg = CustomRegOp(name)
    for i in range(n_inputs):
        reg = reg.input(i, f"x{i}")
    reg = reg.output(0, "y")
    for dt in (DataType.F32_Default, DataType.F16_Default, DataType.BF16_Default):
        reg = reg.dtype_format(*[dt] * (n_inputs + 1))
    return ops.Custom(f"{kernel_path()}:{name}", out_shape=None, out_dtype=None, func_type="aot", bprop=bprop,
                      reg_info=reg.target("CPU").get_op_info())


def _cpu_op():
    """The fused forward with its fused C++ backward (one per Cell, so that it can be marked for recompute on
    its own)."""
    bwd = aot_op("SwigluBwd", 2)

    def bprop(x, out, dout):
        return (bwd(x, dout),)  # [..., 2I] = [d_gate, d_up]

    return aot_op("SwigluFwd", 1, bprop)


@kernel
def _akg_fwd(x):
    n = x.shape[0]
    h = x.shape[1] // 2
    y = output_tensor((n, h), x.dtype)
    for i in parallel(n):
        for j in vectorize(h):
            # AKG's float32 exp on the CPU is off by ~3e-4 relative; its float64 exp is not
            y[i, j] = x[i, j] / float32(1.0 + exp(float64(-x[i, j]))) * x[i, j + h]
    return y


@kernel
def _akg_bwd(x, dy):
    n = x.shape[0]
    h = x.shape[1] // 2
    dx = output_tensor((n, 2 * h), x.dtype)
    for i in parallel(n):
        for j in vectorize(h):
            s = float32(1.0 / (1.0 + exp(float64(-x[i, j]))))
            silu = x[i, j] * s
            dx[i, j] = dy[i, j] * x[i, j + h] * (s + silu * (1.0 - s))
            dx[i, j + h] = dy[i, j] * silu
    return dx


def _akg_op():
    bwd = ops.Custom(_akg_bwd, out_shape=lambda x, dy: x, out_dtype=lambda x, dy: x, func_type="hybrid")

    def bprop(x, out, dout):
        return (bwd(x, dout),)

    return ops.Custom(_akg_fwd, out_shape=lambda x: x[:-1] + [x[-1] // 2], out_dtype=lambda x: x,
                      func_type="hybrid", bprop=bprop)


@ops.constexpr
def _check_static(shape):
    if any(d is None or d < 0 for d in shape):
        shape = tuple(-1 if d is None else d for d in shape)
        raise ValueError(f"swiglu backend 'akg': expected a static shape (AKG hybrid kernels do not "
                         f"support dynamic shapes), got {shape}; use backend 'cpu' or 'composite'")


class SwiGLU(nn.Cell):
    """``SiLU(gate) * up`` over a packed ``[..., 2I]`` tensor.

    Shapes:
        x:   [..., 2I]  ``[gate, up]``
        out: [..., I]
    """

    def __init__(self, backend="auto"):
        super().__init__()
        self.backend = resolve_backend(backend)
        if self.backend == "cpu":
            self.op = _cpu_op()
        elif self.backend == "akg":
            self.op = _akg_op()

    def construct(self, x):
        shape = ops.shape(x)
        _check(len(shape), shape[-1] if shape else 0, x.dtype)  # the last dim is static even in dynamic graphs
        if self.backend == "composite":
            return _composite(x)
        if self.backend == "ascend":
            return _ascend(x)
        if self.backend == "cpu":
            return self.op(x)
        _check_static(shape)
        if 0 in shape:  # AKG cannot build a kernel for an empty tensor
            return ops.zeros(shape[:-1] + (shape[-1] // 2,), x.dtype)
        x2 = x.astype(mstype.float32).reshape(-1, shape[-1])  # [..., 2I] -> [T, 2I]; AKG computes float32
        return self.op(x2).reshape(shape[:-1] + (shape[-1] // 2,)).astype(x.dtype)  # -> [..., I]


@functools.cache
def _cell(backend):
    return SwiGLU(backend)


def swiglu(x, backend="auto"):
    """Functional form of :class:`SwiGLU`; one cached Cell per backend. Shapes as in :class:`SwiGLU`."""
    return _cell(resolve_backend(backend))(x)
