"""The native GEMM: MindSpore's MatMul, then the backend's SwiGLU. The composite, akg and ascend backends use it,
and so do the unpacked baseline and the MoE router (``ms_swiglu.linear.Dense``); and the native experts of a MoE
block (:class:`DenseExperts`).

Shape legend: T = tokens (any leading dims), K = d_in, M = d_out, H = hidden_size, I = intermediate_size,
E = experts, k = experts per token.
"""
import mindspore as ms
from mindspore import nn, ops
from mindspore.common import dtype as mstype

from ms_swiglu.backends.spec import ExpertsOp, WeightForm, check_format
from ms_swiglu.quant.base import Activation


def cpu_upcast(dtype, backend):
    """Whether the MatMuls of ``backend`` take ``dtype`` in float32: float16/bfloat16 on a CPU device, which has
    no bfloat16 MatMul and whose float16 MatMul is ~10x slower than float32; never in a graph built for Ascend."""
    return dtype != mstype.float32 and backend.upcasts_on_cpu and ms.get_context("device_target") == "CPU"


def matmul(mm, x, w, upcast):
    """``x w^T`` by the MatMul primitive ``mm`` (transpose_b), in float32 with ``upcast``: [..., K] -> [..., M]."""
    dtype = x.dtype
    if upcast:
        x, w = x.astype(mstype.float32), w.astype(mstype.float32)
    shape = ops.shape(x)
    y = mm(x.reshape(-1, shape[-1]), w)  # [T, K] x [M, K]^T -> [T, M]
    return y.reshape(shape[:-1] + (ops.shape(y)[-1],)).astype(dtype)


class MatMulLinear(nn.Cell):
    """``x W^T`` by MindSpore's MatMul, then (with ``swiglu``) the backend's SwiGLU op. Quantized weights (the
    format ``quant``) are dequantized by the format first, or multiplied by ``quant_matmul(x, w, scale)`` where
    the backend has one.

    Shapes:
        x: [T, K]    w: [M, K] (int8 with scale [M] or [M, K/128])    out: [T, M], or [T, M/2] with ``swiglu``
    """

    def __init__(self, backend, dtype, swiglu, quant, quant_matmul=None):
        super().__init__()
        check_format(backend, quant)
        self.mm, self.upcast = ops.MatMul(transpose_b=True), cpu_upcast(dtype, backend)
        self.act = backend.swiglu() if swiglu else None
        self.dtype, self.quant_matmul = dtype, quant_matmul if quant.quantized else None
        self.form = getattr(self.quant_matmul, "form", None) or WeightForm()  # how the weight is held
        self.derived = getattr(self.quant_matmul, "derived", ())  # what it takes after the parts
        self.dequantize, self.quantize_x = quant.dequantize_op(), quant.activation_op()

    def construct(self, x, w, *aux):
        if self.quant_matmul is not None:
            y = self.quant_matmul(x, w, *aux)
        elif self.quantize_x is not None:  # int8 activations: (x_q - o) q^T, exact integers in float32, rescaled
            xq, sx = self.quantize_x(x, aux)  # [T, K], [T, 1] (per token) or [1] (per tensor)
            y = (matmul(self.mm, xq, w.astype(mstype.float32), False) * sx * aux[0]).astype(self.dtype)
        else:
            if self.dequantize is not None:
                w = self.dequantize(w, aux, mstype.float32 if self.upcast else self.dtype)
            y = matmul(self.mm, x, w, self.upcast)
        return y if self.act is None else self.act(y)


