"""The benchmarks' bandwidth probes (tools/csrc/probes.cc, built by ``pip install`` beside the benchmarks; not
part of the package's kernels): a parallel streaming read and a 2-read-1-write add over NumPy arrays."""
import ctypes
import functools
import glob
import os
import time


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
    for name in ("probe_fma_peak", "probe_dpbf16_peak", "probe_amx_peak", "probe_widen_peak", "probe_vnni_peak",
                 "probe_madd_peak", "probe_madd_gemm_peak"):
        getattr(lib, name).restype = ctypes.c_double
        getattr(lib, name).argtypes = [ctypes.c_int, ctypes.c_int64]
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


def peaks(threads=None, seconds=0.2):
    """The machine's compute peaks in GFLOP/s, from in-register loops on ``threads`` threads (default: every CPU
    this process may use), the best of three calls of about ``seconds`` each: ``{"fma_float32": ...,
    "avx512_bfloat16": ..., "amx_bfloat16": ..., "int8_widen": ..., "int8_vpdpwssd": ..., "int8_vpmaddwd": ...,
    "int16_gemm_vpmaddwd": ...}``
    (None where the CPU lacks the instructions: VDPBF16PS, AMX, AVX512-VNNI, AVX2; the FMAs are AVX-512's, else
    AVX2's). The int8 ones are one token against int8 weights read from L1, 2 FLOP per weight, as the package's
    kernels take them: widened to float32 (sign-extend, convert, FMA), on VPDPWSSD against x's two int16 parts, or
    on VPMADDWD against x's int16 part per block of 32 (one conversion per 32 weights). ``int16_gemm_vpmaddwd``:
    the multiplies an int16 GEMM would issue on AVX2 (VPMADDWD + VPADDD, operands in registers; 2 OP each), the
    ceiling of an integer-dot GEMM for int8 weights against ``fma_float32``'s."""
    threads = threads or len(os.sched_getaffinity(0))
    fma_lanes = 16 if "avx512f" in machine()["flags"] else 8
    out = {}
    for key, fn, flops_per_iteration in (("fma_float32", _lib().probe_fma_peak, 12 * fma_lanes * 2),
                                         ("avx512_bfloat16", _lib().probe_dpbf16_peak, 12 * 16 * 2 * 2),
                                         ("amx_bfloat16", _lib().probe_amx_peak, 6 * 16 * 16 * 32 * 2),
                                         ("int8_widen", _lib().probe_widen_peak, 12 * fma_lanes * 2),
                                         ("int8_vpdpwssd", _lib().probe_vnni_peak, 6 * 32 * 2),
                                         ("int8_vpmaddwd", _lib().probe_madd_peak, 6 * 32 * 2),
                                         ("int16_gemm_vpmaddwd", _lib().probe_madd_gemm_peak, 12 * 16 * 2)):
        iterations, rate = 1000, fn(threads, 1000)  # warm up (and the AMX permission)
        while 0 < rate and iterations * flops_per_iteration * threads < seconds * rate / 16:
            iterations *= 4  # until a call takes seconds / 16: its rate then sizes the timed calls
            rate = fn(threads, iterations)
        iterations = max(iterations, int(seconds * rate / flops_per_iteration / threads))
        best = max(fn(threads, iterations) for _ in range(3)) if rate > 0 else rate
        out[key] = best / 1e9 if best > 0 else None
    return out


def host_probes(read_floats=2**27, amx_iterations=100_000):
    """Short probes of the host's speed for ``timing.HostSpeed`` ({name: callable returning a rate}): the streaming
    read of ``read_floats`` float32 (512 MiB, 1.7x the largest L3 measured on, 300 MiB, so a repeated read still
    comes from memory; 13-20 ms) in bytes/s and, where the CPU gives AMX, the AMX loop in FLOP/s (100000
    iterations per thread: ~5 ms)."""
    import numpy as np  # noqa: PLC0415

    big, threads = np.ones(read_floats, np.float32), len(os.sched_getaffinity(0))

    def read():
        t0 = time.perf_counter()
        read_sum(big)
        return big.nbytes / (time.perf_counter() - t0)

    probes = {"read": read}
    if _lib().probe_amx_peak(threads, 100) > 0:
        probes["amx"] = lambda: _lib().probe_amx_peak(threads, amx_iterations)
    return probes


MACHINE_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8")


def machine():
    """What a benchmark ran on (its JSON carries it; the same code runs at different speeds on different hosts):
    the CPU's model, the vector and matrix extensions the kernels choose between, the CPUs this process may use,
    and the L3's size."""
    info = {"cpu": "unknown", "flags": [], "cpus": len(os.sched_getaffinity(0)), "l3": None}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and info["cpu"] == "unknown":
                    info["cpu"] = value.strip()
                elif key.strip() == "flags":
                    info["flags"] = [x for x in MACHINE_FLAGS if x in value.split()]
                    break
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            info["l3"] = f.read().strip()
    except OSError:
        pass
    return info


def machine_line():
    """``machine()`` as one line for a benchmark's printout."""
    info = machine()
    return f"machine: {info['cpu']}, {info['cpus']} CPUs, {' '.join(info['flags'])}, L3 {info['l3']}"


def graph_call():
    """A callable timing MindSpore's cost of one graph call: ``x + 1`` on one element in GRAPH_MODE (which the
    caller has set), its output brought to the host. Every MLP graph's call pays it once; the library's kernels,
    called directly, do not."""
    import mindspore as ms  # noqa: PLC0415
    from mindspore import nn  # noqa: PLC0415

    class AddOne(nn.Cell):
        def construct(self, x):
            return x + 1

    cell, one = AddOne(), ms.Tensor([[0.0]], ms.float32)
    return lambda: cell(one).asnumpy()
