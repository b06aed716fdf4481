"""Fused SwiGLU over a packed tensor: ``out = SiLU(gate) * up``.

Shapes:
    x:   [..., 2I]  packed ``[gate, up]`` along the last dim (gate first, Megatron-LM order)
    out: [..., I]

The op comes from the backend (``ms_swiglu.backends``), chosen once, when the Cell is built.
"""
import functools

from mindspore import nn, ops
from mindspore.common import dtype as mstype

from ms_swiglu.backends import resolve

DTYPES = (mstype.float32, mstype.float16, mstype.bfloat16)


@ops.constexpr
def _check(rank, last, dtype):
    if dtype not in DTYPES:
        raise TypeError(f"swiglu: expected dtype float32, float16 or bfloat16, got {dtype}")
    if rank == 0:
        raise ValueError("swiglu: expected a tensor of rank >= 1 whose last dim is 2I, got a 0-d tensor")
    if last is not None and (last == 0 or last % 2):  # None: a dynamic last dim, checked by the kernel
        raise ValueError(f"swiglu: expected an even, non-zero last dim (2I), got {last}")


class SwiGLU(nn.Cell):
    """``SiLU(gate) * up`` over a packed ``[..., 2I]`` tensor, by the backend's op.

    Shapes:
        x:   [..., 2I]  ``[gate, up]``
        out: [..., I]
    """

    def __init__(self, backend="auto"):
        super().__init__()
        self.backend = resolve(backend)
        self.op = self.backend.swiglu()

    def construct(self, x):
        shape = ops.shape(x)
        _check(len(shape), shape[-1] if shape else 0, x.dtype)  # the last dim is static even in dynamic graphs
        return self.op(x)


@functools.cache
def _cell(backend):
    return SwiGLU(backend)


def swiglu(x, backend="auto"):
    """Functional form of :class:`SwiGLU`; one cached Cell per backend. Shapes as in :class:`SwiGLU`."""
    return _cell(resolve(backend))(x)