class DenseExperts(ExpertsOp):
    """The routed experts by their definition: every expert on every token in one BatchMatMul over E, each
    output weighted by the token's routing weight for it (zero off its top-k) and summed in float32. Static
    shapes and a graph that does not grow with E, in MindSpore ops that every device runs: the reference of the
    grouped implementations (which compute only the routed rows), at E/k times their FLOPs.

    Shapes:
        x: [T, H]    ids: [T, k] int32    weights: [T, k] float32
        w_gate_up: [E, 2I, H]    w_down: [E, H, I]    out: [T, H]
    """

    def __init__(self, backend, dtype, quant):
        super().__init__()
        self.bmm, self.upcast = ops.BatchMatMul(transpose_b=True), cpu_upcast(dtype, backend)
        self.act = backend.swiglu()
        self.dequantize, self.quantize_x = quant.dequantize_op(), quant.activation_op()
        self.static = quant.activation is Activation.STATIC  # each expert its own activation scale and offset

    def construct(self, x, ids, weights, w_gate_up, w_down, a_gate_up=(), a_down=()):
        dtype, (tokens, hidden), experts = x.dtype, ops.shape(x), ops.shape(w_gate_up)[0]
        if self.quantize_x is not None:  # W8A8: each expert's rows quantized per token, as GroupedMatmul's are
            return self._int8(x, ids, weights, w_gate_up, w_down, a_gate_up, a_down)
        if self.dequantize is not None:  # quantized: dequantized (float32 on a CPU device)
            wd = mstype.float32 if self.upcast else dtype
            w_gate_up, w_down = self.dequantize(w_gate_up, a_gate_up, wd), self.dequantize(w_down, a_down, wd)
        if self.upcast:
            x, w_gate_up, w_down = x.astype(mstype.float32), w_gate_up.astype(mstype.float32), w_down.astype(
                mstype.float32)
        # [E, T, k] one-hot by comparison, and [E, T]: the routing weight of every expert (no OneHot, which takes
        # no empty tensor, and no Transpose, which writes nothing on the runs after an empty one on the CPU)
        one_hot = (ops.arange(experts, dtype=mstype.int32).reshape(experts, 1, 1) == ids.expand_dims(0)).astype(
            mstype.float32)
        dense = (one_hot * weights.expand_dims(0)).sum(-1)
        xe = ops.broadcast_to(x.expand_dims(0), (experts, tokens, hidden))  # [E, T, H]
        h = self.act(self.bmm(xe, w_gate_up).astype(dtype))  # [E, T, 2I] -> [E, T, I]
        if self.upcast:
            h = h.astype(mstype.float32)
        y = self.bmm(h, w_down).astype(dtype).astype(mstype.float32)  # [E, T, H]
        return (y * dense.expand_dims(-1)).sum(0).astype(dtype)  # -> [T, H]

    def _int8(self, x, ids, weights, w_gate_up, w_down, a_gate_up, a_down):
        """The same with int8 activations: x per token (static: by each expert's scale), then each expert's SwiGLU
        output per row, the integer products summed in float32 and scaled per token and per output row."""
        dtype, (tokens, hidden), experts = x.dtype, ops.shape(x), ops.shape(w_gate_up)[0]
        f32 = mstype.float32
        one_hot = (ops.arange(experts, dtype=mstype.int32).reshape(experts, 1, 1) == ids.expand_dims(0)).astype(f32)
        dense = (one_hot * weights.expand_dims(0)).sum(-1)  # [E, T]
        if self.static:  # [E, T, H] by each expert's scale and offset ([E, 1] -> [E, 1, 1]); step 1
            xe, sx = self.quantize_x(ops.broadcast_to(x.expand_dims(0), (experts, tokens, hidden)),
                                     self._per_expert(a_gate_up))
        else:
            xq, sx = self.quantize_x(x, a_gate_up)  # [T, H], [T, 1]
            xe, sx = ops.broadcast_to(xq.expand_dims(0), (experts, tokens, hidden)), sx.expand_dims(0)  # [E, T, H]
        g = self.bmm(xe, w_gate_up.astype(f32)) * sx * a_gate_up[0].expand_dims(1)  # [E, T, 2I]
        h = self.act(g.astype(dtype))  # [E, T, I]
        hq, sh = self.quantize_x(h, self._per_expert(a_down) if self.static else a_down)  # per row of every expert
        y = (self.bmm(hq, w_down.astype(f32)) * sh * a_down[0].expand_dims(1)).astype(dtype).astype(f32)
        return (y * dense.expand_dims(-1)).sum(0).astype(dtype)  # -> [T, H]


    @staticmethod
    def _per_expert(aux):
        """A static format's parts with its activation scale and offset [E, 1] as [E, 1, 1], for [E, T, K] rows."""
        return (aux[0], aux[1].expand_dims(-1), aux[2].expand_dims(-1))


def materialised_bytes(n, hidden, inter, itemsize):
    """Intermediates of the native path: gate_up [T, 2I], the activation [T, I] and the output [T, H]."""
    return (3 * n * inter + n * hidden) * itemsize
