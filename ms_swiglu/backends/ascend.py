"""The ascend backend: MindSpore's MatMul in the model dtype, then the builtin ``Swiglu`` (aclnnSwiGlu), for
the Ascend chips of ``ascend_support`` (no NPU has run it: docs/ascend.md). Graphs with it compile and
export to MindIR on the CPU; the exporter checks their op types against :data:`ASCEND_OPS`."""
import mindspore as ms
from mindspore import nn, ops
import numpy as np
from mindspore.common import dtype as mstype
from mindspore.ops.auto_generate import (DynamicQuantExt, GroupedMatmulV4, MoeInitRoutingV2, MoeTokenUnpermute,
                                         QuantBatchMatmul, QuantV2, WeightQuantBatchMatmul)

from ms_swiglu.backends.matmul import MatMulLinear, materialised_bytes
from ms_swiglu.backends.native import AddOp, RMSNormOp
from ms_swiglu.backends.spec import (IN_OUT, Backend, Compute, Derived, ExpertsOp, Facts, SwiGLUOp, WeightForm,
                                    check_format)
from ms_swiglu.errors import InputError
from ms_swiglu.quant.base import Activation
from ms_swiglu.quant.int4 import pack_int4, unpack_int4
from ms_swiglu.schema import INPUT_OFFSET

# Every op type an ascend-target graph of this package holds; each has an Ascend kernel. Anything else is refused.
ASCEND_OPS = frozenset({
    # the dense MLP and the FFN block
    "Add", "Cast", "Depend", "Load", "MakeTuple", "MatMul", "Mul", "ReduceMean", "Reshape", "Rsqrt", "Shape",
    "Swiglu", "TupleGetItem", "UpdateState",
    # weight-only int8 and int4 (W8A16, W4A16); per-group scales [M, G] enter it as [G, M]; int4 zero points
    # as offsets 8 - z
    "WeightQuantBatchMatmul", "Transpose", "Squeeze", "Sub",
    # W8A8: dynamic activations, static ones (QuantV2 and its scale and offset along K)
    "DynamicQuantExt", "QuantBatchMatmul", "QuantV2", "OnesLike", "Reciprocal",
    # the MoE block: the routers (softmax / sigmoid group top-k) and the grouped experts
    "BroadcastTo", "Div", "ExpandDims", "GatherD", "Greater", "LogicalNot", "MaskedFill", "Muls", "OneHot",
    "Sigmoid", "Softmax", "Sort", "StridedSlice", "SumExt", "TopK",
    "MoeInitRoutingV2", "GroupedMatmulV4", "InnerMoeTokenUnpermute"})
# what an expert-parallel rank's experts add (SinkGroupExperts); its dispatcher's collectives are the dispatcher's
# (ms_swiglu.parallel, ``graph_ops``)
SINK_GROUP_OPS = frozenset({"Less", "NanToNum"})


def swiglu(x):
    """[T, 2I] -> [T, I]: ``Swiglu`` applies Swish to the first half of the last dim (gate first). A graph of this
    backend is straight-line: no token is handled before the graph (``ms_swiglu.cells.TokenCell``), since
    aclnnSwiGlu takes no empty tensor in some CANN releases (8.0.RC2: "不支持空Tensor")."""
    return ops.swiglu(x, -1)


def _check_quant(dtype, quant):
    """A format the backend computes (:func:`_formats`); the weight-quant and quant matmuls and GroupedMatmulV4's
    quantized modes take float16/bfloat16 activations only."""
    check_format(BACKEND, quant)
    if quant.quantized and dtype not in (ms.float16, ms.bfloat16):
        raise InputError(f"backend ascend, quant {quant.name}: expected float16 or bfloat16 activations (the "
                         f"quantized matmuls take no float32), got {dtype}")


class SignedInt4(WeightForm):
    """Ascend's int4 (``qint4x2``, aclnn's INT4): two signed values a byte, the even index in the low nibble, packed
    along the held last axis. A format value ``u`` (0..15, zero point 8) is held as ``u - 8``: the stored byte
    ``^ 0x88``. Held ``[..., K, N/2]`` (``in_out``): the layout MindSpore's own Ascend test of
    WeightQuantBatchMatmul feeds (tests/st/ops/ascend/test_weight_quant_int4.py) and GroupedMatmulV4's only one."""

    in_out, packs, dtype = True, True, ms.qint4x2

    def store(self, w):
        if isinstance(w, tuple):
            return super().store(w)
        u = unpack_int4(np.asarray(w).view(np.uint8))  # [..., M, K]
        return pack_int4(np.swapaxes(u, -1, -2)) ^ np.uint8(0x88)  # [..., K, M/2], signed nibbles

    def unstore(self, w):
        if isinstance(w, tuple):
            return super().unstore(w)
        u = unpack_int4(np.asarray(w).view(np.uint8) ^ np.uint8(0x88))  # [..., K, M]
        return pack_int4(np.swapaxes(u, -1, -2))


