"""What a weight format is to the package: one :class:`QuantMethod` object per format (vLLM's quant-method object
is the model), and the descriptor every part of the package reads instead of guessing from a scale's presence.

A format says what it stores per weight (its :class:`Part` s: the weight in its container, its scales, zero points,
activation scales, each with the axes it has), how its activations are quantized (:class:`Activation`), the row of
the C++ library that computes it (``kernel``; None: no row, the backends dequantize it in the graph), how to encode
and decode float weights in NumPy, its dequantization inside a graph, and which Parameters a Cell holds. How each
part splits over ranks follows from its axes (``ms_swiglu.layout``); what a checkpoint stores on disk is its
reader's (``ms_swiglu.checkpoint``), which hands the parts over in this form.

Shape legend: M = output rows (any leading dims, e.g. experts, come first), K = inputs of a row, G = a group's
inputs.
"""
import dataclasses
import enum

import numpy as np

from ms_swiglu import initial
from ms_swiglu.errors import InputError
from ms_swiglu.schema import SCALE


class Activation(enum.Enum):
    """How a format's activations reach its GEMM."""

    NONE = "in the compute dtype"  # weight-only
    # int8 per token at run time: scale = max|x| / 127 (Ascend's DynamicQuant, vLLM's kernels), x_q = round(x / s)
    DYNAMIC = "int8 per token, dynamic"
    # int8 with the checkpoint's scale and offset per tensor: x_q = clip(round(x / s + o), -128, 127)
    STATIC = "int8 per tensor, static"


@dataclasses.dataclass(frozen=True)
class Part:
    """One tensor a format stores per weight ``[..., M, K]``: its name after the weight's (``""``: the weight), its
    NumPy dtype, and its axes after the leading ones: the weight's ``rows`` (M) or not, then an axis of an element
    per ``per`` inputs (1: one per input; 2: two 4-bit values a byte; G: a group's scale) or none (0). The axes say
    how it splits: with the rows (``Split.ROWS``), or along K by whole elements (``Split.COLUMNS``); a part with
    neither axis is one value per tensor (its shape ``[..., 1]``) and is replicated."""

    suffix: str
    dtype: str
    rows: bool = True
    per: int = 0

    def shape(self, lead, m, k):
        """Its shape for weights ``[*lead, m, k]``."""
        return (*lead, *([m] if self.rows else []), *([k // self.per] if self.per else []), *(
            [] if self.rows or self.per else [1]))


class QuantMethod:
    """Weights in the compute dtype, nothing beside them: the ``none`` format (and the base of the others)."""

    name = "none"
    summary = "weights in the compute dtype"  # one line for manifests and documents
    quantized = False  # whether weights are stored in another form with parts beside them
    quantizes = True  # float weights can be quantized to it (``encode``); not where a part comes from calibration
    bits = None  # bits per stored weight; None: the compute dtype's
    group = None  # inputs per scale; None: one scale per output row
    zero_point = False  # asymmetric: a zero point per scale
    activation = Activation.NONE
    kernel = None  # the C++ library's row for it (ms_swiglu.backends.cpu.kernels.formats()); None: none
    # the values a correct device rounds to the activations' dtype per projection, beyond its output (the device
    # acceptance's chain, ms_swiglu.export.chain): none for float weights
    roundings = 0
    parts = ()  # its Parts, the weight first; () for the compute dtype

    def __repr__(self):
        return f"<quant {self.name}>"

    @property
    def stored(self):
        """The dtype name of the stored weights; None: the compute dtype."""
        return self.parts[0].dtype if self.parts else None

    @property
    def quantizes_activations(self):
        """Whether its GEMMs take int8 activations, quantized in the graph (W8A8)."""
        return self.activation is not Activation.NONE

    @property
    def weight_only_int8(self):
        """int8 weights with a scale per row or group, no zero point, activations in the dtype (what Ascend's
        weight-quant matmuls and the exported kits take)."""
        return (self.bits, self.activation, self.zero_point) == (8, Activation.NONE, False)

    def part_shapes(self, shape):
        """``{suffix: shape}`` of every part of weights ``shape`` ``[..., M, K]`` (checked: K takes the format)."""
        *lead, m, k = shape
        self.check_inputs(k)
        return {p.suffix: p.shape(lead, m, k) for p in self.parts}

    def scale_shape(self, rows, k):
        """The shape of the scales of weights ``[*rows, k]`` (None: no scales)."""
        shapes = self.part_shapes((*rows, k)) if self.quantized else {}
        return shapes.get("_scale")

    def check_inputs(self, k, what="input size"):
        """InputError unless a row of ``k`` inputs (a rank's) holds whole groups and whole stored elements."""
        for p in self.parts:
            if p.per > 1 and k % p.per:  # (a group, or a byte of two int4 values)
                raise InputError(f"quant {self.name}: expected an {what} that is a multiple of {p.per}, got {k}")

    def encode(self, w):
        """``{suffix: array}`` of every part that stands for float weights ``w`` ``[..., M, K]`` (quantized by the
        format's rounding: :meth:`Int8.quantize` and the like say how)."""
        return {"": w}

    def decode(self, parts):
        """The float32 weights ``[..., M, K]`` that ``parts`` (``{suffix: array}``) stand for."""
        return np.asarray(parts[""], np.float32)

    def dequantize_op(self):
        """A function ``(w, aux, dtype) -> weights in dtype`` for MindSpore graphs (``aux``: the tuple of the parts
        beside the weight): how the backends without a kernel for the format (and the reference) apply it; None
        where the weights are used as stored."""
        return None

    def activation_op(self):
        """A function ``(x, aux) -> (x_q, per-token scale)`` quantizing activations for the int8 GEMM, None for
        weight-only formats."""
        return None

    def create_weights(self, cell, name, shape, dtype, form=None):
        """Set ``cell.{name}`` and one Parameter per part beside it (``cell.{name}{suffix}``) for weights ``shape``
        ([..., M, K]) computing in ``dtype``; ``form``: how the backend's op holds the weight
        (``ms_swiglu.backends.spec.WeightForm``: its layout and dtype; the other parts are held as the format
        stores them). Returns the parts beside the weight, in order."""
        from mindspore.common import dtype as mstype  # noqa: PLC0415

        held = form.store(tuple(shape)) if form is not None else tuple(shape)
        if not self.parts:
            setattr(cell, name, initial.parameter(held, dtype, name))
            setattr(cell, name + SCALE, None)  # (no scales: readers of a Cell's scales find None)
            return ()
        shapes, made = self.part_shapes(shape), []
        for p in self.parts:
            s, kind = shapes[p.suffix], getattr(mstype, p.dtype)
            if p.suffix == "" and form is not None:
                if held != tuple(shape) and p.per != 1 and not form.packs:
                    raise InputError(f"{name}: expected weights of one input a value for an op that holds them "
                                     f"transposed, got {self.name} ({p.per} inputs a stored value)")
                s, kind = p.shape(held[:-2], *held[-2:]), form.dtype or kind  # packed along the held last axis
            fill = np.ones if p.suffix.endswith("scale") else np.zeros
            param = initial.parameter(s, kind, name + p.suffix, requires_grad=False,
                                      fill=lambda s=s, p=p, fill=fill: fill(s, p.dtype))
            setattr(cell, name + p.suffix, param)
            made.append(param)
        return tuple(made[1:])
