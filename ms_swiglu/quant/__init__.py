"""The weight formats the Cells compute with, one :class:`~ms_swiglu.quant.base.QuantMethod` each, by name.

Adding a format is one module defining its method and one line in :data:`METHODS` (or :func:`register`), plus
the kernels of the backends that should run it natively; the native backends run any method through its
``dequantize_op``. No code outside this package compares format names. No MindSpore import at module load.
"""
from ms_swiglu.errors import InputError
from ms_swiglu.quant.base import QuantMethod
from ms_swiglu.quant.int8 import INT8, INT8_G128
from ms_swiglu.schema import QUANTIZED_PARAMS, SCALE

NONE = QuantMethod()
METHODS = {m.name: m for m in (NONE, INT8, INT8_G128)}


def names():
    """The names of the quantized formats (the CLI's ``--quantize`` choices)."""
    return tuple(name for name, m in METHODS.items() if m.quantized)


def get(quant):
    """The method of ``quant``: a name, None (``none``) or a method (returned as it is)."""
    if isinstance(quant, QuantMethod):
        return quant
    if quant is None:
        return NONE
    if quant not in METHODS:
        raise InputError(f"quant: expected None or one of {', '.join(names())}, got {quant!r}")
    return METHODS[quant]


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
    """``tensors`` (``{name: array}``) with every name for which ``quantized(name)`` holds quantized by ``quant``
    (a quantized format), its scales beside it as ``{name}_scale``; the others as they are."""
    method = get(quant)
    if not method.quantized:
        raise InputError(f"quant: expected one of {', '.join(names())}, got {quant!r}")
    out = {}
    for name, w in tensors.items():
        if quantized(name):
            out[name], out[name + SCALE] = method.quantize(w)
        else:
            out[name] = w
    return out


def quantize_state_dict(state, quant="int8"):
    """A Cell's ``{parameter name: array}`` with every projection weight (the schema's ``QUANTIZED_PARAMS``:
    packed gate/up, down, stacked experts, the shared expert; not the router, its bias or the shared expert's
    gate) quantized by ``quant``, its scales beside it: ``gate_up_proj.weight`` -> ``gate_up_proj.weight`` and
    ``gate_up_proj.weight_scale``."""
    return quantize_tensors(state, quant, lambda name: name.endswith(QUANTIZED_PARAMS))
