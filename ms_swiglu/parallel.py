"""Tensor and expert parallelism for the packed MLP and the MoE blocks (HCCL on Ascend, mccl between CPU
processes; both through ``mindspore.communication``).

Rank r of p holds the column-parallel block ``[gate_r; up_r]`` of ``gate_up`` ([2I/p, H]) and the row-parallel
block ``down[:, r]`` ([H, I/p]); it computes ``SiLU(x W_gate,r) * (x W_up,r) W_down,r`` locally, and one
AllReduce sums the partial outputs. The split itself lives in ``ms_swiglu.packing`` (``shard_packed``,
``shard_down``) and in the checkpoint loader, which reads only the rank's block.
"""
import mindspore as ms
from mindspore import nn, ops
from mindspore.common import dtype as mstype

from ms_swiglu.errors import InputError
from ms_swiglu.layout import DISPATCHES


class _Collective(nn.Cell):
    """A collective over the world group. bfloat16 travels as float32 on a CPU device (its collectives have
    float32 and float16 kernels only), rounded once on the way back."""

    def __init__(self, op):
        super().__init__()
        self.op = op
        self.on_cpu = ms.get_context("device_target") == "CPU"

    def construct(self, x):
        if self.on_cpu and x.dtype == mstype.bfloat16:
            return self.op(x.astype(mstype.float32)).astype(x.dtype)
        return self.op(x)


class AllReduceSum(_Collective):
    """Sums a tensor over the ranks. Shapes: [T, H] -> [T, H]."""

    def __init__(self):
        super().__init__(ops.AllReduce())


class AllGatherRows(_Collective):
    """The rows of a tensor from every rank, rank 0's first: [T, ...] -> [K T, ...] (equal T on every rank)."""

    def __init__(self):
        super().__init__(ops.AllGather())


def reduce_cell(tp_size):
    """The Cell that closes a row-parallel layer: an AllReduce for tp_size > 1, the identity otherwise."""
    return AllReduceSum() if tp_size > 1 else nn.Identity()


class Dispatch(nn.Cell):
    """How a MoE block's tokens meet its routed experts (``PackedMoE``): every expert on this rank, no
    communication. The expert-parallel dispatchers below change the three steps around the same experts Cell:

        xs, counts = dispatch.gather(x, tokens)  # the tokens this rank's experts see: [T, H] (or [K T, H])
        ids = dispatch.local(ids, counts)        # global expert ids -> this rank's, -1 for another rank's
        out = dispatch.combine(experts(xs, ids, weights))    # each token's sum over every rank: [T, H]
    """

    name = "local"
    own_tokens = False  # each rank brings its own tokens (and joins the collectives even with none)
    graph_ops = frozenset()  # the op types its steps add to a block's graph (the exporter allows them)

    def gather(self, x, tokens):  # noqa: ARG002 -- ``tokens``: the sharded dispatcher's
        return x, None

    def local(self, ids, counts):  # noqa: ARG002
        return ids

    def combine(self, out):
        return out


class ReplicatedTokens(Dispatch):
    """Expert parallelism, the same tokens on every rank (as in tensor parallelism): rank r routes every token,
    computes the rows of its experts ``[r E/K, (r + 1) E/K)`` only, and one AllReduce sums the K partial outputs.
    Traffic per rank: the AllReduce of [T, H]."""

    name = "replicated"
    graph_ops = frozenset({"AllReduce", "Sub", "GreaterEqual", "LessScalar", "LogicalAnd"})

    def __init__(self, num_experts, ep_size, ep_rank, mine):  # noqa: ARG002 -- mine: the rank's experts, a range
        super().__init__()
        self.count, self.first = len(mine), ms.Tensor(mine.start, mstype.int32)
        self.reduce = AllReduceSum()

    def local(self, ids, counts):  # noqa: ARG002 -- every row is a real token
        return self._local(ids, self._mine(ids))

    def _mine(self, ids):
        """[R, k] bool: the slots of this rank's experts."""
        local = ids - self.first
        return ops.logical_and(local >= 0, local < self.count)

    def _local(self, ids, mine):
        return (ids - self.first + 1) * mine.astype(mstype.int32) - 1  # [R, k]: this rank's index, or -1

    def combine(self, out):
        return self.reduce(out)


