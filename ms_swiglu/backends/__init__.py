"""The backends of the SwiGLU MLP: one object each, chosen once, when a Cell is built.

A backend is a :class:`~ms_swiglu.backends.spec.Backend` (its fields are the list of what a backend provides),
defined by the module ``REGISTRY`` names as ``BACKEND``. A new backend is one module and one line here.
Cells, the exporter, the FFN block and the benchmarks ask the object; no code outside ``backends/`` compares
backend names. No MindSpore import at module load: the CLI lists :data:`NAMES` before it imports MindSpore.
"""
import importlib

from ms_swiglu.errors import InputError

REGISTRY = {
    "ascend": "ms_swiglu.backends.ascend",  # MindSpore's builtin Swiglu for Atlas A2/A3
    "cpu": "ms_swiglu.backends.cpu",  # the package's C++ kernels (aot Custom ops)
    "akg": "ms_swiglu.backends.akg",  # an AKG hybrid kernel
    "composite": "ms_swiglu.backends.composite",  # MindSpore ops: the reference
    "ge": "ms_swiglu.backends.ge",  # ops with GE adapters only; sparse MoE by GE's MoE ops
}
NAMES = ("auto", *REGISTRY)


def get(name):
    """The backend called ``name`` (a key of :data:`REGISTRY`)."""
    if name not in REGISTRY:
        raise InputError(f"backend: expected one of {', '.join(NAMES)}, got {name!r}")
    return importlib.import_module(REGISTRY[name]).BACKEND


def resolve(backend="auto"):
    """The backend object for a name, ``"auto"`` or a backend object (returned as it is).

    ``auto``: ``cpu`` off Ascend; on Ascend ``ascend`` where the chip has the builtin Swiglu (Atlas A2/A3), else
    ``composite`` (``ms_swiglu.backends.chips``).
    """
    if not isinstance(backend, str):
        return backend
    if backend == "auto":
        from ms_swiglu.backends import chips  # noqa: PLC0415

        return get(chips.auto_backend(chips.current()))
    return get(backend)
