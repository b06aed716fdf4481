"""Which part of each tensor a rank holds: :class:`ParallelLayout`, shared by tensor parallelism (a block of every
intermediate size) and expert parallelism (whole experts by range). It reads the split of each tensor from the
schema (``ms_swiglu.schema``) and the split of every other part of a weight from its axes (``ms_swiglu.quant``).
No MindSpore here.
"""
import dataclasses

import numpy as np

from ms_swiglu.errors import InputError
from ms_swiglu.packing import shard_packed, tp_block
from ms_swiglu.quant.base import Part
from ms_swiglu.schema import Split

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

    @classmethod
    def given(cls, layout=None, tp_size=1, ep_size=1, ep_rank=0):
        """A Cell's layout: ``layout`` itself, or the one its shorthand keywords name (tensor parallelism's
        ``tp_size``, expert parallelism's ``ep_size`` and ``ep_rank``); not both."""
        if layout is None:
            check_split(tp_size, ep_size)
            return cls(tp_size=tp_size, ep_size=ep_size, ep_rank=ep_rank)
        if (tp_size, ep_size, ep_rank) != (1, 1, 0):
            raise InputError(f"layout: expected a ParallelLayout or tp_size / ep_size / ep_rank, got both ({layout} "
                             f"and {tp_size}, {ep_size}, {ep_rank})")
        if not isinstance(layout, cls):
            raise InputError(f"layout: expected a ParallelLayout, got {layout!r}")
        return layout

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
        return tp_block(size, self.tp_size, self.tp_rank)

    def local(self, size):
        """How much of an intermediate size ``size`` the rank holds."""
        block = self.block(size)
        return block.stop - block.start

    def hf_part(self, spec):
        """The index of the rank's part of one HF tensor of ``spec`` (gate/up [I, H], down [H, I]), read as such
        from the checkpoint; None for all of it."""
        if spec.split is Split.ROWS:
            return self.block(spec.size), slice(None)
        if spec.split is Split.COLUMNS:
            return slice(None), self.block(spec.size)
        return None

    def shard(self, spec, tensors, method):
        """``{kind + suffix: array}`` of the rank's part of the tensor ``spec`` and of the format's parts beside it
        (``method``: a :class:`~ms_swiglu.quant.base.QuantMethod`), from ``tensors``, the whole layer's arrays. Each
        part splits by its axes: whole experts; rows with the rows (``[gate_r; up_r]``); an input axis by the
        rank's column block in whole elements (a group's scale, a byte of two int4 values), or the split is
        refused with the numbers; a part with neither is replicated."""
        if spec.kind not in tensors:
            return {}
        parts = method.parts if spec.quantized and method.quantized else (Part("", "", per=1),)
        out = {}
        for part in parts:
            a = tensors[spec.kind + part.suffix]
            if spec.experts and self.ep_size > 1:  # [E, ...] -> [E/K, ...]: whole experts, every part with them
                mine = self.experts(spec.experts)
                a = a[mine.start:mine.stop]
            if spec.split is Split.ROWS and part.rows:  # [..., 2I, ...] -> [..., 2I/p, ...]
                a = shard_packed(a if part.per else a[..., None], self.tp_size, self.tp_rank)
                a = a if part.per else a[..., 0]
            elif spec.split is Split.COLUMNS and part.per:  # [..., I / per] -> [..., I / (p per)]
                a = a[..., self._elements(self.block(spec.size), part, method)]
            out[spec.kind + part.suffix] = a
        return out

    def _elements(self, columns, part, method):
        """The slice of a part's input axis (an element per ``part.per`` inputs) that holds ``columns``."""
        per = part.per
        if columns.start % per or (columns.stop - columns.start) % per:
            what = (f"groups of {per}" if per == method.group else
                    f"{per}-input elements of its {part.suffix or 'weight'}")
            raise InputError(f"quant {method.name}: expected a rank's columns to hold whole {what}, got columns "
                             f"{columns.start}..{columns.stop - 1}")
        return slice(columns.start // per, columns.stop // per)


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