class ShardedTokens(ReplicatedTokens):
    """Expert parallelism, each rank with its own tokens (data-parallel attention): every rank's tokens are
    gathered (one AllGather of [T, H], with T the job's row count: each rank pads its own tokens to it, and says
    how many are real in ``tokens`` [1] int32, gathered too), routed on every rank by the replicated router,
    rank r computes its experts' rows of all of them, one AllReduce of [K T, H] sums the partial outputs, and
    rank r keeps its own T rows. Only AllGather and AllReduce: the collectives MindSpore's CPU backend runs.
    Padded rows go to no expert and come back as zeros; a rank with no tokens still joins every collective."""

    name = "sharded"
    own_tokens = True
    graph_ops = ReplicatedTokens.graph_ops | {"AllGather", "OnesLike", "CumSum", "LessEqual", "Gather", "Squeeze"}

    def __init__(self, num_experts, ep_size, ep_rank, mine):
        super().__init__(num_experts, ep_size, ep_rank, mine)
        self.ep_size, self.rank = ep_size, ms.Tensor([ep_rank], mstype.int32)
        self.gather_rows, self.gather_counts = AllGatherRows(), ops.AllGather()

    def gather(self, x, tokens):
        counts = self.gather_counts(tokens.astype(mstype.int32).reshape(1))  # [K]: each rank's real rows
        return self.gather_rows(x), counts  # [K T, H], [K]

    def local(self, ids, counts):
        return self._local(ids, ops.logical_and(self._mine(ids), _real_rows(ids, counts)))  # padded rows: none

    def combine(self, out):
        dtype = out.dtype
        if self.reduce.on_cpu and dtype != mstype.float32:  # the CPU has no bfloat16 or float16 Reshape
            out = out.astype(mstype.float32)
        out = self.reduce(out)  # [K T, H]: every token's sum over the ranks' experts
        rows = out.reshape(self.ep_size, -1, ops.shape(out)[-1])  # [K, T, H]
        return ops.gather(rows, self.rank, 0).squeeze(0).astype(dtype)  # this rank's own rows: [T, H]


def _real_rows(ids, counts):
    """[K T, 1] bool: whether each gathered row is one of its rank's ``counts`` [K] real rows, from the rows' ids
    [K T, k] int32 (positions by a running sum of ones: no Range, whose length would come from a shape at run
    time)."""
    ones = ops.ones_like(ids[:, :1])  # [K T, 1] int32
    position = ops.cumsum(ones.reshape(ops.shape(counts)[0], -1), 1)  # [K, T]: 1 .. T on every rank's rows
    return (position <= counts.expand_dims(-1)).reshape(-1, 1)


DISPATCH = {cls.name: cls for cls in (ReplicatedTokens, ShardedTokens)}
assert tuple(DISPATCH) == DISPATCHES, "ms_swiglu.layout.DISPATCHES names the dispatchers the CLI offers"


def dispatch_cell(num_experts, layout, tokens="replicated"):
    """The :class:`Dispatch` of a MoE block on the rank of ``layout`` (a ParallelLayout); ``tokens``: "replicated"
    (every rank has the same tokens) or "sharded" (each its own)."""
    if tokens not in DISPATCH:
        raise InputError(f"dispatch: expected one of {', '.join(DISPATCH)}, got {tokens!r}")
    mine = layout.experts(num_experts)  # (checks ep_size and ep_rank)
    return Dispatch() if layout.ep_size == 1 else DISPATCH[tokens](num_experts, layout.ep_size, layout.ep_rank, mine)


def init(world_size):
    """Join the launched group (msrun sets the environment) and return this process's rank."""
    from mindspore.communication import get_group_size, get_rank  # noqa: PLC0415
    from mindspore.communication import init as init_comm  # noqa: PLC0415

    init_comm()
    if get_group_size() != world_size:
        raise InputError(f"world size: expected the launched world size {get_group_size()}, got {world_size} "
                         f"(tp_size x ep_size)")
    return get_rank()
