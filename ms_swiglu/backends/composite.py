"""The composite backend: SwiGLU as split + silu + mul in MindSpore ops, after MindSpore's MatMul. The reference
of every other backend, the form graph-kernel fusion recognises, and what the ``portable`` export holds."""
from mindspore import ops
from mindspore.common import dtype as mstype

from ms_swiglu.backends.matmul import DenseExperts, MatMulLinear
from ms_swiglu.backends.native import AddOp, RMSNormOp
from ms_swiglu.backends.spec import Backend, Facts, SwiGLUOp


def swiglu(x):
    """[T, 2I] -> [T, I]; SiLU and the product in float32, rounded once."""
    dtype = x.dtype
    gate, up = ops.chunk(x.astype(mstype.float32), 2, -1)
    return (ops.silu(gate) * up).astype(dtype)


def _activation_bytes(n, hidden, inter, itemsize):
    # gate_up, the float32 halves, silu and the product (float32), the rounded activation, the output
    return 2 * n * inter * itemsize + 4 * n * inter * 4 + n * inter * itemsize + n * hidden * itemsize


BACKEND = Backend(
    name="composite",
    summary="MindSpore's MatMul, then split + silu + mul (the reference)",
    swiglu=lambda: SwiGLUOp(swiglu),
    linear=lambda dtype, swiglu, quant: MatMulLinear(BACKEND, dtype, swiglu, quant),  # any format: its dequantize_op
    experts=lambda dtype, quant, partial=False: DenseExperts(BACKEND, dtype, quant),  # -1 ids match no expert
    rms_norm=RMSNormOp,
    add=AddOp,
    device=None,
    recomputable=True,
    upcasts_on_cpu=True,
    dynamic_shapes=True,
    facts=Facts(deployable="wherever MindSpore or MindSpore Lite runs", graph_ops=frozenset(),
                activation_bytes=_activation_bytes),
)
