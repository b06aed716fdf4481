"""The SwiGLU MLP of LLaMA/Qwen, packed (one gate/up GEMM) and unpacked (the three-Dense baseline).

Shape legend: T = tokens (any leading dims), H = hidden_size, I = intermediate_size.
"""
import mindspore as ms
import numpy as np
from mindspore import ops
from mindspore.common import dtype as mstype

from ms_swiglu import quant as formats
from ms_swiglu.backends import resolve
from ms_swiglu.cells import TokenCell
from ms_swiglu.config import to_dtype
from ms_swiglu.errors import InputError
from ms_swiglu.initial import empty_weights
from ms_swiglu.linear import Dense, Linear
from ms_swiglu.layout import ParallelLayout
from ms_swiglu.packing import pack_state_dict, unpack_state_dict
from ms_swiglu.parallel import reduce_cell


class PackedSwiGLUMLP(TokenCell):
    """``down(SwiGLU(gate_up(x)))`` with ``gate_up_proj`` one GEMM of output ``2I``, rows ``[gate; up]``.

    ``gate_up_proj`` is a :class:`~ms_swiglu.linear.Linear` with ``swiglu=True``: on the ``cpu`` backend one C++
    call with SwiGLU as the GEMM's epilogue, elsewhere MindSpore's MatMul and the backend's SwiGLU op.

    With ``tp_size`` p > 1 this rank holds the column-parallel ``[gate_r; up_r]`` and the row-parallel
    ``down[:, r]``, and an AllReduce sums the ranks' partial outputs (``ms_swiglu.parallel``).

    ``layout`` (a :class:`~ms_swiglu.layout.ParallelLayout`; ``tp_size`` names one too) says which block of the
    intermediate size this rank holds.

    ``quant="int8"``: both projections weight-only int8, each row with its float32 scale (``*.weight_scale``:
    gate and up rows keep their own; down's scales cover whole rows, so every rank holds all H of them).
    ``quant="int8-g128"``: a scale per 128 inputs of each row; each rank holds the groups of its down columns
    (I/p a multiple of 128).

    Shapes:
        x:                   [T, H]
        gate_up_proj.weight: [2I/p, H]   (int8 with quant; gate_up_proj.weight_scale [2I/p], int8-g128 [2I/p, H/128])
        down_proj.weight:    [H, I/p]    (int8 with quant; down_proj.weight_scale [H], int8-g128 [H, I/(128 p)])
        out:                 [T, H]
    """

    def __init__(self, hidden_size, intermediate_size, *, dtype=ms.float32, backend="auto", tp_size=1, quant=None,
                 layout=None):
        super().__init__()
        self.compute_dtype = dtype = to_dtype(dtype)
        self.layout = ParallelLayout.given(layout, tp_size)
        self.hidden_size, self.intermediate_size, self.tp_size = hidden_size, intermediate_size, self.layout.tp_size
        local = self.layout.local(intermediate_size)
        method = formats.get(quant)
        self.backend, self.quant = resolve(backend), formats.name(method)
        self.gate_up_proj = Linear(hidden_size, 2 * local, dtype=dtype, backend=self.backend, swiglu=True, quant=method)
        self.down_proj = Linear(local, hidden_size, dtype=dtype, backend=self.backend, quant=method)
        self.reduce = reduce_cell(self.tp_size)

    def construct(self, x):
        return self.reduce(self.down_proj(self.gate_up_proj(x)))  # [T, H] -> [T, 2I/p] -SwiGLU-> [T, I/p] -> [T, H]


class SwiGLUMLP(TokenCell):
    """The unpacked baseline (the seed article's MLP): ``down(silu(gate(x)) * up(x))``, two GEMMs in.

    Shapes:
        x:                [T, H]
        gate_proj.weight: [I, H]
        up_proj.weight:   [I, H]
        down_proj.weight: [H, I]
        out:              [T, H]
    """

    def __init__(self, hidden_size, intermediate_size, *, dtype=ms.float32):
        super().__init__()
        dtype = to_dtype(dtype)
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.gate_proj = Dense(hidden_size, intermediate_size, dtype)
        self.up_proj = Dense(hidden_size, intermediate_size, dtype)
        self.down_proj = Dense(intermediate_size, hidden_size, dtype)

    def construct(self, x):
        gate, up = self.gate_proj(x), self.up_proj(x)  # [T, H] -> 2 x [T, I]
        f32 = mstype.float32  # SiLU and the product in float32, rounded once, as in every SwiGLU backend
        return self.down_proj((ops.silu(gate.astype(f32)) * up.astype(f32)).astype(gate.dtype))  # -> [T, H]


