"""The cpu backend: the package's own C++ kernels as aot Custom ops (``csrc/``, bound through ``kernels``).

The gate/up GEMM has the SwiGLU as its epilogue, so [T, 2I] never exists; the GEMMs run a skinny kernel for few
tokens and oneDNN's matmul (MindSpore's libdnnl) above, reading the weights in place in their own dtype. AVX-512
(with AVX512-BF16's VDPBF16PS for bfloat16 where present), AVX2 or generic x86-64, chosen at run time; bfloat16
on AMX tiles where the CPU has them (csrc/amx.cc); the library's own thread pool (csrc/pool.cc). Quantized
weights are read in their containers; W8A8 quantizes x in the op and sums int8 x int8 in int32 (csrc/w8a8.cc).
The FFN block's RMSNorm and residual add are C++ calls too.
"""
from ms_swiglu.backends.cpu.ops import FusedAdd, FusedLinear, FusedRMSNorm, GroupedExperts, swiglu_op
from ms_swiglu.backends.cpu import kernels
from ms_swiglu.backends.matmul import DenseExperts, MatMulLinear
from ms_swiglu.backends.spec import Backend, Compute, Facts, check_format


def _activation_bytes(n, hidden, inter, itemsize):
    # the activation, the output, and the float32 staging [T, 2 x block] of the oneDNN calls
    return n * inter * itemsize + n * hidden * itemsize + 4 * n * 2 * min(kernels.tuning()["block_rows"], inter)


def _formats(method):
    """The formats of the library's rows on its kernels; every other one dequantized in the graph (MindSpore's
    ops beside the kernels: exact, not fast)."""
    return Compute.KERNEL if method.kernel in kernels.formats() else Compute.GRAPH


def _linear(dtype, swiglu, quant):
    if check_format(BACKEND, quant) is Compute.KERNEL:
        return FusedLinear(dtype, swiglu, quant)
    return MatMulLinear(BACKEND, dtype, swiglu, quant)


def _experts(dtype, quant, partial=False):  # noqa: ARG001 -- both take ids -1 (another rank's) as no expert
    if check_format(BACKEND, quant) is Compute.KERNEL and kernels.has_op("MoeGateUpSwiglu", quant):
        return GroupedExperts(dtype, quant, partial)
    return DenseExperts(BACKEND, dtype, quant)  # (a format row without the MoE ops: its experts in the graph)


BACKEND = Backend(
    name="cpu",
    summary="the package's C++ kernels: SwiGLU as the gate/up GEMM's epilogue (skinny GEMM, AMX, oneDNN)",
    swiglu=swiglu_op,
    linear=_linear,
    experts=_experts,
    rms_norm=FusedRMSNorm,
    add=FusedAdd,
    device="CPU",
    # Measured: MindSpore's graph-mode recompute (Cell.recompute, primitive recompute, mindspore.recompute) never
    # re-runs an aot Custom op; the MLP needs none: its forward never stores [T, 2I], its backward recomputes it.
    recomputable=False,
    upcasts_on_cpu=True,
    dynamic_shapes=True,
    facts=Facts(deployable="", graph_ops=frozenset({"Custom"}), activation_bytes=_activation_bytes),
    formats=_formats,
)
