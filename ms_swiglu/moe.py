"""Mixtral-style sparse MoE block with packed experts: every expert is a packed SwiGLU MLP and computes only
the tokens routed to it.

Shape legend: T = tokens, H = hidden_size, I = intermediate_size, E = num_experts, k = top_k, T_e = tokens
routed to expert e (sum over e of T_e = T * k).
"""
import mindspore as ms
from mindspore import nn, ops
from mindspore.common import dtype as mstype

from ms_swiglu.backends import resolve
from ms_swiglu.backends.matmul import cpu_upcast
from ms_swiglu.config import to_dtype
from ms_swiglu.linear import Dense
from ms_swiglu.mlp import PackedSwiGLUMLP
from ms_swiglu.packing import check_tp
from ms_swiglu.parallel import reduce_cell


_TWO, _ZERO = ms.Tensor(2.0, mstype.float32), ms.Tensor(0.0, mstype.float32)


def route(logits, top_k, renormalize=True):
    """Router: softmax over all experts in float32, top-k, optionally renormalised to sum 1 (Mixtral's rule).

    Ties go to the lower expert index. Shapes: logits [T, E] -> weights [T, k] float32, experts [T, k] int32.
    """
    probs = ops.softmax(logits.astype(mstype.float32), -1)  # [T, E]
    # k argmax passes instead of TopK: argmax returns the first maximum, TopK on the CPU breaks ties arbitrarily
    remaining, weights, experts = probs, [], []
    for _ in range(top_k):
        e = ops.argmax(remaining, -1, keepdim=True)  # [T, 1]
        experts.append(e)
        weights.append(ops.gather_elements(probs, 1, e))
        remaining = remaining - ops.one_hot(e[:, 0], probs.shape[-1], _TWO, _ZERO)  # probs <= 1: drops below 0
    weights, experts = ops.cat(weights, -1), ops.cat(experts, -1)  # [T, k]
    if renormalize:
        weights = weights / weights.sum(-1, keepdims=True)
    return weights, experts.astype(mstype.int32)


class PackedMoE(nn.Cell):
    """``sum_k w_k * expert_{e_k}(x)`` over the top-k experts of a softmax router; sparse dispatch.

    Every expert is a :class:`PackedSwiGLUMLP` (one packed gate/up GEMM + the fused SwiGLU) and runs only on
    the tokens routed to it; the weighted results are scatter-added back in float32. With ``tp_size`` p > 1
    every expert holds its rank's ``[gate_e,r; up_e,r]`` and ``down_e[:, r]``, and one AllReduce sums the block.

    Shapes:
        x:                              [T, H]  (any leading dims)
        router.weight:                  [E, H]  (replicated)
        experts.{e}.gate_up_proj.weight [2I/p, H]  rows [gate_e; up_e]
        experts.{e}.down_proj.weight    [H, I/p]
        out:                            [T, H]
    """

    def __init__(self, hidden_size, intermediate_size, num_experts, top_k, *, dtype=ms.float32, backend="auto",
                 renormalize=True, tp_size=1):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k: expected 1..num_experts ({num_experts}), got {top_k}")
        check_tp(intermediate_size, tp_size)
        dtype = to_dtype(dtype)
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.backend = resolve(backend)
        self.upcast = cpu_upcast(dtype, self.backend)
        self.router = Dense(hidden_size, num_experts, dtype, self.backend)
        self.experts = nn.CellList([PackedSwiGLUMLP(hidden_size, intermediate_size // tp_size, dtype=dtype,
                                                    backend=self.backend) for _ in range(num_experts)])
        self.reduce = reduce_cell(tp_size)

    def construct(self, x):
        shape, dtype = ops.shape(x), x.dtype
        if self.upcast:
            x = x.astype(mstype.float32)  # the CPU has no bfloat16 Gather or Reshape
        x = x.reshape(-1, shape[-1])  # [..., H] -> [T, H]
        weights, experts = route(self.router(x.astype(dtype)), self.top_k, self.renormalize)  # [T, k] each
        out = ops.zeros(ops.shape(x), mstype.float32)  # accumulated in float32
        for e in range(self.num_experts):
            hit = ops.nonzero(experts == e)  # [T_e, 2]: the (token, slot) pairs routed to expert e
            tokens = hit[:, 0]
            y = self.experts[e](ops.gather(x, tokens, 0).astype(dtype))  # [T_e, H] -> [T_e, H]
            w = ops.gather_nd(weights, hit).reshape(-1, 1)  # [T_e, 1]
            out = ops.tensor_scatter_add(out, tokens.reshape(-1, 1), y.astype(mstype.float32) * w)
        return self.reduce(out).reshape(shape).astype(dtype)
