"""The benchmarks' bandwidth probes (tools/csrc/probes.cc, built by ``pip install`` beside the benchmarks; not
part of the package's kernels): a parallel streaming read and a 2-read-1-write add over NumPy arrays, and the
compute peaks; and the rule that no figure is given as more than 100% of its ceiling (:class:`Ceiling`).

A ceiling is a probe's rate on every thread, and counts only if every thread ran the whole call at once (each
thread's CPU time over the wall time from the call's start to its end, ``probe_last_concurrency``, at least
``CONCURRENCY``) and, for a compute loop, if it is at least ``SCALING`` x threads x its 1-thread rate
(:func:`checked_rates`): the peaks once recorded for the 2-CPU AMD EPYC host (117 and 234 GFLOP/s) were the loops'
1-thread rates, and the MLP ran at up to 175% of them."""
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
    lib.probe_read.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    lib.probe_last_concurrency.restype = ctypes.c_double
    lib.probe_last_concurrency.argtypes = []
    lib.probe_add.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    for name in ("probe_fma_peak", "probe_dpbf16_peak", "probe_amx_peak", "probe_widen_peak", "probe_vnni_peak",
                 "probe_madd_peak", "probe_madd_gemm_peak", "probe_dpbusd_peak", "probe_maddubs_gemm_peak",
                 "probe_amx_int8_peak"):
        getattr(lib, name).restype = ctypes.c_double
        getattr(lib, name).argtypes = [ctypes.c_int, ctypes.c_int64]
    return lib


def read_sum(x, isa="best", threads=None):
    """Sum of a contiguous float32 array by a parallel streaming read (12 streams per thread) compiled for
    ``isa`` ('avx512', 'avx2', 'generic' or 'best'), on ``threads`` threads (default: every CPU this process may
    use)."""
    total = _lib().probe_read(isa.encode(), x.ctypes.data, x.size, threads or 0)
    if total == -1.0 and isa != "best":
        raise ValueError(f"isa: expected one of 'avx512', 'avx2', 'generic' supported by this CPU, got {isa!r}")
    return total


def add(a, b, out):
    """out = a + b over contiguous float32 arrays, in parallel."""
    _lib().probe_add(a.ctypes.data, b.ctypes.data, out.ctypes.data, out.size)


class ProbeError(RuntimeError):
    """A probe could not measure its ceiling: a thread did not run the whole call, or the threads did not scale."""


class CeilingError(ProbeError):
    """A figure above the ceiling it is a fraction of, measured again: the run is refused rather than printed."""


# A measurement counts only where every thread ran at least this fraction of the time from the call's start to its
# end: one that waited for a CPU (another process, the hypervisor) leaves the rate below the host's (2-CPU AMD EPYC
# host: 0.93-0.99 when quiet; beside other processes 0.33-0.65, the 2 threads at 0.6-1.1x the 1-thread rate).
CONCURRENCY = 0.9
# A compute loop in registers runs on each core alike: on t threads, at least this x t x its 1-thread rate.
SCALING = 0.9
# Measurements of a probe (each the best of a few calls) before it is refused, this many seconds apart (another
# process's burst may end meanwhile).
ATTEMPTS = 3
RETRY_PAUSE_S = 1.0


def judge(probe, threads, one_thread, all_threads, concurrency, scaling=SCALING):
    """Whether ``all_threads`` (a rate on ``threads`` threads) is a ceiling: every thread of its call and of the
    1-thread call ran the whole call (``concurrency``: the least thread CPU time over the wall time of either,
    >= CONCURRENCY) and, with ``scaling`` (compute loops; None for a read, which the memory bandwidth bounds),
    ``all_threads`` >= scaling x threads x ``one_thread``. Returns all_threads / one_thread; raises ProbeError
    naming the probe, the measured figure and the expectation."""
    ratio = all_threads / one_thread
    if concurrency < CONCURRENCY:
        raise ProbeError(f"{probe}: a thread ran {concurrency:.0%} of its call's wall time (on 1 or {threads} "
                         f"threads, which gave {ratio:.2f}x the 1-thread rate), expected >= {CONCURRENCY:.0%} (every "
                         f"thread on its own CPU for the whole call); the host is busy")
    if scaling and threads > 1 and ratio < scaling * threads:
        raise ProbeError(f"{probe}: {threads} threads gave {ratio:.2f}x the 1-thread rate, expected >= "
                         f"{scaling * threads:.1f}x (every thread on its own CPU); the host is busy, or its CPUs "
                         f"share a core")
    return ratio


