"""The cpu backend's ops: the library's functions as aot Custom ops, each with its C++ InferShape/InferType and a
backward. Shape legend: T = tokens (any leading dims), K = d_in, M = d_out, I = intermediate_size."""
from mindspore import Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.ops import CustomRegOp, DataType

from ms_swiglu.backends.cpu import kernels
from ms_swiglu.backends.spec import ExpertsOp, SwiGLUOp


F = "float"  # an input in the op's float dtype: float32, float16 or bfloat16, like its output


def aot_op(name, inputs, bprop=None):
    """The library's function ``name`` as an aot Custom op on the CPU. ``inputs``: per input, ``F`` (the op's float
    dtype, which the output has too) or a fixed MindSpore DataType; output shape and dtype come from its C++
    {name}InferShape/InferType."""
    reg = CustomRegOp(name)
    for i in range(len(inputs)):
        reg = reg.input(i, f"x{i}")
    reg = reg.output(0, "y")
    for dt in (DataType.F32_Default, DataType.F16_Default, DataType.BF16_Default):
        reg = reg.dtype_format(*[dt if role == F else role for role in inputs], dt)
    return ops.Custom(f"{kernels.library_path()}:{name}", out_shape=None, out_dtype=None, func_type="aot",
                      bprop=bprop, reg_info=reg.target("CPU").get_op_info())


def swiglu_op():
    """SwigluFwd with its fused C++ backward, one per Cell (so that each can be marked on its own)."""
    bwd = aot_op("SwigluBwd", (F, F))

    def bprop(x, out, dout):
        return (bwd(x, dout),)  # [T, 2I] = [d_gate, d_up]

    return SwiGLUOp(aot_op("SwigluFwd", (F,), bprop))


I8, F32, I32 = DataType.I8_Default, DataType.F32_Default, DataType.I32_Default
_PART_TYPES = {"int8": I8, "uint8": DataType.U8_Default, "float32": F32}  # a format's parts as the ops take them


class FusedLinear(nn.Cell):
    """``x W^T`` in one C++ call (``Linear``), or with ``swiglu`` the SwiGLU of the packed output as the GEMM's
    epilogue (``GateUpSwiglu``: [T, 2I] never exists). The backward runs MindSpore's MatMul in float32; with
    ``swiglu`` it recomputes ``[gate, up]`` first. int8 weights (``quant``) are read as int8 and widened in the
    kernel, per-row scales applied to the float32 sums; per-group scales (int8-g128) dequantize a few rows at a
    time to the dtype the GEMM reads (inference only: no backward).

    int4 weights (``int4-gG``) are read as their bytes, two weights a byte, the nibbles widened in registers at
    one token and a block of rows dequantized to the GEMM's dtype above it. W8A8 (``w8a8``, ``w8a8-static``):
    x quantized to int8 in the op (per token, or by the input scale and offset), int8 x int8 summed in int32.

    Shapes:
        x: [T, K]    w: [M, K] (int8 with scale [M] or [M, K/128] float32; int4 [M, K/2] uint8 with scale [M, K/G]
        and zero points [M, K/G] uint8 with -zp; W8A8 scale [M], static: input scale and offset [1])
        out: [T, M], or [T, M/2] with ``swiglu``
    """

    def __init__(self, dtype, swiglu, quant):
        super().__init__()
        kernels.onednn()  # bind (and check) oneDNN now, not inside the first graph run
        name = "GateUpSwiglu" if swiglu else "Linear"
        if quant.quantized:  # the ops of the format's row of the library, on the format's parts
            self.op = aot_op(kernels.op_name(name, quant), (F, *(_PART_TYPES[p.dtype] for p in quant.parts)))
            return
        f32 = mstype.float32
        mm, mm_ta, mm_tb = ops.MatMul(), ops.MatMul(transpose_a=True), ops.MatMul(transpose_b=True)
        swiglu_bwd = aot_op("SwigluBwd", (F, F))

        def bprop(x, w, out, dout):
            # float32 before any reshape: the CPU has no bfloat16 Reshape
            x2, w2 = x.astype(f32).reshape(-1, ops.shape(w)[1]), w.astype(f32)  # [T, K], [M, K]
            dy = dout.astype(f32).reshape(-1, ops.shape(dout)[-1])  # [T, M] (swiglu: [T, M / 2])
            if swiglu:
                dy = swiglu_bwd(mm_tb(x2, w2), dy)  # [T, 2I]: d_gate, d_up
            return mm(dy, w2).reshape(ops.shape(x)).astype(x.dtype), mm_ta(dy, x2).astype(w.dtype)

        self.op = aot_op(name, (F, F), bprop)

    def construct(self, x, w, *aux):
        return self.op(x, w, *aux)


