"""Which part of each tensor a rank holds: :class:`ParallelLayout`, shared by tensor parallelism (a block of every
intermediate size) and expert parallelism (whole experts by range). It reads the split of each tensor from the
schema (``ms_swiglu.schema``) and the split of scales from the quant method. No MindSpore here.
"""
import dataclasses

import numpy as np

from ms_swiglu.errors import InputError
from ms_swiglu.packing import check_tp, shard_down, shard_packed
from ms_swiglu.schema import SCALE, Split

# How tokens meet an expert-parallel MoE block (the Cells: ms_swiglu.parallel.DISPATCH): the same tokens on every
# rank, or each rank its own.
DISPATCHES = ("replicated", "sharded")


@dataclasses.dataclass(frozen=True)
class ParallelLayout:
    """Rank ``tp_rank`` of ``tp_size`` tensor-parallel ranks: ``[gate_r; up_r]`` rows and ``down[:, r]`` columns of
    every MLP and expert, the rest replicated."""

    tp_size: int = 1
    tp_rank: int = 0
    ep_size: int = 1  # expert parallelism: rank ep_rank holds the routed experts [ep_rank E/K, (ep_rank + 1) E/K)
    ep_rank: int = 0

    @classmethod
    def of(cls, rank=0, tp_size=1, ep_size=1):
        """The layout of world rank ``rank`` with ``tp_size`` tensor-parallel or ``ep_size`` expert-parallel ranks
        (one of them 1: :func:`check_split`)."""
        check_split(tp_size, ep_size)
        return cls(tp_size, rank if tp_size > 1 else 0, ep_size, rank if ep_size > 1 else 0)

    @property
    def rank(self):
        """The world rank."""
        return self.tp_rank + self.tp_size * self.ep_rank

    def experts(self, num_experts):
        """The routed experts this rank holds, a range (all of them without expert parallelism)."""
        if not isinstance(self.ep_size, int) or self.ep_size < 1 or num_experts % self.ep_size:
            raise InputError(f"ep_size: expected a positive divisor of the number of experts {num_experts}, got "
                             f"{self.ep_size}")
        if not isinstance(self.ep_rank, int) or not 0 <= self.ep_rank < self.ep_size:
            raise InputError(f"ep_rank: expected 0..{self.ep_size - 1}, got {self.ep_rank}")
        n = num_experts // self.ep_size
        return range(self.ep_rank * n, (self.ep_rank + 1) * n)

    def block(self, size):
        """The rank's block of an intermediate size ``size`` (checked: tp_size divides it)."""
        check_tp(size, self.tp_size, self.tp_rank)
        n = size // self.tp_size
        return slice(self.tp_rank * n, (self.tp_rank + 1) * n)

    def hf_part(self, spec):
        """The index of the rank's part of one HF tensor of ``spec`` (gate/up [I, H], down [H, I]), read as such
        from the checkpoint; None for all of it."""
        if spec.split is Split.ROWS:
            return self.block(spec.size), slice(None)
        if spec.split is Split.COLUMNS:
            return slice(None), self.block(spec.size)
        return None

    def shard(self, spec, tensors, method):
        """``{kind: array}`` of the rank's part of the tensor ``spec`` and its scales (from ``tensors``, the whole
        layer's arrays); ``method``: the quant method the scales are of."""
        out = {}
        w, scale = tensors.get(spec.kind), tensors.get(spec.kind + SCALE)
        if w is None:
            return out
        if spec.experts and self.ep_size > 1:  # [E, ...] -> [E/K, ...]: whole experts, their scales with them
            mine = self.experts(spec.experts)
            w, scale = w[mine.start:mine.stop], None if scale is None else scale[mine.start:mine.stop]
        if spec.split is Split.ROWS:
            out[spec.kind] = shard_packed(w, self.tp_size, self.tp_rank)  # [..., 2I/p, H]
            if scale is not None:  # each row its scales: [..., 2I] or [..., 2I, groups]
                rows_last = scale.ndim < w.ndim
                s = scale[..., None] if rows_last else scale
                s = shard_packed(s, self.tp_size, self.tp_rank)
                out[spec.kind + SCALE] = s[..., 0] if rows_last else s
        elif spec.split is Split.COLUMNS:
            columns = self.block(w.shape[-1])
            out[spec.kind] = shard_down(w, self.tp_size, self.tp_rank)  # [..., H, I/p]
            if scale is not None:
                out[spec.kind + SCALE] = method.shard_scale(scale, w.shape[-1], columns)
        else:
            out[spec.kind] = w
            if scale is not None:
                out[spec.kind + SCALE] = scale
        return out


def row_blocks(tokens, ep_size):
    """Sharded tokens: (each rank's rows of ``tokens`` rows, the r-th of K contiguous blocks; the row count every
    rank pads its own to, the largest block and at least 1, so that every rank joins the collectives)."""
    blocks = np.array_split(np.arange(tokens), ep_size)
    return blocks, max(1, max(len(b) for b in blocks))


def own_rows(x, ep_size, rank):
    """(rank ``rank``'s rows of ``x`` [N, H], zero-padded to :func:`row_blocks`' count, as float32; its real
    rows)."""
    blocks, rows = row_blocks(len(x), ep_size)
    own = np.zeros((rows, x.shape[-1]), np.float32)
    own[:len(blocks[rank])] = x[blocks[rank]]
    return own, len(blocks[rank])


def check_split(tp_size, ep_size, names=("tp_size", "ep_size")):
    """InputError unless one of ``tp_size`` and ``ep_size`` is 1 (``names``: how the caller spells them)."""
    if tp_size > 1 and ep_size > 1:
        raise InputError(f"{', '.join(names)}: expected one of them 1 (expert parallelism beside tensor "
                         f"parallelism is not supported), got {tp_size} and {ep_size}")


WHOLE = ParallelLayout()
