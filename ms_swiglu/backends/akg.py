"""The akg backend: MindSpore's MatMul, then a hybrid-DSL SwiGLU kernel compiled by AKG. Static shapes only
(AKG hybrid kernels take no dynamic shapes); computes in float32."""
from mindspore import ops
from mindspore.common import dtype as mstype
from mindspore.ops import kernel

from ms_swiglu.backends.matmul import DenseExperts, MatMulLinear, materialised_bytes
from ms_swiglu.backends.native import AddOp, RMSNormOp
from ms_swiglu.backends.spec import Backend, Facts, SwiGLUOp


@kernel
def _fwd(x):
    n = x.shape[0]
    h = x.shape[1] // 2
    y = output_tensor((n, h), x.dtype)
    for i in parallel(n):
        for j in vectorize(h):
            # AKG's float32 exp on the CPU is off by ~3e-4 relative; its float64 exp is not
            y[i, j] = x[i, j] / float32(1.0 + exp(float64(-x[i, j]))) * x[i, j + h]
    return y


@kernel
def _bwd(x, dy):
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


@ops.constexpr
def _check_static(shape):
    if any(d is None or d < 0 for d in shape):
        shape = tuple(-1 if d is None else d for d in shape)
        raise ValueError(f"swiglu backend 'akg': expected a static shape (AKG hybrid kernels do not "
                         f"support dynamic shapes), got {shape}; use backend 'cpu' or 'composite'")


def _op():
    bwd = ops.Custom(_bwd, out_shape=lambda x, dy: x, out_dtype=lambda x, dy: x, func_type="hybrid")

    def bprop(x, out, dout):
        return (bwd(x, dout),)

    fwd = ops.Custom(_fwd, out_shape=lambda x: x[:-1] + [x[-1] // 2], out_dtype=lambda x: x, func_type="hybrid",
                     bprop=bprop)

    def swiglu(x):  # [..., 2I] -> [..., I]
        shape = ops.shape(x)
        _check_static(shape)
        if 0 in shape:  # AKG cannot build a kernel for an empty tensor
            return ops.zeros(shape[:-1] + (shape[-1] // 2,), x.dtype)
        x2 = x.astype(mstype.float32).reshape(-1, shape[-1])  # [..., 2I] -> [T, 2I]; AKG computes float32
        return fwd(x2).reshape(shape[:-1] + (shape[-1] // 2,)).astype(x.dtype)

    return SwiGLUOp(swiglu)


BACKEND = Backend(
    name="akg",
    summary="MindSpore's MatMul, then a hybrid-DSL SwiGLU kernel compiled by AKG (static shapes)",
    swiglu=_op,
    linear=lambda dtype, swiglu, quant: MatMulLinear(BACKEND, dtype, swiglu, quant),
    experts=lambda dtype, quant, partial=False: DenseExperts(BACKEND, dtype, quant),
    rms_norm=RMSNormOp,
    add=AddOp,
    device="CPU",
    recomputable=False,
    upcasts_on_cpu=True,
    dynamic_shapes=False,
    facts=Facts(deployable="", graph_ops=frozenset({"Custom"}), activation_bytes=materialised_bytes),
)
