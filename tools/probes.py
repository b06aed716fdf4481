"""The benchmarks' bandwidth probes (tools/csrc/probes.cc, built by ``pip install`` beside the benchmarks; not
part of the package's kernels): a parallel streaming read and a 2-read-1-write add over NumPy arrays."""
import ctypes
import functools
import glob
import os


@functools.cache
def _lib():
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_probes*.so")))
    if not found:
        raise RuntimeError(f"ms_swiglu.tools: expected the probe library _probes*.so in {here}, found none; "
                           f"install the package with `pip install .` (it builds it)")
    lib = ctypes.CDLL(found[0])
    lib.probe_read.restype = ctypes.c_double
    lib.probe_read.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64]
    lib.probe_add.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def read_sum(x, isa="best"):
    """Sum of a contiguous float32 array by a parallel streaming read (8 streams per thread) compiled for
    ``isa`` ('avx512', 'avx2', 'generic' or 'best')."""
    total = _lib().probe_read(isa.encode(), x.ctypes.data, x.size)
    if total == -1.0 and isa != "best":
        raise ValueError(f"isa: expected one of 'avx512', 'avx2', 'generic' supported by this CPU, got {isa!r}")
    return total


def add(a, b, out):
    """out = a + b over contiguous float32 arrays, in parallel."""
    _lib().probe_add(a.ctypes.data, b.ctypes.data, out.ctypes.data, out.size)
