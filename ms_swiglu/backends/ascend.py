"""The ascend backend: MindSpore's MatMul in the model dtype, then the builtin ``Swiglu`` (aclnnSwiGlu), for
the Ascend chips of ``ascend_support`` (no NPU has run it: docs/ascend.md). Graphs with it compile and
export to MindIR on the CPU; the exporter checks their op types against :data:`ASCEND_OPS`."""
import mindspore as ms
from mindspore import nn, ops
from mindspore.ops.auto_generate import GroupedMatmulV4, MoeInitRoutingV2, MoeTokenUnpermute, WeightQuantBatchMatmul

from ms_swiglu.backends.matmul import MatMulLinear, materialised_bytes
from ms_swiglu.backends.native import AddOp, RMSNormOp
from ms_swiglu.backends.spec import Backend, Compute, ExpertsOp, Facts, SwiGLUOp, check_format
from ms_swiglu.errors import InputError

# Every op type an ascend-target graph of this package holds; each has an Ascend kernel. Anything else is refused.
ASCEND_OPS = frozenset({
    # the dense MLP and the FFN block
    "Add", "Cast", "Depend", "Load", "MakeTuple", "MatMul", "Mul", "ReduceMean", "Reshape", "Rsqrt", "Shape",
    "Swiglu", "TupleGetItem", "UpdateState",
    # weight-only int8 (W8A16); per-group scales [M, G] enter it as [G, M]
    "WeightQuantBatchMatmul", "Transpose",
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
    """int8 weights (per row or per group) or none; WeightQuantBatchMatmul and GroupedMatmulV4's antiquant take
    float16/bfloat16 activations only."""
    check_format(BACKEND, quant)
    if quant.quantized and dtype not in (ms.float16, ms.bfloat16):
        raise InputError(f"backend ascend, quant {quant.name}: expected float16 or bfloat16 activations (the "
                         f"weight-quant matmuls take no float32), got {dtype}")


class WeightQuantLinear(nn.Cell):
    """``x (scale * q)^T`` by WeightQuantBatchMatmul (aclnnWeightQuantBatchMatmulV2): the int8 weights read as
    stored ([M, K]: ``transpose_weight``), the scales in the activations' dtype, as the op takes them: per-channel
    ``[M]``, or per group (``antiquant_group_size``) ``[ceil(K / group), M]`` (the op's documented per-group
    shape, which vllm-ascend passes too; ours ``[M, G]`` transposed). The op takes a group size in [32, K - 1]:
    where a row is one group (K = 128), its scales go in per-channel.

    Shapes:
        x: [T, K]    w: [M, K] int8    scale: [M] (int8-g128: [M, K/128])    out: [T, M]
    """

    def __init__(self, group=None):
        super().__init__()
        self.per_channel = WeightQuantBatchMatmul(transpose_x=False, transpose_weight=True, antiquant_group_size=0)
        self.per_group = None if group is None else WeightQuantBatchMatmul(
            transpose_x=False, transpose_weight=True, antiquant_group_size=group)

    def construct(self, x, w, scale):
        shape = ops.shape(x)
        x2, scale = x.reshape(-1, shape[-1]), scale.astype(x.dtype)
        if self.per_group is None:
            y = self.per_channel(x2, w, scale)  # [T, K] x [M, K]^T -> [T, M]
        elif ops.shape(scale)[-1] == 1:  # one group per row: scales [M, 1] -> [M]
            y = self.per_channel(x2, w, scale.reshape(-1))
        else:
            y = self.per_group(x2, w, ops.transpose(scale, (1, 0)))  # scales [M, G] -> [G, M]
        return y.reshape(shape[:-1] + (ops.shape(y)[-1],))


def _linear(dtype, swiglu, quant):
    _check_quant(dtype, quant)
    return MatMulLinear(BACKEND, dtype, swiglu, quant, WeightQuantLinear(quant.group) if quant.quantized else None)


class GroupedExperts(ExpertsOp):
    """The routed experts with MindSpore's MoE primitives for Atlas A2/A3 (mindformers' inference chain):
    MoeInitRoutingV2 (dropless: the T k rows grouped by expert, stably, and each expert's
    row count) -> GroupedMatmulV4 -> Swiglu -> GroupedMatmulV4 -> MoeTokenUnpermute (each token's k rows
    weighted and summed). int8 experts: GroupedMatmulV4 with per-channel antiquant scales [E, out].
    GroupedMatmulV4 computes x W_e with W_e [in, out] and has no transpose, so this backend stores the stacked
    weights [E, H, 2I] and [E, I, H] (``in_out``).

    Shapes:
        x: [T, H]    ids: [T, k] int32    weights: [T, k] float32
        w_gate_up: [E, H, 2I] (columns [gate_e | up_e])    w_down: [E, I, H]    out: [T, H]
    """

    in_out = True

    def __init__(self, dtype, quant):
        super().__init__()
        _check_quant(dtype, quant)
        if quant.group:
            raise InputError(f"backend ascend, MoE experts: expected quant int8 (per-channel scales), got "
                             f"{quant.name}; "
                             f"GroupedMatmulV4 documents per-group antiquant for int4 weights only")
        self.init_routing, self.gmm, self.unpermute = MoeInitRoutingV2(), GroupedMatmulV4(), MoeTokenUnpermute()

    def route(self, x, ids, weights, experts):
        """(rows [T k, H] grouped by expert, their source rows, int64 row counts per expert [E], weights):
        dropless (drop_pad_mode 0, active_num 0), counts (flag 2) per expert."""
        rows, row_idx, counts, _ = self.init_routing(x, ids, 0, 0, experts, 0, 2, False)
        return rows, row_idx, counts.astype(ms.int64), weights  # GroupedMatmulV4's group_list type 1: counts

    def grouped(self, y):
        """The grouped down projection's output [T k, H] as the unpermute takes it."""
        return y

    def construct(self, x, ids, weights, w_gate_up, w_down, aux_gate_up=(), aux_down=()):
        rows, row_idx, counts, weights = self.route(x, ids, weights, ops.shape(w_gate_up)[0])
        a_gate_up = [aux_gate_up[0].astype(x.dtype)] if aux_gate_up else None  # int8: antiquant scales
        a_down = [aux_down[0].astype(x.dtype)] if aux_down else None
        h = self.gmm([rows], [w_gate_up], None, None, None, a_gate_up, None, None, counts, split_item=3,
                     group_type=0, group_list_type=1)[0]  # [T k, 2I]
        h = ops.swiglu(h, -1)  # [T k, I]
        y = self.gmm([h], [w_down], None, None, None, a_down, None, None, counts, split_item=3, group_type=0,
                     group_list_type=1)[0]  # [T k, H]
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
    """Weight-only int8 (per row or per group) by WeightQuantBatchMatmul and GroupedMatmulV4's antiquant; the
    others refused."""
    return Compute.KERNEL if method.weight_only_int8 else None


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
