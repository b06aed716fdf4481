"""MoE routers: which k of E experts each token goes to, and with which weights. Ties go to the lower expert
index everywhere.

Shape legend: T = tokens, H = hidden_size, E = num_experts, k = top_k, G = n_group.
Every router: x [T, H] -> (weights [T, k] float32, experts [T, k] int32), slots in descending score order.

Each router Cell has a config of its own in ``ms_swiglu.routing``, which builds it for a block.
"""

import mindspore as ms
from mindspore import Parameter, nn, ops
from mindspore.common import dtype as mstype

from ms_swiglu import initial
from ms_swiglu import quant as formats
from ms_swiglu.backends import resolve
from ms_swiglu.config import to_dtype
from ms_swiglu.errors import InputError

_NEG_INF = float("-inf")


def top_k(values, k):
    """The k largest of the last dim, ties to the lower index: [T, E] float32 -> ([T, k], [T, k] int32). One
    descending sort, which keeps equal values in index order (TopK on the CPU breaks ties arbitrarily)."""
    picked, indices = ops.sort(values, -1, descending=True)
    first = _first_columns(indices, k)
    return ops.gather_elements(picked, 1, first), ops.gather_elements(indices, 1, first).astype(mstype.int32)


def _first_columns(indices, k):
    """[T, k] int32, every row 0 .. k-1, for the first k columns of a [T, E] tensor by GatherD, from the sort's
    ``indices`` [T, E] int32: their row sums times 0 (finite: int32, at most E^2 / 2) give its T rows. Neither a
    slice nor a Transpose nor Zeros: for T = 0 MindSpore's CPU StridedSlice (and Split) along dim 1 divide by zero
    (SIGFPE), its BroadcastTo takes no [1, k] -> [0, k], and its Transpose, once run on an empty tensor, writes no
    output on the later runs of a dynamic-shape graph; Zeros is no op of the ascend backend's graphs."""
    return indices.sum(-1, keepdims=True) * 0 + ops.arange(k, dtype=mstype.int32)


def _weight(num_experts, hidden_size, dtype):
    return initial.parameter((num_experts, hidden_size), dtype, "weight")


class SoftmaxTopK(nn.Cell):
    """Mixtral, Qwen2-MoE, Qwen3-MoE: logits ``x W^T`` in the model dtype (the backend's GEMM), softmax over all
    experts in float32, top-k of the probabilities, renormalised to sum 1 with ``renormalize`` (Mixtral always;
    Qwen: ``norm_topk_prob``).

    Shapes:
        x: [T, H]    weight: [E, H]    out: weights [T, k] float32, experts [T, k] int32
    """

    def __init__(self, hidden_size, num_experts, top_k, *, renormalize=True, dtype=ms.float32, backend="auto"):
        super().__init__()
        dtype = to_dtype(dtype)
        self.top_k, self.renormalize = top_k, renormalize
        self.weight = _weight(num_experts, hidden_size, dtype)
        self.logits = resolve(backend).linear(dtype, False, formats.NONE)

    def construct(self, x):
        probs = ops.softmax(self.logits(x, self.weight).astype(mstype.float32), -1)  # [T, E]
        weights, experts = top_k(probs, self.top_k)
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdims=True)
        return weights, experts


class SigmoidGroupTopK(nn.Cell):
    """DeepSeek-V3 (``noaux_tc``): logits in float32 (x cast; W kept in float32, as transformers keeps it), sigmoid
    scores; the correction bias takes
    part in the choice only: each of G groups of E/G experts scores the sum of its two best biased scores, the
    ``topk_group`` best groups stay, and the top-k biased scores among their experts are chosen; the weights
    are the chosen experts' unbiased scores, divided by their sum (+1e-20) with ``renormalize``
    (``norm_topk_prob``), then times ``routed_scaling_factor``.

    Shapes:
        x: [T, H]    weight: [E, H]    e_score_correction_bias: [E] float32
        out: weights [T, k] float32, experts [T, k] int32
    """

    def __init__(self, hidden_size, num_experts, top_k, *, n_group=1, topk_group=1, renormalize=True,
                 routed_scaling_factor=1.0, backend="auto"):
        super().__init__()
        if num_experts % n_group or not 1 <= topk_group <= n_group:
            raise InputError(f"n_group, topk_group: expected n_group dividing num_experts ({num_experts}) and "
                             f"1 <= topk_group <= n_group, got {n_group}, {topk_group}")
        if n_group > 1 and num_experts // n_group < 2:
            raise InputError(f"n_group: expected groups of at least 2 experts (a group scores its top 2), got "
                             f"{num_experts} experts in {n_group} groups")
        if top_k > topk_group * (num_experts // n_group):
            raise InputError(f"top_k: expected at most topk_group * num_experts / n_group "
                             f"({topk_group * (num_experts // n_group)}), got {top_k}")
        self.top_k, self.n_group, self.topk_group = top_k, n_group, topk_group
        self.renormalize, self.scale = renormalize, float(routed_scaling_factor)
        self.last_kept = ms.Tensor(topk_group - 1, mstype.int32)  # the place of the last group kept
        self.weight = _weight(num_experts, hidden_size, mstype.float32)
        self.e_score_correction_bias = Parameter(ops.zeros(num_experts, mstype.float32), name="e_score_correction_bias")
        self.logits = resolve(backend).linear(mstype.float32, False, formats.NONE)

    def construct(self, x):
        scores = ops.sigmoid(self.logits(x.astype(mstype.float32), self.weight))  # [T, E]
        choice = scores + self.e_score_correction_bias  # [T, E]: the bias only chooses
        if self.n_group > 1:
            tokens, experts = ops.shape(choice)
            size = experts // self.n_group  # a static E: reshape(tokens, G, -1) infers 0 for T = 0
            groups = ops.topk(choice.reshape(tokens, self.n_group, size), 2)[0].sum(-1)  # [T, G]: top-2 sum each
            _, order = ops.sort(groups, -1, descending=True)  # [T, G]: the groups best first, ties to the lower
            # each group's place in that order (the inverse permutation): places from topk_group on are out
            # (a mask without OneHot, which takes no empty tensor)
            place = ops.sort(order, -1)[1]  # [T, G] int32
            out = ops.gt(place, self.last_kept)  # [T, G]
            out = ops.broadcast_to(out.expand_dims(-1), (tokens, self.n_group, size))
            choice = ops.masked_fill(choice, out.reshape(tokens, experts), _NEG_INF)  # other groups' experts out
        _, chosen = top_k(choice, self.top_k)
        weights = ops.gather_elements(scores, 1, chosen)  # [T, k]: the unbiased scores
        if self.renormalize:
            weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
        return weights * self.scale, chosen

