"""Where the C++ SwiGLU kernel lives, and which ISA it runs (the .so is built by ``pip install``)."""
import ctypes
import functools
import glob
import os


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
    return lib


def read_sum(x):
    """Sum of a contiguous float32 array by the kernel's parallel streaming read (a bandwidth probe)."""
    return _lib().msw_read(x.ctypes.data, x.size)


def add(a, b, out):
    """out = a + b over contiguous float32 arrays, in parallel (a 2-read-1-write bandwidth probe)."""
    _lib().msw_add(a.ctypes.data, b.ctypes.data, out.ctypes.data, out.size)


def launches():
    """``{"forward": n, "backward": m}``: how often this process has run the kernels (all threads)."""
    return {"forward": _lib().msw_launches(0), "backward": _lib().msw_launches(1)}


def isa():
    """The instruction set the kernel uses: 'avx512', 'avx2' or 'generic'."""
    return _lib().msw_isa().decode()


def set_isa(name):
    """Force a lower instruction set (for tests and benchmarks); raises when the CPU lacks it."""
    if _lib().msw_set_isa(name.encode()) != 0:
        raise ValueError(f"isa: expected one of 'avx512', 'avx2', 'generic' supported by this CPU, got {name!r}")