def _best(measure, threads, calls):
    """(rate, concurrency): the best of ``calls`` calls of ``measure(threads)`` (-> (rate, concurrency)) among
    those in which every thread ran the whole call, else the best one (judge refuses it)."""
    runs = [measure(threads) for _ in range(calls)]
    counted = [r for r in runs if r[1] >= CONCURRENCY] or runs
    return max(counted)


def checked_rates(probe, measure, threads, scaling=SCALING, calls=3, attempts=ATTEMPTS, pause=RETRY_PAUSE_S):
    """A probe's rate on 1 thread and on ``threads`` threads, checked by :func:`judge`: ``measure(t)`` returns
    (rate, concurrency) of one call on t threads; each figure is the best of ``calls`` calls, measured again up to
    ``attempts`` times, ``pause`` seconds apart, while judge refuses it, then its ProbeError is raised. Returns
    ``{"threads", "one_thread", "all_threads", "scaling" (all / one), "concurrency" (the lower of the two kept
    calls'), "attempts"}``."""
    for attempt in range(1, attempts + 1):
        if attempt > 1:
            time.sleep(pause)
        one, c1 = _best(measure, 1, calls)
        many, cn = (one, c1) if threads == 1 else _best(measure, threads, calls)
        try:
            ratio = judge(probe, threads, one, many, min(c1, cn), scaling)
        except ProbeError as e:
            error = e
            continue
        return {"threads": threads, "one_thread": one, "all_threads": many, "scaling": ratio,
                "concurrency": min(c1, cn), "attempts": attempt}
    raise ProbeError(f"{error} (measured {attempts} times)")


PEAKS = ("fma_float32", "avx512_bfloat16", "amx_bfloat16", "int8_widen", "int8_vpdpwssd", "int8_vpmaddwd",
         "int16_gemm_vpmaddwd")


def peaks(threads=None, seconds=0.2, names=PEAKS):
    """The machine's compute peaks in GFLOP/s, from in-register loops on ``threads`` threads (default: every CPU
    this process may use), each the best of three calls of about ``seconds`` each, checked against the same loop
    on one thread (:func:`checked_rates`: ProbeError where a thread did not run the whole call or the threads gave
    less than SCALING x threads x the 1-thread rate): ``{"fma_float32": ..., "avx512_bfloat16": ...,
    "amx_bfloat16": ..., "int8_widen": ..., "int8_vpdpwssd": ..., "int8_vpmaddwd": ..., "int16_gemm_vpmaddwd": ...,
    "int8_gemm_vpdpbusd": ..., "int8_gemm_vpmaddubsw": ..., "amx_int8": ...,
    "threads": threads, "one_thread": {the same on one thread}, "scaling": {all / one thread},
    "concurrency": {...}}`` for the ``names`` asked (None where the CPU lacks the instructions: VDPBF16PS, AMX,
    AVX512-VNNI, AVX2; the FMAs are AVX-512's, else AVX2's). The int8 ones are one token against int8 weights read
    from L1, 2 FLOP per weight, as the package's kernels take them: widened to float32 (sign-extend, convert, FMA),
    on VPDPWSSD against x's two int16 parts, or on VPMADDWD against x's int16 part per block of 32 (one conversion
    per 32 weights). ``int16_gemm_vpmaddwd``: the multiplies an int16 GEMM would issue on AVX2 (VPMADDWD + VPADDD,
    operands in registers; 2 OP each), the ceiling of an integer-dot GEMM for int8 weights against
    ``fma_float32``'s; ``int8_gemm_vpdpbusd``: a W8A8 GEMM's (VPDPBUSD, 64 multiplies each, 2 OP per multiply);
    ``int8_gemm_vpmaddubsw``: the same on AVX2 without VNNI (VPMADDUBSW, then VPMADDWD by ones and VPADDD: 32
    multiplies per three instructions), the other ceiling of W8A8 there beside ``int16_gemm_vpmaddwd``;
    ``amx_int8``: TDPBSSD tiles (AMX-INT8), W8A8's ceiling on AMX hosts."""
    threads = threads or len(os.sched_getaffinity(0))
    fma_lanes = 16 if "avx512f" in machine()["flags"] else 8
    loops = {"fma_float32": (_lib().probe_fma_peak, 12 * fma_lanes * 2),
             "avx512_bfloat16": (_lib().probe_dpbf16_peak, 12 * 16 * 2 * 2),
             "amx_bfloat16": (_lib().probe_amx_peak, 6 * 16 * 16 * 32 * 2),
             "int8_widen": (_lib().probe_widen_peak, 12 * fma_lanes * 2),
             "int8_vpdpwssd": (_lib().probe_vnni_peak, 6 * 32 * 2),
             "int8_vpmaddwd": (_lib().probe_madd_peak, 6 * 32 * 2),
             "int16_gemm_vpmaddwd": (_lib().probe_madd_gemm_peak, 12 * 16 * 2),
             "int8_gemm_vpdpbusd": (_lib().probe_dpbusd_peak, 12 * 16 * 4 * 2),
             "int8_gemm_vpmaddubsw": (_lib().probe_maddubs_gemm_peak, 12 * 32 * 2),
             "amx_int8": (_lib().probe_amx_int8_peak, 6 * 16 * 16 * 64 * 2)}
    out = {"threads": threads, "one_thread": {}, "scaling": {}, "concurrency": {}}
    for key in names:
        fn, flops_per_iteration = loops[key]
        iterations, rate = 1000, fn(threads, 1000)  # warm up (and the AMX permission)
        while 0 < rate and iterations * flops_per_iteration * threads < seconds * rate / 16:
            iterations *= 4  # until a call takes seconds / 16: its rate then sizes the timed calls
            rate = fn(threads, iterations)
        if rate <= 0:
            out[key] = out["one_thread"][key] = out["scaling"][key] = out["concurrency"][key] = None
            continue
        # per thread as many iterations on one thread as on all: each call takes about `seconds`
        iterations = max(iterations, int(seconds * rate / flops_per_iteration / threads))
        r = checked_rates(f"compute peak probe {key}", lambda t: (fn(t, iterations), _concurrency()), threads)
        out[key], out["one_thread"][key] = r["all_threads"] / 1e9, r["one_thread"] / 1e9
        out["scaling"][key], out["concurrency"][key] = r["scaling"], r["concurrency"]
    return out