def _antiquant(quant, aux, dtype, axes):
    """(scale, offset) of WeightQuantBatchMatmul and GroupedMatmulV4's antiquant ``(w + offset) * scale``, in the
    activations' dtype: per channel ``[..., M]``, or per group ``[..., G, M]`` (the format's ``[..., M, G]``
    transposed by ``axes``); int4's offset ``8 - z`` (the held values are ``u - 8``), None where it is 0."""
    scale = aux[0].astype(dtype)
    zero = aux[1] if quant.zero_point else None
    if ops.shape(scale)[-1] == 1:  # one group a row: per channel
        scale = scale.squeeze(-1)
        zero = None if zero is None else zero.squeeze(-1)
    elif scale.ndim == len(axes):
        scale = ops.transpose(scale, axes)
        zero = None if zero is None else ops.transpose(zero, axes)
    offset = None if zero is None else (8.0 - zero.astype(mstype.float32)).astype(dtype)
    return scale, offset


class WeightQuantLinear(nn.Cell):
    """``x (antiquant w)^T`` by WeightQuantBatchMatmul (aclnnWeightQuantBatchMatmulV2), the scales (and int4's
    offsets) in the activations' dtype: per-channel ``[M]``, or per group (``antiquant_group_size``) ``[ceil(K /
    group), M]`` (the op's documented per-group shape, which vllm-ascend passes too; the format's ``[M, G]``
    transposed). int8 weights read as stored ([M, K]: ``transpose_weight``); int4 held [K, M/2]
    (:class:`SignedInt4`). The op takes a group size in [32, K - 1]: where a row is one group, per-channel.

    Shapes:
        x: [T, K]    w: [M, K] int8 or [K, M/2] qint4x2    scale: [M] or [M, K/G]    zero: [M, K/G]    out: [T, M]
    """

    def __init__(self, quant):
        super().__init__()
        self.method, int4 = quant, quant.bits == 4
        self.form = SignedInt4() if int4 else WeightForm()
        self.per_channel = WeightQuantBatchMatmul(transpose_x=False, transpose_weight=not int4,
                                                  antiquant_group_size=0)
        self.per_group = None if quant.group is None else WeightQuantBatchMatmul(
            transpose_x=False, transpose_weight=not int4, antiquant_group_size=quant.group)

    def construct(self, x, w, *aux):
        shape = ops.shape(x)
        x2 = x.reshape(-1, shape[-1])
        scale, offset = _antiquant(self.method, aux, x.dtype, (1, 0))
        if self.per_group is None or scale.ndim == 1:
            y = self.per_channel(x2, w, scale, offset)  # [T, K] x [M, K]^T -> [T, M]
        else:
            y = self.per_group(x2, w, scale, offset)
        return y.reshape(shape[:-1] + (ops.shape(y)[-1],))


class QuantLinear(nn.Cell):
    """W8A8 with dynamic activations: DynamicQuantExt (aclnnDynamicQuant: ``s = max|x| / 127`` per token,
    ``x_q = round(x / s)``), then QuantBatchMatmul (aclnnQuantMatmulV4): ``(x_q q^T) * scale[m] * s[t]`` with
    int32 accumulation, out in the activations' dtype; the weight scale float32, as the op takes it with a
    per-token scale for both float16 and bfloat16 outputs.

    Shapes:
        x: [T, K]    w: [M, K] int8    scale: [M] float32    out: [T, M]
    """

    form = WeightForm()

    def __init__(self, dtype):
        super().__init__()
        self.quantize = DynamicQuantExt()
        self.qmm = QuantBatchMatmul(transpose_x1=False, transpose_x2=True, dtype=dtype)

    def construct(self, x, w, scale):
        shape = ops.shape(x)
        xq, sx = self.quantize(x.reshape(-1, shape[-1]), None)  # [T, K] int8, [T] float32
        y = self.qmm(xq, w, scale, None, None, sx)  # [T, M]
        return y.reshape(shape[:-1] + (ops.shape(y)[-1],))


def _static_bias(parts):
    """QuantBatchMatmul's int32 bias folding the activations' offset: ``(x_q - o) q^T = x_q q^T - o sum_k q``
    (msModelSlim's ``quant_bias`` of a bias-free projection; a rank's own columns under a column split)."""
    q, o = parts[""], parts[INPUT_OFFSET].reshape(-1)[0]
    return (-int(o) * np.asarray(q, np.int64).sum(-1)).astype(np.int32)


