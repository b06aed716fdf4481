"""The ge backend: graphs whose every op has a GE adapter in the MindSpore 2.10 wheel (``ascend_support.
ge_adapters``), so that GE (MindSpore Lite's ``converter_lite --optimize=ascend_oriented``, AIR + ATC) can take them
whole, with a sparse MoE: each token's rows go through its k experts only, k/E of the dense ``portable`` graph's
expert FLOPs (:func:`expert_flops`).

    dense MLP   MatMul -> Split -> SiLU -> Mul -> MatMul (the composite backend's ops)
    MoE         router: MatMul, Cast, MoeGatingTopKSoftmax [-> ReduceSum, Div] (softmax families), or Sigmoid, Add,
                TopK, ReduceSum, OneHot, Tile, MaskedFill, GatherD [, Div], Mul (DeepSeek-V3's group-limited top-k);
                experts: MoeInitRouting -> MoeComputeExpertTokens -> Cast int64 -> GroupedMatmul (gate_up) -> Split,
                SiLU, Mul -> GroupedMatmul (down) -> MoeFinalizeRouting (x1: the shared expert's output, or zeros)

The MoE primitives have no CPU kernel: these graphs compile and export on the CPU, and the exporter checks their
twin (``composite``) against the golden outputs. MoeInitRouting's ``active_num`` (the token count) is a GE attribute,
fixed when GE compiles the graph: a MoE graph of this backend is exported at a static shape (``Facts.static_moe``).
Conventions, from the CANN aclnn documents of each op (hiascend.com, aolapi/context/aclnn<Op>.md):

- MoeGatingTopKSoftmax: softmax over all E experts, then top-k; not renormalised; row_idx[t, j] = j T + t.
- MoeInitRouting: the T k (token, slot) pairs sorted by expert id, stably; expanded_x [min(T, active_num) k, H]
  holds their rows in that order; expanded_row_idx[j T + t] is the row of token t's slot j there.
- MoeComputeExpertTokens: per expert e the number of sorted rows with an id <= e (each group's end), which is
  GroupedMatmul's group_list (group_list_type 0, int64).
- GroupedMatmul (split_item 3, group_type 0): rows [end[e-1], end[e]) times weight[e], weights [E, in, out]; GE gets
  no transpose flag from MindSpore's adapter, so the experts are stored [E, H, 2I] and [E, I, H] (``in_out``).
- MoeFinalizeRouting: out[t] = x1[t] + sum_j scales[t, j] (expanded_x[expanded_row_idx[t + j T]] + bias[ids[t, j]]),
  scales in the activation dtype, bias [E, H] a tensor (zeros here).

Shape legend: T tokens, H hidden_size, I intermediate_size, E experts, k experts per token, G groups.
"""
from mindspore import Tensor, ops
from mindspore.common import dtype as mstype
from mindspore.ops.auto_generate import (GroupedMatmul, MoeComputeExpertTokens, MoeFinalizeRouting,
                                         MoeGatingTopKSoftmax, MoeInitRouting, SiLU)

from ms_swiglu import routing
from ms_swiglu.backends.composite import _activation_bytes
from ms_swiglu.backends.matmul import MatMulLinear
from ms_swiglu.backends.native import AddOp, RMSNormOp
from ms_swiglu.backends.spec import IN_OUT, Backend, Compute, ExpertsOp, Facts, SwiGLUOp
from ms_swiglu.errors import InputError
from ms_swiglu.quant.base import Activation
from ms_swiglu.routers import SigmoidGroupTopK, SoftmaxTopK

# Every op type a graph of this backend holds (each with a GE adapter: tests/test_ge_moe.py reads the wheel's list).
# Primitives are named as classes (ops.ReduceSum, ops.Mul, ...): some functional forms of MindSpore 2.10 lower to
# primitives that have none (Tensor.sum -> SumExt, a tensor times a Python float -> Muls, `<` one -> LessScalar).
GE_OPS = frozenset({
    # the dense MLP, the FFN block, int8 weights dequantized in the graph, dynamic shapes
    "Add", "Cast", "Depend", "ExpandDims", "Load", "MakeTuple", "MatMul", "Mul", "ReduceMean", "Reshape", "Rsqrt",
    "Shape", "SiLU", "Split", "TupleGetItem", "UpdateState",
    # int4 weights unpacked and dequantized in the graph
    "Concat", "FloorDiv", "FloorMod", "Sub",
    # the routers
    "Div", "GatherD", "Less", "MaskedFill", "MoeGatingTopKSoftmax", "OneHot", "ReduceSum", "Sigmoid", "Tile", "TopK",
    # the routed experts
    "CumSum", "GroupedMatmul", "MoeComputeExpertTokens", "MoeFinalizeRouting", "MoeInitRouting", "ZerosLike"})

_SPLIT, _SILU = ops.Split(-1, 2), SiLU()


def swiglu(x):
    """[T, 2I] -> [T, I]: Split, SiLU and Mul in float32, rounded once (the composite backend's computation)."""
    gate, up = _SPLIT(x.astype(mstype.float32))
    return (_SILU(gate) * up).astype(x.dtype)