def _concurrency():
    return _lib().probe_last_concurrency()


def read_rates(x, threads=None, calls=3):
    """The streaming read of ``x`` (float32, far larger than the L3) in GB/s on 1 thread and on ``threads``
    (default: every CPU this process may use), each the best of ``calls`` calls in which every thread ran the whole
    read (:func:`checked_rates`; ProbeError where none did): ``{"threads", "one_thread", "all_threads", "scaling",
    "concurrency", "attempts"}``. Only the concurrency is required: the memory's bandwidth, not the threads, bounds
    a read (the 2-thread read is not 2x the 1-thread one), so their ratio is recorded, not checked."""
    threads = threads or len(os.sched_getaffinity(0))

    def measure(t):
        t0 = time.perf_counter()
        read_sum(x, threads=t)
        return x.nbytes / (time.perf_counter() - t0) / 1e9, _concurrency()

    read_sum(x, threads=threads)  # warm up: the pages mapped
    return checked_rates("read probe", measure, threads, scaling=None, calls=calls)


class Ceiling:
    """A ceiling that figures are given as fractions of (a compute peak, the read probe's bandwidth, the best
    GEMM's rate), and how to measure it again. No fraction above 1 leaves :meth:`fractions`: a figure above its
    ceiling says the ceiling was measured low (a thread that did not run, a busy host), so the ceiling is measured
    again, once (``remeasure()``: its new value), and the higher of the two kept; a figure still above it refuses
    the run (CeilingError) rather than being printed or flagged. ``first``: the value given; ``again``: the one
    measured again (None: not)."""

    def __init__(self, name, value, unit, remeasure=None):
        self.name, self.value, self.unit, self.first, self.again = name, value, unit, value, None
        self._remeasure = remeasure

    def fractions(self, figures):
        """``{what: figure / ceiling}`` for ``{what: figure}`` (in the ceiling's unit), each <= 1."""
        if not figures:
            return {}
        top = max(figures, key=figures.get)
        if figures[top] > self.value and self._remeasure is not None:
            self.again, self._remeasure = self._remeasure(), None
            self.value = max(self.value, self.again)
        if figures[top] > self.value:
            again = (f"measured again: {self.again:.1f} {self.unit}" if self.again is not None else
                     "no way to measure it again")
            raise CeilingError(f"{top}: {figures[top]:.1f} {self.unit} is {figures[top] / self.value:.1%} of the "
                               f"{self.name} ({self.first:.1f} {self.unit}; {again}), expected <= 100%: a ceiling "
                               f"a figure exceeds is not the ceiling, so the run is refused")
        return {what: figure / self.value for what, figure in figures.items()}

    def record(self):
        """``{"first", "again"}`` where the ceiling was measured again, else None: for a result's JSON."""
        return None if self.again is None else {"first": self.first, "again": self.again}


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
