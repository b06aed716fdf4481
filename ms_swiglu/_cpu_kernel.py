"""Where the C++ SwiGLU kernel lives, and which ISA it runs (the .so is built by ``pip install``)."""
import contextlib
import ctypes
import functools
import glob
import importlib.util
import os

import numpy as np

from ms_swiglu.config import DTYPE_NAMES


@functools.cache
def kernel_path():
    """Absolute path of the compiled kernel library."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_swiglu_cpu*.so")))
    if not found:
        raise RuntimeError(f"ms_swiglu: expected the C++ kernel _swiglu_cpu*.so in {here}, found none; "
                           f"install the package with `pip install .` (it builds the kernel)")
    return found[0]


@functools.cache
def _lib():
    lib = ctypes.CDLL(kernel_path())
    lib.msw_isa.restype = ctypes.c_char_p
    lib.msw_set_isa.argtypes = [ctypes.c_char_p]
    lib.msw_launches.restype = ctypes.c_int64
    lib.msw_read.restype = ctypes.c_double
    lib.msw_read.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.msw_add.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.msw_gemm.restype = ctypes.c_char_p
    lib.msw_gemm.argtypes = [ctypes.c_char_p]
    lib.msw_route.argtypes = [ctypes.c_int, ctypes.c_int64]
    return lib


@functools.cache
def _onednn_path():
    spec = importlib.util.find_spec("mindspore")  # located, not imported
    for folder in spec.submodule_search_locations if spec else ():
        path = os.path.join(folder, "lib", "libdnnl.so.3")
        if os.path.exists(path):
            return path
    return ""


def gemm():
    """The GEMM the linear kernels use above the skinny range: 'onednn' (MindSpore's libdnnl.so.3, bound on
    first call) or 'skinny' when it is missing."""
    return _lib().msw_gemm(_onednn_path().encode()).decode()


ROUTES = ("skinny", "onednn", "onednn-swapped")
# The NumPy arrays `linear` takes per dtype (bfloat16 as its 16-bit patterns); C++ indexes dtypes in this order.
NP_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


def _dtype_index(dtype):
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"expected a dtype in {DTYPE_NAMES}, got {dtype!r}")
    return DTYPE_NAMES.index(dtype)


def route(dtype, tokens):
    """How the linear kernels run `tokens` tokens of `dtype`: 'skinny' (each weight row streamed once for all
    tokens), 'onednn' (y = x W^T) or 'onednn-swapped' (y^T = W x^T, the weights as oneDNN's source operand)."""
    gemm()
    return ROUTES[_lib().msw_route(_dtype_index(dtype), int(tokens))]


@contextlib.contextmanager
def forced_route(name):
    """Within the block, every linear kernel call takes route `name` (tests and benchmarks); oneDNN routes fall
    back to 'skinny' where oneDNN cannot run the dtype."""
    if name not in ROUTES:
        raise ValueError(f"expected a route in {ROUTES}, got {name!r}")
    gemm()
    previous = _lib().msw_force_route(ROUTES.index(name))
    try:
        yield
    finally:
        _lib().msw_force_route(previous)


def read_sum(x):
    """Sum of a contiguous float32 array by the kernel's parallel streaming read (a bandwidth probe)."""
    return _lib().msw_read(x.ctypes.data, x.size)


def add(a, b, out):
    """out = a + b over contiguous float32 arrays, in parallel (a 2-read-1-write bandwidth probe)."""
    _lib().msw_add(a.ctypes.data, b.ctypes.data, out.ctypes.data, out.size)


def launches():
    """How often this process has run each kernel (all threads): SwiGLU forward/backward, Linear, GateUpSwiglu."""
    names = ("forward", "backward", "linear", "gate_up_swiglu")
    return {name: _lib().msw_launches(i) for i, name in enumerate(names)}


def isa():
    """The instruction set the kernel uses: 'avx512', 'avx2' or 'generic'."""
    return _lib().msw_isa().decode()


def set_isa(name):
    """Force a lower instruction set (for tests and benchmarks); raises when the CPU lacks it."""
    if _lib().msw_set_isa(name.encode()) != 0:
        raise ValueError(f"isa: expected one of 'avx512', 'avx2', 'generic' supported by this CPU, got {name!r}")


def linear(x, w, out, dtype, swiglu=False):
    """Run the ``Linear`` kernel (``GateUpSwiglu`` with ``swiglu``) on contiguous NumPy arrays as MindSpore would
    call it: x [..., K], w [M, K], out [..., M] ([..., M/2] with ``swiglu``), all of `dtype` ('float32',
    'float16', or 'bfloat16' held as uint16 bits). For tests and benchmarks; returns ``out``."""
    arrays = (x, w, out)
    shapes = [(ctypes.c_int64 * a.ndim)(*a.shape) for a in arrays]
    status = getattr(_lib(), "GateUpSwiglu" if swiglu else "Linear")(
        3, (ctypes.c_void_p * 3)(*[a.ctypes.data for a in arrays]), (ctypes.c_int * 3)(*[a.ndim for a in arrays]),
        (ctypes.POINTER(ctypes.c_int64) * 3)(*shapes), (ctypes.c_char_p * 3)(*[dtype.encode()] * 3), None, None)
    if status != 0:
        raise ValueError(f"linear: expected x [..., K], w [M, K] and out of one dtype, got status {status} for "
                         f"{x.shape}, {w.shape}, {out.shape} ({dtype})")
    return out