class GatingSoftmaxTopK(SoftmaxTopK):
    """Mixtral, Qwen2-MoE, Qwen3-MoE: the logits (MatMul in the model dtype) in float32 through MoeGatingTopKSoftmax
    (softmax over all E, then top-k: the package's softmax router), renormalised by ReduceSum + Div with
    ``renormalize``. The parameters are :class:`~ms_swiglu.routers.SoftmaxTopK`'s.

    Shapes:
        x: [T, H]    weight: [E, H]    out: weights [T, k] float32, experts [T, k] int32
    """

    def __init__(self, hidden_size, num_experts, top_k, *, renormalize, dtype):
        super().__init__(hidden_size, num_experts, top_k, renormalize=renormalize, dtype=dtype, backend=BACKEND)
        self.gating, self.total = MoeGatingTopKSoftmax(), ops.ReduceSum(keep_dims=True)

    def construct(self, x):
        logits = self.logits(x, self.weight).astype(mstype.float32)  # [T, E]
        # [T, k] float32, [T, k] int32; its row ids j T + t are built again by the experts op, for every router
        weights, experts, _ = self.gating(logits, None, self.top_k)
        if self.renormalize:
            weights = weights / self.total(weights, -1)  # [T, k] / [T, 1]
        return weights, experts


class GroupTopK(SigmoidGroupTopK):
    """DeepSeek-V3 (noaux_tc) in ops with GE adapters: sigmoid scores of the float32 logits; each of G groups scores
    the sum of its two best biased scores (TopK, ReduceSum), the ``topk_group`` best groups stay (TopK, OneHot summed
    to a [T, G] mask, tiled over each group's experts), the other experts are -inf (MaskedFill); the top-k biased
    scores choose the experts (TopK), the weights are their unbiased scores (GatherD), renormalised with
    ``renormalize`` (ReduceSum, Div), times ``routed_scaling_factor``. The parameters are
    :class:`~ms_swiglu.routers.SigmoidGroupTopK`'s.

    Shapes:
        x: [T, H]    weight: [E, H]    e_score_correction_bias: [E] float32
        out: weights [T, k] float32, experts [T, k] int32
    """

    def __init__(self, hidden_size, num_experts, top_k, *, n_group, topk_group, renormalize, routed_scaling_factor):
        super().__init__(hidden_size, num_experts, top_k, n_group=n_group, topk_group=topk_group,
                         renormalize=renormalize, routed_scaling_factor=routed_scaling_factor, backend=BACKEND)
        self.num_experts, self.size = num_experts, num_experts // n_group
        self.sigmoid, self.topk, self.gather = ops.Sigmoid(), ops.TopK(sorted=True), ops.GatherD()
        self.sum, self.total = ops.ReduceSum(keep_dims=False), ops.ReduceSum(keep_dims=True)
        self.one_hot, self.tile, self.masked_fill = ops.OneHot(), ops.Tile(), ops.MaskedFill()
        self.less, self.mul = ops.Less(), ops.Mul()  # with tensor operands: a Python scalar makes LessScalar, Muls
        self.on, self.off = Tensor(1.0, mstype.float32), Tensor(0.0, mstype.float32)
        self.neg_inf, self.factor = Tensor(float("-inf"), mstype.float32), Tensor(self.scale, mstype.float32)

    def construct(self, x):
        scores = self.sigmoid(self.logits(x.astype(mstype.float32), self.weight))  # [T, E]
        choice = scores + self.e_score_correction_bias  # [T, E]: the bias only chooses
        if self.n_group > 1:
            best = self.topk(choice.reshape(-1, self.n_group, self.size), 2)[0]  # [T, G, 2]
            kept = self.topk(self.sum(best, -1), self.topk_group)[1]  # [T, G] -> [T, topk_group] int32
            keep = self.sum(self.one_hot(kept, self.n_group, self.on, self.off), 1)  # [T, G]: 1 kept, else 0
            keep = self.tile(keep.expand_dims(-1), (1, 1, self.size)).reshape(-1, self.num_experts)  # [T, E]
            choice = self.masked_fill(choice, self.less(keep, self.on), self.neg_inf)  # the other groups' out
        _, chosen = self.topk(choice, self.top_k)  # [T, k] int32
        weights = self.gather(scores, 1, chosen)  # [T, k]: the unbiased scores
        if self.renormalize:
            weights = weights / (self.total(weights, -1) + 1e-20)
        return self.mul(weights, self.factor), chosen


def _router(config, hidden_size, num_experts, top_k, dtype):
    if type(config) is routing.Softmax:
        return GatingSoftmaxTopK(hidden_size, num_experts, top_k, renormalize=config.renormalize, dtype=dtype)
    if type(config) is routing.SigmoidGroups:
        return GroupTopK(hidden_size, num_experts, top_k, n_group=config.n_group, topk_group=config.topk_group,
                         renormalize=config.renormalize, routed_scaling_factor=config.routed_scaling_factor)
    raise InputError(f"backend ge: expected a router config of {', '.join(routing.ROUTERS)}, got "
                     f"{type(config).__name__}")