def to_packed(mlp, *, backend="auto"):
    """A :class:`PackedSwiGLUMLP` with the weights of a :class:`SwiGLUMLP` (``gate, up -> gate_up``)."""
    dtype = mlp.down_proj.weight.dtype
    with empty_weights():
        packed = PackedSwiGLUMLP(mlp.hidden_size, mlp.intermediate_size, dtype=dtype, backend=backend)
    return load_weights(packed, pack_state_dict(weights(mlp)))


def to_quantized(packed, quant="int8", backend=None):
    """A weight-only quantized copy of a float :class:`PackedSwiGLUMLP` (same dtype and tp_size; on ``backend``,
    by default the same)."""
    if packed.quant:
        raise InputError(f"to_quantized: expected a float PackedSwiGLUMLP, got one quantized to {packed.quant}")
    with empty_weights():
        mlp = PackedSwiGLUMLP(packed.hidden_size, packed.intermediate_size, dtype=packed.compute_dtype,
                              backend=backend or packed.backend, layout=packed.layout, quant=formats.get(quant))
    return load_weights(mlp, formats.quantize_state_dict(weights(packed), quant), stored=True)


def to_unpacked(packed):
    """The :class:`SwiGLUMLP` with the weights of a :class:`PackedSwiGLUMLP` (``gate_up -> gate, up``)."""
    if packed.quant:
        raise InputError(f"to_unpacked: expected a float PackedSwiGLUMLP, got one quantized to {packed.quant}")
    dtype = packed.down_proj.weight.dtype
    with empty_weights():
        mlp = SwiGLUMLP(packed.hidden_size, packed.intermediate_size, dtype=dtype)
    return load_weights(mlp, unpack_state_dict(weights(packed)))


def weights(cell):
    """``{relative name: NumPy array}`` of a Cell's parameters."""
    return {name: p.asnumpy() for name, p in cell.parameters_and_names()}


def param_dtype(cell):
    """The compute dtype of a Cell: that of its first packed MLP or MoE block (int8 weights compute in it), or
    else of its first parameter."""
    for _, c in cell.cells_and_names():
        if getattr(c, "compute_dtype", None) is not None:
            return c.compute_dtype
    return next(iter(cell.get_parameters())).dtype


def held_forms(cell):
    """``{parameter name: WeightForm}`` of a Cell's weights whose ops hold them in a form of their own
    (``ms_swiglu.backends.spec.WeightForm``: e.g. [E, in, out], or Ascend's signed int4)."""
    return {f"{prefix}.{name}" if prefix else name: form for prefix, c in cell.cells_and_names()
            if hasattr(c, "forms") for name, form in c.forms().items()}


def load_weights(cell, state, stored=False):
    """Set a Cell's parameters from ``{relative name: array}``; names and shapes must match exactly. ``stored``:
    the weights are as their format stores them ([..., out, in]), converted here to the form the ops hold
    (:func:`held_forms`); otherwise they are in that form already."""
    params = dict(cell.parameters_and_names())
    if stored:  # what the ops derive from the parts (ms_swiglu.backends.spec.Derived), from them as stored
        state = dict(state)
        for prefix, c in cell.cells_and_names():
            if hasattr(c, "derive"):
                pre = f"{prefix}." if prefix else ""
                own = {n[len(pre):]: w for n, w in state.items() if n.startswith(pre)}
                state.update({pre + n: w for n, w in c.derive(own).items()})
    if set(params) != set(state):
        raise InputError(f"expected weights {sorted(params)}, got {sorted(state)}")
    if stored:
        forms = held_forms(cell)
        state = {name: forms[name].store(w) if name in forms else w for name, w in state.items()}
    for name, w in state.items():
        if params[name].shape != w.shape:
            raise InputError(f"{name}: expected shape {params[name].shape}, got {w.shape}")
        params[name].set_data(ms.Tensor(np.ascontiguousarray(w), dtype=params[name].dtype))
    return cell