class StaticQuantLinear(nn.Cell):
    """W8A8 with static activations (msModelSlim's W8A8): QuantV2 (aclnnAscendQuant, ``round(x * (1 / s) + o)``
    saturated to int8; x and 1/s in float32, so that no rounding of the scale to the activations' dtype moves the
    grid), then QuantBatchMatmul ``(x_q q^T + bias) * scale`` with the int32 ``bias`` (:func:`_static_bias`,
    derived at load) and ``scale`` the row's ``s_x s_w`` in float32; float16 outputs take a per-token scale of
    ones beside it (the op takes a float32 scale for float16 outputs only so).

    Shapes:
        x: [T, K]    w: [M, K] int8    scale: [M] float32    input_scale, input_offset: [1]    bias: [M] int32
    """

    form = WeightForm()
    derived = (Derived("_quant_bias", "int32", _static_bias),)

    def __init__(self, dtype):
        super().__init__()
        self.quantize, self.per_token = QuantV2(), dtype == ms.float16
        self.qmm = QuantBatchMatmul(transpose_x1=False, transpose_x2=True, dtype=dtype)

    def construct(self, x, w, scale, input_scale, input_offset, bias):
        shape = ops.shape(x)
        x2 = x.reshape(-1, shape[-1]).astype(mstype.float32)  # [T, K]
        k = (shape[-1],)
        xq = self.quantize(x2, ops.broadcast_to(1.0 / input_scale, k), ops.broadcast_to(input_offset, k), False,
                           "ROUND", mstype.int8)
        ones = ops.ones_like(x2[:, 0]) if self.per_token else None  # [T] float32
        y = self.qmm(xq, w, scale, None, bias, ones)  # [T, M]
        return y.reshape(shape[:-1] + (ops.shape(y)[-1],))


def _linear(dtype, swiglu, quant):
    _check_quant(dtype, quant)
    op = None
    if quant.quantized:
        op = {Activation.DYNAMIC: lambda: QuantLinear(dtype), Activation.STATIC: lambda: StaticQuantLinear(dtype),
              Activation.NONE: lambda: WeightQuantLinear(quant)}[quant.activation]()
    return MatMulLinear(BACKEND, dtype, swiglu, quant, op)


class GroupedExperts(ExpertsOp):
    """The routed experts with MindSpore's MoE primitives for Atlas A2/A3 (mindformers' inference chain):
    MoeInitRoutingV2 (dropless: the T k rows grouped by expert, stably, and each expert's
    row count) -> GroupedMatmulV4 -> Swiglu -> GroupedMatmulV4 -> MoeTokenUnpermute (each token's k rows
    weighted and summed). Quantized experts by GroupedMatmulV4's modes: int8 weights with per-channel antiquant
    scales [E, out]; int4 with per-group antiquant scales (and offsets) [E, in/G, out]; W8A8 with int8 rows
    (DynamicQuantExt per row: each row is one token's) and per-channel scales [E, out] beside per-row ones.
    GroupedMatmulV4 computes x W_e with W_e [in, out] and has no transpose, so this backend stores the stacked
    weights [E, H, 2I] and [E, I, H] (``form``; int4 packed along out: :class:`SignedInt4`).

    Shapes:
        x: [T, H]    ids: [T, k] int32    weights: [T, k] float32
        w_gate_up: [E, H, 2I] (columns [gate_e | up_e])    w_down: [E, I, H]    out: [T, H]
    """

    form = IN_OUT

    def __init__(self, dtype, quant):
        super().__init__()
        _check_quant(dtype, quant)
        if quant.activation is Activation.STATIC:
            raise InputError(f"backend ascend, MoE experts: expected weight-only or dynamic int8 activations, got "
                             f"{quant.name} ({quant.activation.value})")
        if quant.bits == 8 and quant.group:
            raise InputError(f"backend ascend, MoE experts: expected quant int8 (per-channel scales), got "
                             f"{quant.name}; "
                             f"GroupedMatmulV4 documents per-group antiquant for int4 weights only")
        if quant.bits == 4:
            self.form = SignedInt4()
        self.method, self.int8_rows = quant, quant.activation is Activation.DYNAMIC
        # GroupedMatmulV4 with int8 rows: a bfloat16 weight scale gives bfloat16 outputs, a float32 one float16
        self.scale_dtype = ms.bfloat16 if dtype == ms.bfloat16 else ms.float32
        self.init_routing, self.gmm, self.unpermute = MoeInitRoutingV2(), GroupedMatmulV4(), MoeTokenUnpermute()
        self.quantize = DynamicQuantExt() if self.int8_rows else None

    def route(self, x, ids, weights, experts):
        """(rows [T k, H] grouped by expert, their source rows, int64 row counts per expert [E], weights):
        dropless (drop_pad_mode 0, active_num 0), counts (flag 2) per expert."""
        rows, row_idx, counts, _ = self.init_routing(x, ids, 0, 0, experts, 0, 2, False)
        return rows, row_idx, counts.astype(ms.int64), weights  # GroupedMatmulV4's group_list type 1: counts

    def grouped(self, y):
        """The grouped down projection's output [T k, H] as the unpermute takes it."""
        return y

    def matmul(self, rows, w, aux, counts):
        """One grouped projection of the rows [T k, in] by the held weights, in the rows' dtype."""
        if self.int8_rows:
            rq, rs = self.quantize(rows, None)  # [T k, in] int8, [T k] float32
            return self.gmm([rq], [w], None, [aux[0].astype(self.scale_dtype)], None, None, None, [rs], counts,
                            split_item=3, group_type=0, group_list_type=1, output_dtype=rows.dtype)[0]
        scale, offset = _antiquant(self.method, aux, rows.dtype, (0, 2, 1)) if aux else (None, None)
        return self.gmm([rows], [w], None, None, None, None if scale is None else [scale],
                        None if offset is None else [offset], None, counts, split_item=3, group_type=0,
                        group_list_type=1)[0]

    def construct(self, x, ids, weights, w_gate_up, w_down, aux_gate_up=(), aux_down=()):
        rows, row_idx, counts, weights = self.route(x, ids, weights, ops.shape(w_gate_up)[0])
        h = ops.swiglu(self.matmul(rows, w_gate_up, aux_gate_up, counts), -1)  # [T k, 2I] -> [T k, I]
        y = self.matmul(h, w_down, aux_down, counts)  # [T k, H]
        # probs in the activation dtype: with float32 probs the op would cast [T k, H] to float32 and back
        return self.unpermute(self.grouped(y), row_idx, weights.astype(y.dtype))  # [T, H]


