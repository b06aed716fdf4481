"""The weight formats the Cells compute with, one :class:`~ms_swiglu.quant.base.QuantMethod` each, by name.

Names (the CLI's ``--quantize`` choices, manifests, converted files' metadata): ``int8``, ``int8-g128``,
``int8-g{G}`` and ``int4-g{G}`` (``-zp`` with zero points) for other group sizes, made by name for any group size a
checkpoint has, ``w8a8`` (dynamic activations), ``w8a8-static``. Adding a format is one module defining its
method and one line in :data:`METHODS` (or :func:`register`), plus the kernels of the backends that should run it
natively (a row of the C++ library for ``cpu``); the others run it through its ``dequantize_op``. No code outside
this package compares format names. No MindSpore import at module load.
"""
import re

from ms_swiglu.errors import InputError
from ms_swiglu.quant.base import Activation, Part, QuantMethod  # noqa: F401 -- public names
from ms_swiglu.quant.int4 import Int4
from ms_swiglu.quant.int8 import INT8, INT8_G128, Int8
from ms_swiglu.quant.w8a8 import W8A8
from ms_swiglu.schema import QUANTIZED_PARAMS

NONE = QuantMethod()
INT4_G128 = Int4(128)
W8A8_DYNAMIC, W8A8_STATIC = W8A8(Activation.DYNAMIC), W8A8(Activation.STATIC)
METHODS = {m.name: m for m in (NONE, INT8, INT8_G128, INT4_G128, W8A8_DYNAMIC, W8A8_STATIC)}
# what `quantize` makes of float weights (the others come from quantized checkpoints)
QUANTIZERS = ("int8", "int8-g128", "int4-g128", "w8a8")
_GROUPED = re.compile(r"(int4|int8)-g(\d+)(-zp)?")


def names():
    """The names of the formats float weights can be quantized to (the CLI's ``--quantize`` choices): the
    package's and any registered one that quantizes."""
    return QUANTIZERS + tuple(n for n, m in METHODS.items() if m.quantized and m.quantizes and n not in QUANTIZERS)


def get(quant):
    """The method of ``quant``: a name, None (``none``) or a method (returned as it is)."""
    if isinstance(quant, QuantMethod):
        return quant
    if quant is None:
        return NONE
    if quant not in METHODS:
        m = _GROUPED.fullmatch(quant) if isinstance(quant, str) else None
        group = int(m.group(2)) if m else 0
        if m and m.group(1) == "int4" and group > 0 and group % 2 == 0:
            return Int4(group, zero_point=bool(m.group(3)))
        if m and m.group(1) == "int8" and group > 0 and not m.group(3):
            return Int8(quant, group)
        raise InputError(f"quant: expected None or one of {', '.join(names())}, got {quant!r}")
    return METHODS[quant]


def known(name):
    """Whether ``name`` names a quantized format (a converted file's, a manifest's)."""
    try:
        return get(name).quantized
    except InputError:
        return False


def name(quant):
    """The name of a quantized format, None for weights in the compute dtype (manifests, metadata, result lines)."""
    method = get(quant)
    return method.name if method.quantized else None


def register(method):
    """Add a format (a :class:`QuantMethod` with a new ``name``); returns it."""
    if not isinstance(method, QuantMethod) or method.name in METHODS:
        raise InputError(f"quant: expected a QuantMethod with a new name, got {method!r}")
    METHODS[method.name] = method
    return method


def quantize_tensors(tensors, quant, quantized):
    """``tensors`` (``{name: array}``) with every name for which ``quantized(name)`` holds encoded by ``quant`` (a
    quantized format), its other parts beside it as ``{name}{suffix}``; the others as they are."""
    method = get(quant)
    if not method.quantized:
        raise InputError(f"quant: expected one of {', '.join(names())}, got {quant!r}")
    out = {}
    for name, w in tensors.items():
        if quantized(name):
            out.update({name + suffix: a for suffix, a in method.encode(w).items()})
        else:
            out[name] = w
    return out


def quantize_state_dict(state, quant="int8"):
    """A Cell's ``{parameter name: array}`` with every projection weight (the schema's ``QUANTIZED_PARAMS``:
    packed gate/up, down, stacked experts, the shared expert; not the router, its bias or the shared expert's
    gate) quantized by ``quant``, its other parts beside it: ``gate_up_proj.weight`` -> ``gate_up_proj.weight``
    and ``gate_up_proj.weight_scale``."""
    return quantize_tensors(state, quant, lambda name: name.endswith(QUANTIZED_PARAMS))