class GroupedExperts(ExpertsOp):
    """The routed experts of a MoE block in two C++ calls over the stacked weights, read in place: the rows
    grouped by expert, each expert's gate/up GEMM with the SwiGLU as its epilogue, then each expert's down GEMM
    and the weighted sum of every token's k rows in float32. Inference only (no backward). int8 experts are read
    as int8 and widened in the kernels. A slot with id -1 (another rank's expert) is skipped.

    Shapes:
        x: [T, H]    ids: [T, k] int32    weights: [T, k] float32
        w_gate_up: [E, 2I, H] (each [gate_e; up_e])    w_down: [E, H, I]    out: [T, H]
        int8: w_* int8, s_gate_up: [E, 2I] float32, s_down: [E, H] float32 (int8-g128: [E, 2I, H/128], [E, H, I/128])
        int4: w_* uint8 [E, 2I, H/2], [E, H, I/2] with scales (and zero points) [E, 2I, H/G], [E, H, I/G]
        W8A8: w_* int8 with scales [E, 2I], [E, H] (static: and each expert's input scale and offset [E, 1])
    """

    def __init__(self, dtype, quant, partial=False):  # noqa: ARG002 -- the kernels skip -1 ids
        super().__init__()
        kernels.onednn()
        w = tuple(_PART_TYPES[p.dtype] for p in quant.parts) if quant.quantized else (F,)
        self.gate_up = aot_op(kernels.op_name("MoeGateUpSwiglu", quant), (F, I32, *w))  # -> [T k, I], grouped rows
        self.down = aot_op(kernels.op_name("MoeDownCombine", quant), (F, I32, F32, *w))

    def construct(self, x, ids, weights, w_gate_up, w_down, a_gate_up=(), a_down=()):
        return self.down(self.gate_up(x, ids, w_gate_up, *a_gate_up), ids, weights, w_down, *a_down)


class FusedRMSNorm(nn.Cell):
    """RMSNorm in one C++ call (``RmsNorm``): float32 statistics, rounded once. The backward runs MindSpore's
    ops in float32.

    Shapes:
        x: [T, H]    w: [H]    out: [T, H]
    """

    def __init__(self, eps):
        super().__init__()
        f32 = mstype.float32
        self.eps = Tensor([eps], f32)

        def bprop(x, w, eps, out, dout):
            x32, w32, dy = x.astype(f32), w.astype(f32), dout.astype(f32)
            r = ops.rsqrt(ops.mean(x32 * x32, -1, keep_dims=True) + eps)  # [T, 1]
            xh, dxh = x32 * r, dy * w32  # [T, H]
            dx = r * (dxh - xh * ops.mean(dxh * xh, -1, keep_dims=True))
            dw = (dy * xh).reshape(-1, ops.shape(w)[0]).sum(0)  # [H]
            return dx.astype(x.dtype), dw.astype(w.dtype), ops.zeros_like(eps)

        self.op = aot_op("RmsNorm", (F, F, F32), bprop)

    def construct(self, x, w):
        return self.op(x, w, self.eps)


class FusedAdd(nn.Cell):
    """``a + b`` in one C++ call (``Add``), float32 inside, rounded once."""

    def __init__(self):
        super().__init__()
        def bprop(a, b, out, dout):
            return dout, dout

        self.op = aot_op("Add", (F, F), bprop)

    def construct(self, a, b):
        return self.op(a, b)
