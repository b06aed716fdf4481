"""Packing of the gate and up projections into one ``gate_up`` weight, rows ``[gate; up]``.

Shapes:
    gate, up: [I, H]
    gate_up:  [2I, H]
"""
import numpy as np

GATE, UP, DOWN, GATE_UP = "gate_proj.weight", "up_proj.weight", "down_proj.weight", "gate_up_proj.weight"


def _check_2d(name, w):
    if np.ndim(w) != 2:
        raise ValueError(f"{name}: expected a 2-D weight [out, in], got shape {np.shape(w)}")


def pack_gate_up(gate, up):
    """``[I, H], [I, H] -> [2I, H]``, gate rows first."""
    _check_2d("gate", gate)
    _check_2d("up", up)
    if np.shape(gate) != np.shape(up):
        raise ValueError(f"pack_gate_up: expected up of the gate's shape {np.shape(gate)}, got {np.shape(up)}")
    return np.concatenate([gate, up], axis=0)


def unpack_gate_up(gate_up):
    """``[2I, H] -> ([I, H], [I, H])``, the inverse of :func:`pack_gate_up`."""
    _check_2d("gate_up", gate_up)
    rows = np.shape(gate_up)[0]
    if rows % 2:
        raise ValueError(f"unpack_gate_up: expected an even number of rows (2I), got {rows}")
    return gate_up[: rows // 2], gate_up[rows // 2:]


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
                raise ValueError(f"pack_state_dict: expected {prefix + UP} beside {name}, found none")
            out[prefix + GATE_UP] = pack_gate_up(np.asarray(w), np.asarray(state[prefix + UP]))
        else:
            out[name] = w
    orphans = [n for n in state if n.endswith(UP) and n[: -len(UP)] + GATE not in state]
    if orphans:
        raise ValueError(f"pack_state_dict: expected a gate_proj beside {orphans[0]}, found none")
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
