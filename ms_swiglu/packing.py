"""Packing of the gate and up projections into one ``gate_up`` weight, rows ``[gate; up]``, and its
tensor-parallel sharding: rank r of p holds ``[gate_r; up_r]`` and the columns ``down[:, r]``.

Shapes (p = tp_size):
    gate, up:       [I, H]
    gate_up:        [2I, H]       shard: [2I/p, H] = [gate_r; up_r]
    down:           [H, I]        shard: [H, I/p]
"""
import numpy as np

from ms_swiglu.errors import InputError

GATE, UP, DOWN, GATE_UP = "gate_proj.weight", "up_proj.weight", "down_proj.weight", "gate_up_proj.weight"


def _check_2d(name, w):
    if np.ndim(w) != 2:
        raise InputError(f"{name}: expected a 2-D weight [out, in], got shape {np.shape(w)}")


def pack_gate_up(gate, up):
    """``[I, H], [I, H] -> [2I, H]``, gate rows first."""
    _check_2d("gate", gate)
    _check_2d("up", up)
    if np.shape(gate) != np.shape(up):
        raise InputError(f"pack_gate_up: expected up of the gate's shape {np.shape(gate)}, got {np.shape(up)}")
    return np.concatenate([gate, up], axis=0)


def unpack_gate_up(gate_up):
    """``[2I, H] -> ([I, H], [I, H])``, the inverse of :func:`pack_gate_up`."""
    _check_2d("gate_up", gate_up)
    return unpack_gate_up_nd(gate_up)


def pack_state_dict(state):
    """Rename ``*gate_proj.weight`` + ``*up_proj.weight`` to one ``*gate_up_proj.weight``; other keys pass.

    ``state`` maps names to arrays (NumPy, or anything ``np.asarray`` takes).
    """
    out = {}
    for name, w in state.items():
        if name.endswith(UP):
            continue
        if name.endswith(GATE):
            prefix = name[: -len(GATE)]
            if prefix + UP not in state:
                raise InputError(f"pack_state_dict: expected {prefix + UP} beside {name}, found none")
            out[prefix + GATE_UP] = pack_gate_up(np.asarray(w), np.asarray(state[prefix + UP]))
        else:
            out[name] = w
    orphans = [n for n in state if n.endswith(UP) and n[: -len(UP)] + GATE not in state]
    if orphans:
        raise InputError(f"pack_state_dict: expected a gate_proj beside {orphans[0]}, found none")
    return out


def unpack_state_dict(state):
    """The inverse of :func:`pack_state_dict`."""
    out = {}
    for name, w in state.items():
        if name.endswith(GATE_UP):
            prefix = name[: -len(GATE_UP)]
            out[prefix + GATE], out[prefix + UP] = unpack_gate_up(np.asarray(w))
        else:
            out[name] = w
    return out


def check_tp(inter, tp_size, rank=0):
    """ValueError unless tp_size divides intermediate_size and 0 <= rank < tp_size."""
    if not isinstance(tp_size, int) or tp_size < 1 or inter % tp_size:
        raise InputError(f"tp_size: expected a positive divisor of intermediate_size {inter}, got {tp_size}")
    if not isinstance(rank, int) or not 0 <= rank < tp_size:
        raise InputError(f"rank: expected 0..{tp_size - 1}, got {rank}")


def tp_block(size, tp_size, rank):
    """Rank ``rank``'s block of an intermediate size ``size`` split over ``tp_size`` ranks (checked): the one
    formula of the package's tensor parallelism (``ParallelLayout.block`` and the sharding below)."""
    check_tp(size, tp_size, rank)
    n = size // tp_size
    return slice(rank * n, (rank + 1) * n)


def shard_packed(gate_up, tp_size, rank):
    """Rank ``rank``'s ``[gate_r; up_r]`` of a packed ``[2I, H]`` weight (``[..., 2I, H]`` for experts).

    Each half is split into ``tp_size`` row blocks (:func:`tp_block`) and the rank's blocks are
    re-concatenated. A plain split of the packed matrix would give rank 0 all of gate.
    """
    inter = np.shape(gate_up)[-2] // 2
    block = tp_block(inter, tp_size, rank)
    return np.concatenate([gate_up[..., part * inter + block.start:part * inter + block.stop, :] for part in (0, 1)],
                          axis=-2)


def unshard_packed(shards):
    """The full ``[2I, H]`` from the ranks' ``[gate_r; up_r]`` blocks, in rank order."""
    halves = [unpack_gate_up_nd(s) for s in shards]
    return np.concatenate([np.concatenate([h[0] for h in halves], axis=-2),
                           np.concatenate([h[1] for h in halves], axis=-2)], axis=-2)


def unpack_gate_up_nd(gate_up):
    """``[..., 2I, H] -> ([..., I, H], [..., I, H])``."""
    rows = np.shape(gate_up)[-2]
    if rows % 2:
        raise InputError(f"unpack_gate_up: expected an even number of rows (2I), got {rows}")
    return gate_up[..., : rows // 2, :], gate_up[..., rows // 2:, :]


def shard_down(down, tp_size, rank):
    """Rank ``rank``'s columns ``[H, I/p]`` of ``down [H, I]`` (``[..., H, I]`` for experts)."""
    return down[..., tp_block(np.shape(down)[-1], tp_size, rank)]


def unshard_down(shards):
    """The full ``[H, I]`` from the ranks' column blocks, in rank order."""
    return np.concatenate(list(shards), axis=-1)


def reshard(gate_up_shards, down_shards, tp_size):
    """Shards for ``tp_size`` from shards of any other tp size, through the unsharded layout (exact)."""
    gate_up, down = unshard_packed(gate_up_shards), unshard_down(down_shards)
    return ([shard_packed(gate_up, tp_size, r) for r in range(tp_size)],
            [shard_down(down, tp_size, r) for r in range(tp_size)])
