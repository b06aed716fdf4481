"""The cpu backend's C++ library (built by ``pip install``): where it is, what it binds, which paths it takes.

Names, not positions, cross the boundary: dtypes, GEMM paths and ops are asked and answered by name, and the
tuning table (which path a token count takes) is read from the library itself.

Diagnostics (documented, for tests and benchmarks; not needed to use the package): :func:`set_isa` forces a lower
instruction set, :func:`forced_path` forces one GEMM path, :func:`launches` counts the ops' runs, :func:`run`
calls an op on NumPy arrays as MindSpore would, :func:`amx_s8_sums` runs W8A8's AMX-INT8 kernel alone (on the
tiles, or on their scalar model where the CPU has none).

``MS_SWIGLU_ONEDNN=/path/to/libdnnl.so.3`` binds another oneDNN than MindSpore's; one outside the versions the
package's headers describe is refused with a warning, and the GEMMs then run on the package's own kernels.
"""
import contextlib
import ctypes
import functools
import glob
import importlib.util
import json
import os
import warnings

import numpy as np

from ms_swiglu import quant as quant_formats

# The NumPy arrays `run` takes per dtype (bfloat16 as its 16-bit patterns).
NP_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


@functools.cache
def library_path():
    """Absolute path of the compiled library."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_kernels*.so")))
    if not found:
        raise RuntimeError(f"ms_swiglu: expected the C++ kernels _kernels*.so in {here}, found none; "
                           f"install the package with `pip install .` (it builds them)")
    return found[0]


@functools.cache
def _lib():
    lib = ctypes.CDLL(library_path())
    for name in ("msw_isa", "msw_isa_name", "msw_onednn", "msw_dtype_name", "msw_path_name", "msw_tuning",
                 "msw_op_name", "msw_format_name"):
        getattr(lib, name).restype = ctypes.c_char_p
    lib.msw_set_isa.argtypes = [ctypes.c_char_p]
    lib.msw_onednn.argtypes = [ctypes.c_char_p]
    lib.msw_path.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int, ctypes.c_char_p]
    lib.msw_launches.argtypes = [ctypes.c_char_p]
    lib.msw_launches.restype = ctypes.c_int64
    p = ctypes.c_void_p
    lib.msw_amx_s8_sums.argtypes = [ctypes.c_int, p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32, p,
                                    ctypes.c_int64, p]
    return lib


def _names(fn):
    names, i = [], 0
    while (name := fn(i)) is not None:
        names.append(name.decode())
        i += 1
    return tuple(names)


@functools.cache
def _mindspore_onednn():
    spec = importlib.util.find_spec("mindspore")  # located, not imported
    for folder in spec.submodule_search_locations if spec else ():
        path = os.path.join(folder, "lib", "libdnnl.so.3")
        if os.path.exists(path):
            return path
    return ""


@functools.cache
def onednn():
    """What the GEMMs above the skinny range run on, bound on first call: ``"oneDNN 3.10.1 at <path>"`` (by
    default MindSpore's own libdnnl.so.3), or ``"unavailable: <why>"``, which is also warned about once."""
    status = _lib().msw_onednn(_mindspore_onednn().encode()).decode()
    if status.startswith("unavailable"):
        warnings.warn(f"ms_swiglu: oneDNN {status}; the cpu backend's GEMMs run on its own skinny kernels at every "
                      f"token count (slower above a few tokens)", RuntimeWarning, stacklevel=2)
    return status


def tuning():
    """The library's tuning table: which path each dtype takes per token count, and its block sizes; for the ISA in
    use (:func:`set_isa` changes its tile rows, its panel ranges and its dot kernels)."""
    return json.loads(_lib().msw_tuning())


@functools.cache
def paths():
    """The GEMM paths, by the library's names: ``("skinny", "onednn", "onednn-swapped", "amx", "panel")``."""
    return _names(_lib().msw_path_name)


@functools.cache
def formats():
    """The names of the quantized weight formats the library computes (its format rows): a format whose
    ``kernel`` is one of them runs on the library's ops of that row (:func:`op_name`)."""
    return _names(_lib().msw_format_name)


def op_name(op, quant=None):
    """The library's op ``op`` (``Linear``, ``GateUpSwiglu``, ``MoeGateUpSwiglu``, ``MoeDownCombine``) for weights
    in the format ``quant``: its own name for float weights, ``Q{op}_{row}`` for a format row of :func:`formats`."""
    method = quant_formats.get(quant)
    if not method.quantized:
        return op
    if method.kernel not in formats():
        raise ValueError(f"op_name: expected a format of the library's rows {formats()}, got {method.name}")
    zp = "_zp" if method.zero_point else ""  # (one registration, so one input count, per aot op name)
    return f"Q{op}_{method.kernel.replace('-', '_')}{zp}"


def has_op(op, quant=None):
    """Whether the library has the op ``op`` for weights in the format ``quant`` (a format row need not have every
    op: int4's experts run in the graph)."""
    method = quant_formats.get(quant)
    return not method.quantized or (method.kernel in formats() and op_name(op, method) in ops())


@functools.cache
def dtypes():
    """The dtype names the library takes (MindSpore's names)."""
    return _names(_lib().msw_dtype_name)


@functools.cache
def ops():
    """The op names of the library (those :func:`launches` counts)."""
    return _names(_lib().msw_op_name)


def _dtype(dtype):
    if dtype not in dtypes():
        raise ValueError(f"expected a dtype in {dtypes()}, got {dtype!r}")
    return dtype.encode()


def path(dtype, tokens, quant=None, expert=False):
    """The GEMM path ``tokens`` tokens of ``dtype`` take (with ``quant``: against int8 weights of that format;
    ``expert``: as one expert's rows in the grouped MoE kernels, which have their own ranges):
    ``skinny`` (each weight row streamed once for all tokens), ``onednn`` (y = x W^T), ``onednn-swapped``
    (y^T = W x^T, the weights as oneDNN's source), ``amx`` (bfloat16 on AMX tiles) or ``panel`` (weights broadcast
    against x transposed, on AVX2). Per-row int8 has its own ranges; int8 with group-wise scales takes the paths
    of weights in ``dtype`` (dequantized for them where the kernel does not apply the scales itself)."""
    onednn()
    method = quant_formats.get(quant)
    row = method.kernel if method.quantized and method.kernel else ""
    return paths()[_lib().msw_path(_dtype(dtype), int(tokens), bool(expert), row.encode())]


@contextlib.contextmanager
def forced_path(name):
    """Within the block every GEMM takes path ``name`` (a diagnostic); oneDNN paths fall back to ``skinny`` where
    oneDNN cannot run the dtype, and ``amx`` and ``panel`` where the CPU has no such kernel."""
    if name not in paths():
        raise ValueError(f"expected a path in {paths()}, got {name!r}")
    onednn()
    previous = _lib().msw_force_path(paths().index(name))
    try:
        yield
    finally:
        _lib().msw_force_path(previous)


def launches():
    """How often this process has run each op of the library (all threads), by op name (a diagnostic)."""
    return {name: _lib().msw_launches(name.encode()) for name in ops()}


def amx_s8_sums(xq, w, offset=0, tiles=True):
    """int32 [n, m] = (xq - offset) @ w.T for int8 xq [n, k] and w [m, k], by W8A8's AMX-INT8 panel kernel (TDPBSSD
    tiles; ``tiles=False``: the same kernel on a scalar model of the tile instructions, which any CPU runs). Raises
    where ``tiles`` and the CPU has no AMX-INT8 (or Linux gave the process no tile data)."""
    xq, w = np.ascontiguousarray(xq, np.int8), np.ascontiguousarray(w, np.int8)
    (n, k), m = xq.shape, w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"amx_s8_sums: expected w [m, {k}], got {list(w.shape)}")
    acc = np.zeros((m, (n + 15) // 16 * 16), np.int32)
    if _lib().msw_amx_s8_sums(int(tiles), xq.ctypes.data, n, k, int(offset), w.ctypes.data, m, acc.ctypes.data):
        raise RuntimeError("amx_s8_sums: expected a CPU with AMX-INT8 tiles granted to the process, found none")
    return acc[:, :n].T.copy()


def isa():
    """The instruction set the kernels use: 'avx512amx' (avx512bf16's, W8A8 on AMX-INT8 tiles), 'avx512bf16'
    (AVX-512 with AVX512-BF16), 'avx512', 'avx2' or 'generic'."""
    return _lib().msw_isa().decode()


@functools.cache
def isas():
    """The instruction sets this CPU runs the kernels on, best first (the first is the default :func:`isa`)."""
    return _names(_lib().msw_isa_name)


def set_isa(name):
    """Force a lower instruction set (a diagnostic); raises when the CPU lacks it."""
    if _lib().msw_set_isa(name.encode()) != 0:
        raise ValueError(f"isa: expected one of {isas()} (the ones this CPU runs), got {name!r}")


def run(op, *arrays, dtype):
    """Call the library's ``op`` on contiguous NumPy arrays as MindSpore would (inputs, then the output); the
    float arrays of the op's ``dtype`` ('float32', 'float16', or 'bfloat16' held as uint16 bits), others (int32
    ids, float32 weights and scales, int8 weights) as they are. Returns the output (the last array)."""
    onednn()
    n = len(arrays)
    names = {np.dtype(np.uint16): _dtype(dtype), np.dtype(np.float16): b"float16", np.dtype(np.float32): b"float32",
             np.dtype(np.int32): b"int32", np.dtype(np.int8): b"int8", np.dtype(np.uint8): b"uint8"}
    shapes = [(ctypes.c_int64 * a.ndim)(*a.shape) for a in arrays]
    status = getattr(_lib(), op)(
        n, (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays]), (ctypes.c_int * n)(*[a.ndim for a in arrays]),
        (ctypes.POINTER(ctypes.c_int64) * n)(*shapes), (ctypes.c_char_p * n)(*[names[a.dtype] for a in arrays]),
        None, None)
    if status != 0:
        raise ValueError(f"{op}: expected inputs it takes, got status {status} for "
                         f"{[a.shape for a in arrays]} ({dtype})")
    return arrays[-1]


def linear(x, w, out, dtype, swiglu=False):
    """``Linear`` (``GateUpSwiglu`` with ``swiglu``) on x [..., K], w [M, K], out [..., M] ([..., M/2])."""
    try:
        return run("GateUpSwiglu" if swiglu else "Linear", x, w, out, dtype=dtype)
    except ValueError as exc:
        raise ValueError(f"linear: expected x [..., K], w [M, K] and out of one dtype; {exc}") from None


if __name__ == "__main__":  # python -m ms_swiglu.backends.cpu.kernels: the installed library, its ISA and tuning
    print(f"library {library_path()}\nisa {isa()}\n{onednn()}\ntuning {json.dumps(tuning(), indent=1)}")
