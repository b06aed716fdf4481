"""Mixture-of-experts blocks with stacked, packed experts (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3).

Shape legend: T = tokens (any leading dims), H = hidden_size, I = intermediate_size (per expert), E = num_experts,
k = top_k, p = tp_size, K = ep_size, I_s = shared_intermediate_size.

    xs, counts = dispatch.gather(x, tokens)                # [T, H]; sharded expert parallelism: [K T, H]
    weights, ids = router(xs)                              # -> [T, k] float32, [T, k] int32
    ids = dispatch.local(ids, counts)                      # expert parallelism: this rank's experts, -1 others'
    out = dispatch.combine(experts(xs, ids, weights))      # sum_j weights[t, j] * expert_ids[t, j](x[t])
    out += [sigmoid(shared_expert_gate(x)) *] shared_expert(x)      # Qwen2-MoE (gated), DeepSeek-V3 (an experts
                                                           # op that ``adds_residual`` adds it in its own last pass)
    out = reduce(out)                                      # tensor parallelism: AllReduce
"""
import mindspore as ms
from mindspore import nn, ops
from mindspore.common import dtype as mstype

from ms_swiglu import quant as formats
from ms_swiglu.backends import resolve
from ms_swiglu.backends.matmul import cpu_upcast
from ms_swiglu.cells import TokenCell
from ms_swiglu.config import to_dtype
from ms_swiglu.errors import InputError
from ms_swiglu.layout import ParallelLayout
from ms_swiglu.linear import Dense
from ms_swiglu.mlp import PackedSwiGLUMLP
from ms_swiglu.parallel import dispatch_cell, reduce_cell
from ms_swiglu.routing import router_config


class StackedExperts(nn.Cell):
    """E packed SwiGLU experts as two stacked Parameters, run by the backend's experts op (``Backend.experts``):
    every tensor's shape depends on T only, and neither the graph nor the build grows with E. The op says how it
    holds the stacked weights (:meth:`store`); loaders hand it ``[E, out, in]``.

    Shapes:
        x: [T, H]    ids: [T, k] int32    weights: [T, k] float32    out: [T, H]
        gate_up_proj: [E, 2I/p, H] (each expert [gate_e; up_e])    down_proj: [E, H, I/p]   (as the op stores them)
    """

    def __init__(self, hidden_size, intermediate_size, num_experts, *, dtype, backend, quant=None, partial=False):
        super().__init__()
        method = formats.get(quant)
        self.op = backend.experts(dtype, method, partial)  # partial: ids -1 (another rank's experts) add nothing
        # each weight and its format's other parts ({name}_scale, ...), which the op takes as a tuple after it
        self.gate_up_aux, self.down_aux = (ms.ParameterTuple(method.create_weights(
            self, name, shape, dtype, self.op.form)) for name, shape in (
                ("gate_up_proj", (num_experts, 2 * intermediate_size, hidden_size)),
                ("down_proj", (num_experts, hidden_size, intermediate_size))))

    def store(self, w):
        """A stacked weight [E, out, in] (or its shape) as the op holds it."""
        return self.op.store(w)

    def forms(self):
        """``{parameter name: WeightForm}`` of the stacked weights (``ms_swiglu.backends.spec.WeightForm``)."""
        return {"gate_up_proj": self.op.form, "down_proj": self.op.form}

    def unstore(self, w):
        """A stacked weight as held, as [E, out, in]."""
        return self.op.unstore(w)

    def construct(self, x, ids, weights, residual=None):
        if residual is None:
            return self.op(x, ids, weights, self.gate_up_proj, self.down_proj, self.gate_up_aux, self.down_aux)
        return self.op(x, ids, weights, self.gate_up_proj, self.down_proj, self.gate_up_aux, self.down_aux,
                       residual)  # an op that adds it itself (``adds_residual``)