class RoutedExperts(ExpertsOp):
    """The routed experts through GE's MoE ops (module docstring): MoeInitRouting groups the T k (token, slot) rows
    by expert, MoeComputeExpertTokens gives each expert's end row, two GroupedMatmuls with the SwiGLU between them
    compute each row with its own expert only, MoeFinalizeRouting sums each token's k rows weighted and adds
    ``residual`` (the shared expert's output; zeros without one).

    Shapes:
        x: [T, H]    ids: [T, k] int32    weights: [T, k] float32    residual: [T, H] or None
        w_gate_up: [E, H, 2I] (columns [gate_e | up_e])    w_down: [E, I, H]    out: [T, H]
    """

    form = IN_OUT
    adds_residual = True

    def __init__(self, dtype, quant, partial=False):
        super().__init__()
        if quant.quantized:
            raise InputError(f"backend ge, MoE experts: expected float weights, got {quant.name} (its GroupedMatmul "
                             f"is given no antiquant scales); export --target ascend or portable for int8 experts")
        if partial:
            raise InputError("backend ge, MoE experts: expected one process holding every expert, got an "
                             "expert-parallel rank's (MoeInitRouting takes no other rank's slots); export --target "
                             "ascend or portable with --ep-size")
        self.init_routing, self.expert_tokens = MoeInitRouting(), MoeComputeExpertTokens()
        self.gmm, self.finalize = GroupedMatmul(split_item=3, group_type=0), MoeFinalizeRouting()
        self.act = SwiGLUOp(swiglu)
        self.place, self.count, self.zeros_like = ops.CumSum(exclusive=True), ops.ReduceSum(True), ops.ZerosLike()
        self.zero = Tensor(0, dtype)

    def construct(self, x, ids, weights, w_gate_up, w_down, a_gate_up=(), a_down=(), residual=None):
        tokens, hidden = ops.shape(x)
        experts = ops.shape(w_gate_up)[0]
        ones = self.zeros_like(ids) + 1  # [T, k] int32
        # [T, k]: j T + t, the source order MoeInitRouting takes and MoeFinalizeRouting reads back
        rows = self.place(ones, 0) + self.place(ones, 1) * self.count(ones, 0)
        routed, where, sorted_ids = self.init_routing(x, rows, ids, tokens)  # [T k, H] by expert; [T k]; [T k]
        ends = self.expert_tokens(sorted_ids, experts).astype(mstype.int64)  # [E]: each expert's end row
        h = self.gmm([routed], [w_gate_up], None, None, None, None, None, ends)[0]  # [T k, H] -> [T k, 2I]
        h = self.act(h)  # [T k, 2I] -> [T k, I]
        y = self.gmm([h], [w_down], None, None, None, None, None, ends)[0]  # [T k, I] -> [T k, H]
        bias = ops.broadcast_to(self.zero, (experts, hidden))  # [E, H]: the op takes no bias None
        if residual is None:
            residual = self.zeros_like(x)
        return self.finalize(y, residual, None, bias, weights.astype(x.dtype), where, ids)  # [T, H]


def expert_flops(hidden_size, intermediate_size, num_experts, top_k):
    """GEMM FLOPs per token of a MoE block's routed experts: ``{"dense": every expert on every token (the
    ``portable`` graph's BatchMatMuls), "ge": its k experts (this backend's GroupedMatmuls)}``; an expert is
    2 H 2I (gate_up) + 2 I H (down) = 6 H I."""
    per_expert = 2 * hidden_size * 2 * intermediate_size + 2 * intermediate_size * hidden_size
    return {"dense": num_experts * per_expert, "ge": top_k * per_expert}


BACKEND = Backend(
    name="ge",
    summary="MindSpore's MatMul, then Split + SiLU + Mul; MoE by GE's MoeInitRouting / GroupedMatmul / "
            "MoeFinalizeRouting (Ascend through GE: docs/ascend.md)",
    swiglu=lambda: SwiGLUOp(swiglu),
    linear=lambda dtype, swiglu, quant: MatMulLinear(BACKEND, dtype, swiglu, quant),  # int8: dequantized in the graph
    experts=RoutedExperts,
    rms_norm=RMSNormOp,
    add=AddOp,
    device="Ascend",
    recomputable=True,
    upcasts_on_cpu=False,
    dynamic_shapes=True,
    facts=Facts(deployable="Ascend through GE (MindSpore Lite, ATC) and MindSpore's runtime (docs/ascend.md)",
                graph_ops=frozenset(), activation_bytes=_activation_bytes, allowed_ops=GE_OPS, static_moe=True,
                expert_parallel=False),
    router=_router,
    # weight-only formats dequantized by the adapters' ops; int8 activations (their rounding) refused
    formats=lambda method: Compute.GRAPH if method.activation is Activation.NONE else None,
)