class SinkGroupExperts(GroupedExperts):
    """The experts of one expert-parallel rank: a slot with id -1 belongs to another rank's expert.
    MoeInitRoutingV2 takes ids in [0, E) only (and MindSpore 2.10 has no routing op with an expert range), so
    those slots go to a sink group E with weight 0, as mindformers' all-gather dispatcher does: the grouped
    matmuls compute the first E groups' rows (``counts[:E]``), the sink rows keep whatever their buffer held,
    which their weight 0 cancels once NanToNum has made it finite (an overflow in a computed row stays visible
    as the dtype's largest value)."""

    LARGEST = {ms.float32: 3.4028234663852886e38, ms.float16: 65504.0, ms.bfloat16: 3.3895313892515355e38}

    def __init__(self, dtype, quant):
        super().__init__(dtype, quant)
        self.largest = self.LARGEST[dtype]

    def route(self, x, ids, weights, experts):
        elsewhere = ids < 0
        ids = ids + elsewhere.astype(ms.int32) * (experts + 1)  # -1 -> E, the sink
        weights = ops.masked_fill(weights, elsewhere, 0.0)
        rows, row_idx, counts, weights = super().route(x, ids, weights, experts + 1)
        return rows, row_idx, counts[:experts], weights

    def grouped(self, y):
        return ops.nan_to_num(y, 0.0, self.largest, -self.largest)


def _formats(method):
    """The formats the quantized matmuls take: weight-only int8 (per row or group), int4 in groups of a multiple
    of 32 (WeightQuantBatchMatmul's antiquant_group_size, GroupedMatmulV4's per-group antiquant) with or without
    zero points, W8A8 (static activations: dense projections only); the others refused."""
    if method.weight_only_int8 or method.quantizes_activations:
        return Compute.KERNEL
    if method.bits == 4 and method.activation is Activation.NONE and method.group % 32 == 0:
        return Compute.KERNEL
    return None


def _experts(dtype, quant, partial=False):
    return (SinkGroupExperts if partial else GroupedExperts)(dtype, quant)


BACKEND = Backend(
    name="ascend",
    summary="MindSpore's MatMul, then the builtin Swiglu (Ascend: docs/ascend.md)",
    swiglu=lambda: SwiGLUOp(swiglu),
    linear=_linear,
    experts=_experts,
    rms_norm=RMSNormOp,
    add=AddOp,
    device="Ascend",
    recomputable=True,
    upcasts_on_cpu=False,
    dynamic_shapes=True,
    facts=Facts(deployable="Ascend through MindSpore's runtime (docs/ascend.md)", graph_ops=frozenset({"Swiglu"}),
                activation_bytes=materialised_bytes, allowed_ops=ASCEND_OPS, partial_ops=SINK_GROUP_OPS),
    formats=_formats,
)
