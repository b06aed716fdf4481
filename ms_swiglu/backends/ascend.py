"""The ascend backend: MindSpore's MatMul in the model dtype, then the builtin ``Swiglu`` (aclnnSwiGlu), for
Atlas A2/A3. Not run on hardware here: no NPU on the machine this package is tested on. Graphs with it compile and
export to MindIR on the CPU; the exporter checks their op types against :data:`ASCEND_OPS`."""
from mindspore import ops

from ms_swiglu.backends.matmul import MatMulLinear, materialised_bytes
from ms_swiglu.backends.spec import Backend, SwiGLUOp

# Every op type an ascend-target graph of this package holds; each has an Ascend kernel. Anything else is refused.
ASCEND_OPS = frozenset({"Add", "Cast", "Depend", "Load", "MakeTuple", "MatMul", "Mul", "ReduceMean", "Reshape",
                        "Rsqrt", "Shape", "Swiglu", "TupleGetItem", "UpdateState"})


def swiglu(x):
    """[T, 2I] -> [T, I]: ``Swiglu`` applies Swish to the first half of the last dim (gate first)."""
    return ops.swiglu(x, -1)


BACKEND = Backend(
    name="ascend",
    summary="MindSpore's MatMul, then the builtin Swiglu (Atlas A2/A3; not run on hardware here)",
    swiglu=lambda: SwiGLUOp(swiglu),
    linear=lambda dtype, swiglu: MatMulLinear(BACKEND, dtype, swiglu),
    device="Ascend",
    recomputable=True,
    upcasts_on_cpu=False,
    dynamic_shapes=True,
    deployable="Atlas A2/A3 through MindSpore Lite (expected; not run on hardware here)",
    graph_ops=frozenset({"Swiglu"}),
    activation_bytes=materialised_bytes,
    allowed_ops=ASCEND_OPS,
)