class PackedMoE(TokenCell):
    """``sum_j w_j * expert_{e_j}(x)`` over the top-k experts of a router, plus an optional shared expert.

    ``router``: a router config of ``ms_swiglu.routing`` (:class:`~ms_swiglu.routing.Softmax` for Mixtral,
    Qwen2-MoE, Qwen3-MoE; :class:`~ms_swiglu.routing.SigmoidGroups` for DeepSeek-V3), which builds the router
    Cell; without it, ``scoring`` and the router's own options (``renormalize``, ``n_group``, ``topk_group``,
    ``routed_scaling_factor``) name one. ``shared_intermediate_size`` > 0 adds a shared
    expert (a :class:`PackedSwiGLUMLP` on every token), scaled by ``sigmoid(shared_expert_gate(x))`` with
    ``shared_expert_gate`` (Qwen2-MoE). With ``tp_size`` p > 1 every expert (shared too) holds its rank's
    ``[gate_r; up_r]`` and ``down[:, r]``, and one AllReduce sums the block. With ``ep_size`` K > 1 (expert
    parallelism) rank ``ep_rank`` holds the routed experts ``[r E/K, (r + 1) E/K)`` whole, the router and the
    shared expert replicated; ``dispatch`` says how tokens meet them (``ms_swiglu.parallel``): "replicated" (the
    same tokens on every rank; one AllReduce) or "sharded" (each rank its own ``x``, padded to the job's row
    count, with ``tokens`` [1] int32 real rows; an AllGather and an AllReduce). ``quant="int8"``: the experts
    (and the shared expert) weight-only int8, ``experts.*_scale`` [E, 2I/p] and [E, H]; the router stays float.

    Inputs:
        x (Tensor): [..., H] in the block's dtype.
        tokens (Tensor, optional): [1] int32, the real rows of ``x`` (sharded dispatch only; default all).
    Outputs:
        Tensor [..., H]: the block's output (sharded dispatch: padded rows are zeros).
    Supported Platforms:
        ``CPU`` ``Ascend``

    Shapes:
        x:                       [T, H]  (any leading dims)
        router.weight:           [E, H]  (replicated)
        experts.gate_up_proj:    [E/K, 2I/p, H]
        experts.down_proj:       [E/K, H, I/p]
        shared_expert.*:         [2 I_s/p, H], [H, I_s/p];  shared_expert_gate.weight: [1, H]
        out:                     [T, H]
    """

    def __init__(self, hidden_size, intermediate_size, num_experts, top_k, *, dtype=ms.float32, backend="auto",
                 router=None, tp_size=1, shared_intermediate_size=0, shared_expert_gate=False, quant=None,
                 ep_size=1, ep_rank=0, dispatch="replicated", scoring="softmax", layout=None, **router_options):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise InputError(f"top_k: expected 1..num_experts ({num_experts}), got {top_k}")
        if router is not None and (router_options or scoring != "softmax"):
            raise InputError(f"router: expected a router config or scoring and its options, got both ({router} and "
                             f"{scoring}, {sorted(router_options)})")
        router = router or router_config(scoring, **router_options)
        self.layout = layout = ParallelLayout.given(layout, tp_size, ep_size, ep_rank)
        self.dispatch = dispatch_cell(num_experts, layout, dispatch)
        self.compute_dtype = dtype = to_dtype(dtype)
        method = formats.get(quant)
        self.backend, self.quant = resolve(backend), formats.name(method)
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.num_experts, self.top_k = num_experts, top_k
        if self.backend.router is None:
            self.router = router.build(hidden_size, num_experts, top_k, dtype=dtype, backend=self.backend)
        else:  # the backend's own router Cell for this config (ops its graphs take)
            self.router = self.backend.router(router, hidden_size, num_experts, top_k, dtype)
        self.experts = StackedExperts(hidden_size, layout.local(intermediate_size),
                                      len(layout.experts(num_experts)), dtype=dtype, backend=self.backend,
                                      quant=method, partial=layout.ep_size > 1)
        self.shared_expert = self.shared_expert_gate = None
        if shared_intermediate_size:  # the rank's block, summed by this block's reduce
            self.shared_expert = PackedSwiGLUMLP(hidden_size, layout.local(shared_intermediate_size), dtype=dtype,
                                                 backend=self.backend, quant=method)
            if shared_expert_gate:
                self.shared_expert_gate = Dense(hidden_size, 1, dtype, self.backend)
        self.upcast = cpu_upcast(dtype, self.backend)
        self.reduce = reduce_cell(layout.tp_size)
        # the experts op adds the shared expert's output in its own last pass (one rank holds every expert)
        self.fused_shared = self.experts.op.adds_residual and layout.ep_size == 1

    def __call__(self, *args, **kwargs):
        x = args[0] if args else kwargs.get("x")
        given = len(args) > 1 or kwargs.get("tokens") is not None
        if given != self.dispatch.own_tokens:
            raise InputError(f"tokens: expected it with sharded dispatch only (this block's: {self.dispatch.name}), "
                             f"got {'it' if given else 'none'}")
        if self.dispatch.own_tokens and isinstance(x, ms.Tensor) and 0 in x.shape[:-1]:
            raise InputError(f"x: expected this rank's tokens padded to the job's row count (at least 1: every rank "
                             f"joins the collectives), got shape {list(x.shape)}")
        return super().__call__(*args, **kwargs)

    def construct(self, x, tokens=None):
        shape, dtype = ops.shape(x), x.dtype
        if len(shape) != 2:
            x = _reshape(x, (-1, shape[-1]), self.upcast)  # [..., H] -> [T, H]
        xs, counts = self.dispatch.gather(x, tokens)  # [T, H] (sharded: [K T, H] and each rank's real rows [K])
        weights, ids = self.router(xs)  # [T, k] float32, [T, k] int32
        ids = self.dispatch.local(ids, counts)  # expert parallelism: this rank's, -1 for others'
        if self.fused_shared:
            out = self.experts(xs, ids, weights, self._shared(x, dtype))  # [T, H]
        else:
            out = self.dispatch.combine(self.experts(xs, ids, weights))  # [T, H]
            if self.shared_expert is not None:
                out = out + self._shared(x, dtype)
        out = self.reduce(out)
        return out if len(shape) == 2 else _reshape(out, shape, self.upcast)

    def _shared(self, x, dtype):
        """The shared expert's output [T, H] ([sigmoid(shared_expert_gate(x)) *] shared_expert(x)), or None."""
        if self.shared_expert is None:
            return None
        shared = self.shared_expert(x)  # [T, H]
        if self.shared_expert_gate is not None:
            gate = ops.sigmoid(self.shared_expert_gate(x).astype(mstype.float32))  # [T, 1]
            shared = (gate * shared.astype(mstype.float32)).astype(dtype)
        return shared


def _reshape(x, shape, upcast):
    """``x.reshape(shape)``; with ``upcast`` through float32 (the CPU has no bfloat16 or float16 Reshape)."""
    if upcast:
        return x.astype(mstype.float32).reshape(shape).astype(x.dtype)
    return x.reshape(shape)
