"""``ms-swiglu bench``: the MLP variants side by side in one run, as ratios, against this machine's ceilings.

Variants (same seeded weights; each also with jit_level O1 when asked):
    baseline          three Dense: gate, up, down (the seed article's SwiGLUMLP)
    packed-composite  one Dense 2I + split + silu + mul
    packed-cpu        the C++ linear kernels: the 2I GEMM with SwiGLU as its epilogue, then the down GEMM
                      (a skinny GEMM for few tokens, oneDNN's above; weights kept in their dtype)
    packed-akg        one Dense 2I + the AKG hybrid kernel (static shapes: compiled per token count)

Ceilings, measured in the same run: the GEMM ceiling (MindSpore MatMul [N,H]x[H,2I] and NumPy's matmul of the
same size, interleaved with the variants; the faster one), the read bandwidth (a sum over 1 GiB) and the
2-read-1-write bandwidth (an add of two 256 MiB arrays), each by NumPy in 1 and 2 threads and by the package's
threaded probes in the .so (NumPy's reductions hold the GIL, so its 2-thread read is no faster), the best kept,
at the start. At N=1 the .so's read probe also joins the interleaved rounds, and the decode fraction is taken
against it (median against median). MindSpore's cost of one graph call (a one-op graph on one element) joins the
rounds too: every variant's call pays it once (on the AMD EPYC host 0.96-1.05 ms in these rounds, 0.2-0.3 ms in
a loop of back-to-back calls: after the pause the runtime's threads wake), the library's GEMM, called directly,
does not, and a model that is one graph pays it once for all its blocks (`--model-blocks`).

With --layers L every call runs L MLPs with distinct weights, so that the weights do not sit in the L3 cache
between calls (a repeated single layer partly does where the L3 is large: 300 MiB on the Intel host measured).

With --peer-python PY (an interpreter that has torch) the peer `peer-torch/eager` joins the interleaved loop:
HuggingFace's LlamaMLP in PyTorch, served by tools/torch_peer.py in its own process and timed per round trip.

Several --dtype values are interleaved in one loop too, so that float16/bfloat16 are compared with float32 as
ratios (`vs f32`).

Disturbance, per token count: the CPU time other processes and the hypervisor took during the rounds, and the
fraction of calls that ran in a slow phase of the host, which /proc does not show (a short AMX and read probe
before every call; tools/timing.py). A token count above either threshold is re-run (--retries) and, if it stays
above, flagged DISTURBED.

Odd rounds run the variants in reverse order; each cell states the largest change of a variant's median between
forward and reversed rounds (`order effect`), so a time that depends on what ran before it shows.

Per cell: median, min and spread (p90-p10 over median) of the latency; GFLOP/s (6*N*H*I per call); for N=1 the
GB/s of weight bytes read; the fraction of the GEMM ceiling (N >= 16) or of the read bandwidth (N=1) and of the
compute peak, never above 100% (tools/probes.py: Ceiling: a figure above its ceiling has the ceiling measured
again, once, and refuses the run if still above it; the peaks and the read probe are checked to have run on every
thread, their 1-thread figures recorded beside them: ``peaks_gflops``, ``read_probe``); with
--memory, the peak resident memory the call adds (each variant in its own process, one per CPU at a time) and
the activation bytes.
`vs base` and `vs f32` are ratios of medians; `vs peer` is paired by round (tools/timing.py: paired, the peer's
time over the variant's in the same round, median; p10 and p90 in the JSON beside `paired_vs_baseline`), which
a slow phase of the host slows alike.

Usage: ms-swiglu bench [--preset llama-7b] [--tokens 1 16 128 512] [--dtype float32] [--jit O0 O1]
                       [--variants ...] [--rounds 7] [--settle S] [--memory] [--json F] [--plot F.png]
"""
import datetime
import functools
import os
import subprocess
import sys
import threading
import time

import numpy as np

from ms_swiglu.config import DTYPE_NAMES, PRESETS
from ms_swiglu.errors import ArgumentParser, InputError
from ms_swiglu.outputs import OutputSet, check_writable
from ms_swiglu.processes import scratch_cwd
from ms_swiglu.progress import progress
from ms_swiglu.runner import check_fits
from ms_swiglu.tools.probes import (Ceiling, ProbeError, add, graph_call, host_probes, machine_line, peaks,
                                    read_rates, read_sum)
from ms_swiglu.tools.timing import (DISTURBED, SETTLE_S, SLOW_CALLS, HostSpeed, add_settle_option, interleave,
                                    paired, probe_process, proc_status, reset_peak_memory, watched, write_json)

SIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def variants():
    """``{variant: backend}``: the baseline (no backend: three Dense) and the packed MLP on every backend that
    runs on this machine's CPU."""
    from ms_swiglu import backends  # noqa: PLC0415

    packed = {f"packed-{name}": backends.get(name) for name in backends.REGISTRY}
    return {"baseline": None, **{v: b for v, b in packed.items() if b.runs_on("CPU")}}


def activation_bytes(backend, n, hidden, inter, dtype):
    """Bytes of the intermediate tensors one call materialises (GEMM outputs, activation, copies); backend None:
    the baseline (and the torch peer): gate, up, silu(gate), product, out."""
    if backend is None:
        return (4 * n * inter + n * hidden) * SIZE[dtype]
    return backend.facts.activation_bytes(n, hidden, inter, SIZE[dtype])


def _build(variant, hidden, inter, dtype, jit, layers=1, blocks=0):
    """The variant as a chain of `layers` MLPs with distinct weights (layers > 1: weights larger than the
    L3 cache, as in a real model, where no layer's weights are still cached when it runs again); with `blocks`,
    instead a stack of that many FFN blocks (RMSNorm -> MLP -> residual), as the MLP runs in a decoder."""
    import mindspore as ms  # noqa: PLC0415
    from mindspore import nn  # noqa: PLC0415

    from ms_swiglu import FFNBlock, FFNStack, SwiGLUMLP, to_packed  # noqa: PLC0415

    backend = variants()[variant]
    mlps = []
    for seed in range(blocks or layers):
        ms.set_seed(seed)
        base = SwiGLUMLP(hidden, inter, dtype=dtype)
        mlps.append(base if backend is None else to_packed(base, backend=backend))
    if blocks:
        # a packed MLP brings its backend's norm and residual add; the baseline keeps MindSpore's own ops
        net = FFNStack([FFNBlock(hidden, inter, dtype=getattr(ms, dtype), mlp=mlp, backend="composite")
                        for mlp in mlps])
    else:
        net = mlps[0] if layers == 1 else nn.SequentialCell(mlps)
    if jit == "O1":
        net.set_jit_config(ms.JitConfig(jit_level="O1"))
    if backend is None or backend.dynamic_shapes:
        net.set_inputs(ms.Tensor(shape=[None, hidden], dtype=getattr(ms, dtype)))
    return net


def _threads(fn, parts):
    ts = [threading.Thread(target=fn, args=p) for p in parts]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def bandwidth(rounds=5, settle=SETTLE_S):
    """(read GB/s, 2-read-1-write GB/s), the best probe, over arrays far larger than the L3."""

    big = np.ones(READ_PROBE_FLOATS, np.float32)
    a, b = np.ones(64 * 2**20, np.float32), np.ones(64 * 2**20, np.float32)
    c = np.empty_like(a)
    half, q = big.size // 2, a.size // 2
    variants = {
        "read x1": lambda: big.sum(),
        "read x2": lambda: _threads(lambda i, j: big[i:j].sum(), [(0, half), (half, big.size)]),
        "add x1": lambda: np.add(a, b, out=c),
        "add x2": lambda: _threads(lambda i, j: np.add(a[i:j], b[i:j], out=c[i:j]), [(0, q), (q, a.size)]),
        "read omp": lambda: read_sum(big),
        "add omp": lambda: add(a, b, c),
    }
    st = interleave(variants, rounds, warmup=1, settle=settle)
    read = big.nbytes / min(st[k]["min_s"] for k in ("read x1", "read x2", "read omp")) / 1e9
    rw = 3 * a.nbytes / min(st[k]["min_s"] for k in ("add x1", "add x2", "add omp")) / 1e9
    return read, rw


READ_PROBE_FLOATS = 256 * 2**20  # 1 GiB: 3.4x the largest L3 measured on (300 MiB)


def as_dtype(x32, dtype):
    """A float32 NumPy array in ``dtype`` as the library takes it (bfloat16 as uint16 bits, rounded to nearest)."""
    if dtype == "bfloat16":
        bits = x32.view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return x32.astype(dtype)


def ceiling_calls(hidden, inter, dtypes, peers, read_array=None):
    """A factory of the ceiling probes at N tokens, interleaved with the variants: per dtype the GEMM
    [N,H]x[H,2I] by the package's library (its oneDNN or skinny path, no epilogue) and by PyTorch's peer (its
    oneDNN, when there is a peer); in float32 also by MindSpore's MatMul and NumPy; at N=1 the streaming read of
    1 GiB (``read_array()``: the array, allocated at the first call), so that the decode fraction compares calls
    from the same rounds; and MindSpore's cost of one graph call (``x + 1`` on one element), which every variant's
    call pays and the library's GEMM, called directly, does not."""
    import mindspore as ms  # noqa: PLC0415
    from mindspore import nn, ops  # noqa: PLC0415

    from ms_swiglu.backends.cpu import kernels  # noqa: PLC0415

    class MatMul(nn.Cell):
        def __init__(self, w):
            super().__init__()
            self.w, self.mm = ms.Parameter(ms.Tensor(w), name="w"), ops.MatMul(transpose_b=True)

        def construct(self, x):
            return self.mm(x, self.w)

    w32 = np.random.default_rng(0).standard_normal((2 * inter, hidden)).astype(np.float32)
    ws = {d: as_dtype(w32, d) for d in dtypes}
    cell, wt = (MatMul(w32), np.ascontiguousarray(w32.T)) if "float32" in dtypes else (None, None)
    read_array = read_array or functools.cache(lambda: np.ones(READ_PROBE_FLOATS, np.float32))
    add_one = graph_call()

    def library(x, w, out, dtype):
        return lambda: kernels.linear(x, w, out, dtype)

    def calls(n):
        x32 = np.random.default_rng(n).standard_normal((n, hidden)).astype(np.float32)
        probes = {"graph call/mindspore": add_one}
        for d in dtypes:
            x, out = as_dtype(x32, d), as_dtype(np.zeros((n, 2 * inter), np.float32), d)
            probes[f"ceiling/library/{d}"] = library(x, ws[d], out, d)
            if d in peers:
                probes[f"ceiling/torch/{d}"] = peers[d].gemm
        if cell is not None:
            xt = ms.Tensor(x32)
            probes["ceiling/mindspore/float32"] = lambda: cell(xt)
            probes["ceiling/numpy/float32"] = lambda: x32 @ wt
        if n == 1:
            big = read_array()
            probes["read/omp"] = lambda: read_sum(big)
        return probes

    return calls


PROBES_AT_ONCE = len(os.sched_getaffinity(0))  # memory probe processes


def memory_probe(variant, hidden, inter, dtype, n, jit="O0"):
    """In a fresh process: the peak resident bytes one call at N tokens adds (the graph built at ``jit``), after
    compiling at N=1."""
    import mindspore as ms  # noqa: PLC0415

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    net = _build(variant, hidden, inter, dtype, jit)
    x1 = ms.Tensor(np.ones((1, hidden), np.float32)).astype(getattr(ms, dtype))
    xn = ms.Tensor(np.ones((n, hidden), np.float32)).astype(getattr(ms, dtype))
    if variants()[variant] is None or variants()[variant].dynamic_shapes:
        net(x1)
    x = xn  # built before the reset: the input is not an activation
    rss0 = reset_peak_memory()
    net(x)
    return proc_status("VmHWM") - rss0


def _memories(args, names, hidden, inter, dtype, n):
    """With --memory, ``{variant: memory_probe(...)}`` for the package's variants among ``names``, one process
    each, as many at once as there are CPUs (after the timed rounds; each process's peak is its own)."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    def probe(v):
        return int(probe_process("ms_swiglu.tools.bench_mlp", [v, hidden, inter, dtype, n, args.jit[0]],
                                 f"memory probe {v} N={n}", timeout=1800))

    names = [v for v in names if args.memory and v in variants()]
    with ThreadPoolExecutor(PROBES_AT_ONCE) as pool:
        return dict(zip(names, pool.map(probe, names)))


class TorchPeer:
    """tools/torch_peer.py under another interpreter; ``tokens(n)``, then ``run()`` (the MLP layers), ``model()``
    (the FFN blocks) or ``gemm()`` (one [N,H]x[H,2I] matmul) per call."""

    def __init__(self, python, hidden, inter, dtype, layers, blocks=0):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_peer.py")
        # MindSpore setenv()s OMP_NUM_THREADS=1 in C, which a child would inherit: give the peer every core
        env = dict(os.environ, OMP_NUM_THREADS=str(os.cpu_count()))
        self.proc = subprocess.Popen([python, "-I", script, str(hidden), str(inter), dtype, str(layers), str(blocks)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.banner = self._ask(None)

    def _ask(self, line):
        if line is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        if not reply or reply.startswith("error"):
            raise RuntimeError(f"torch peer: expected a reply, got {reply!r} (exit {self.proc.poll()})")
        return reply

    def tokens(self, n):
        self._ask(f"tokens {n}")

    def run(self):
        self._ask("run")

    def model(self):
        self._ask("model")

    def gemm(self):
        self._ask("gemm")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def peak_for(dtype, peaks):
    """The compute peak a dtype's GEMM can reach here: for bfloat16 AMX, else AVX512-BF16 dot products, where the
    CPU has them; else (and for float16, which runs as float32 FMAs over widened weights) the float32 FMA peak."""
    if dtype == "bfloat16":
        return peaks["amx_bfloat16"] or peaks["avx512_bfloat16"] or peaks["fma_float32"]
    return peaks["fma_float32"]


def run(args):
    import mindspore as ms  # noqa: PLC0415

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    print(machine_line())
    read_bw, rw_bw = bandwidth(settle=args.settle)
    read_array = functools.cache(lambda: np.ones(READ_PROBE_FLOATS, np.float32))  # 1 GiB, shared by the read probes
    try:
        peaks, read_probe, unmeasured = probe_peaks(), read_rates(read_array()), None
    except ProbeError as e:  # a busy host: the times and ratios stand, no figure is given as a fraction of a ceiling
        peaks, read_probe, unmeasured = None, None, str(e)
        print(f"ceilings: not measured ({e}): no fraction of a ceiling is given")
    if peaks:
        one = peaks["one_thread"]
        rp, one = read_probe, peaks["one_thread"]
        print(f"ceilings: read {read_bw:.1f} GB/s, 2-read-1-write {rw_bw:.1f} GB/s (best of NumPy and the threaded "
              f"probes); the read probe on {rp['threads']} threads {rp['all_threads']:.1f} GB/s, on one "
              f"{rp['one_thread']:.1f} ({rp['scaling']:.2f}x: the memory bounds it); peaks (in-register loops on "
              f"{peaks['threads']} threads, each checked against one thread's; GFLOP/s, 0: not on this CPU): FMA "
              f"float32 {peaks['fma_float32']:.0f} (one thread {one['fma_float32']:.0f}), AVX512-BF16 "
              f"{peaks['avx512_bfloat16'] or 0:.0f} ({one['avx512_bfloat16'] or 0:.0f}), AMX bfloat16 "
              f"{peaks['amx_bfloat16'] or 0:.0f} ({one['amx_bfloat16'] or 0:.0f})")
    results, total, done, host = [], len(args.preset) * len(args.tokens), 0, HostSpeed(host_probes())
    peaks_again = functools.cache(probe_peaks)  # a figure above a peak: the peaks measured again, once per run
    kinds = ("mlp", "model") if args.model_blocks else ("mlp",)
    for preset in args.preset:
        hidden, inter = PRESETS[preset]
        nets = {(v, j, d, k): _build(v, hidden, inter, d, j, args.layers, args.model_blocks if k == "model" else 0)
                for d in args.dtype for v in args.variants for j in args.jit for k in kinds}
        peers = {d: TorchPeer(args.peer_python, hidden, inter, d, args.layers, args.model_blocks)
                 for d in args.dtype} if args.peer_python else {}
        ceiling = ceiling_calls(hidden, inter, args.dtype, peers, read_array)

        def gemm_again(n, dtype):
            """The best GEMM's GFLOP/s at N tokens in ``dtype``, its calls measured again: the best of 3 rounds."""
            calls = {k: c for k, c in ceiling(n).items() if k.startswith("ceiling/") and k.endswith("/" + dtype)}
            stats = interleave(calls, 3, warmup=1, settle=args.settle)
            return max(4 * n * hidden * inter / st["min_s"] / 1e9 for st in stats.values())

        remeasure = {"peak": lambda dtype: peak_for(dtype, peaks_again()), "gemm": gemm_again,
                     "read": lambda: read_rates(read_array())["all_threads"]}
        for peer in peers.values():
            print(f"peer: {peer.banner}")
        for n in args.tokens:
            x32 = np.random.default_rng(n).standard_normal((n, hidden)).astype(np.float32)
            xs = {d: ms.Tensor(x32).astype(getattr(ms, d)) for d in args.dtype}
            calls = {(v, j, d, k): (lambda net=net, x=xs[d]: net(x)) for (v, j, d, k), net in nets.items()}
            for d, peer in peers.items():
                peer.tokens(n)
                calls[("peer-torch", "eager", d, "mlp")] = peer.run
                if args.model_blocks:
                    calls[("peer-torch", "eager", d, "model")] = peer.model
            named = {"/".join(key): call for key, call in calls.items()}
            stats, disturbance = watched({**named, **ceiling(n)}, args.rounds,
                                         pids=[p.proc.pid for p in peers.values()], retries=args.retries, host=host,
                                         settle=args.settle)
            for dtype in args.dtype:
                cell = _cell(args, preset, dtype, n, stats, disturbance, peaks, read_bw, rw_bw, list(calls),
                             remeasure)
                results.append(cell)
                _print_cell(cell)
            done += 1
            progress("bench", done, total, "token counts")
        for peer in peers.values():
            peer.close()
    return {"read_gbps": read_bw, "rw_gbps": rw_bw, "peaks_gflops": peaks, "read_probe": read_probe,
            "ceilings_unmeasured": unmeasured, "disturbed_above": DISTURBED, "slow_calls_above": SLOW_CALLS,
            "host_probe_best": host.best, "results": results}


def _cell(args, preset, dtype, n, stats, disturbance, peaks, read_bw, rw_bw, keys, remeasure=None):
    """One (preset, dtype, N) of the report from the interleaved rounds' ``stats``. Its fractions, of the compute
    peak and of the read probe (N=1) or the best GEMM (N > 1), are :class:`Ceiling` s': a figure above its ceiling
    has it measured again by ``remeasure`` (``{"peak": f(dtype), "read": f(), "gemm": f(n, dtype)}``, each giving
    the ceiling's new value; None: not measured again) and refuses the run (CeilingError) if still above it."""
    hidden, inter = PRESETS[preset]
    gemm_flops = 4 * n * hidden * inter
    ceil = {k.split("/")[1]: gemm_flops / st["min_s"] / 1e9 for k, st in stats.items()
            if k.startswith("ceiling/") and k.endswith("/" + dtype)}
    ceil_median = max(gemm_flops / st["median_s"] / 1e9 for k, st in stats.items()
                      if k.startswith("ceiling/") and k.endswith("/" + dtype))
    best_gemm, peak = max(ceil.values()), peak_for(dtype, peaks) if peaks else None
    read = stats.get("read/omp")  # N=1: the read probe from the same rounds
    read_loop = {"median": 4 * READ_PROBE_FLOATS / read["median_s"] / 1e9,
                 "best": 4 * READ_PROBE_FLOATS / read["min_s"] / 1e9} if read else None
    cell = {"preset": preset, "dtype": dtype, "tokens": n, "hidden": hidden, "inter": inter,
            "gemm_ceiling_gflops": ceil, "gemm_ceiling_median_gflops": ceil_median, "peak_gflops": peak,
            "read_gbps": read_bw, "rw_gbps": rw_bw, "read_gbps_in_rounds": read_loop, "disturbance": disturbance,
            "variants": {}, "in_model": {},
            "graph_call_ms": {k: stats["graph call/mindspore"][f"{k}_s"] * 1e3 for k in ("median", "min")}}
    memory = _memories(args, [v for (v, j, d, kind) in keys if d == dtype and kind != "model" and j == args.jit[0]],
                       hidden, inter, dtype, n)
    figures, labelled = {"peak": {}, "median": {}, "best": {}}, []  # per ceiling {label: figure}; (entry, label)
    for (v, j, d, kind) in keys:
        if d != dtype:
            continue
        depth = args.model_blocks if kind == "model" else args.layers
        key = f"{v}/{j}/{d}/{kind}"
        st = stats[key]
        base_key, peer_key = f"baseline/{args.jit[0]}/{d}/{kind}", f"peer-torch/eager/{d}/{kind}"
        base = stats.get(base_key)
        f32 = stats.get(f"{v}/{j}/float32/{kind}")
        flops = 6 * n * hidden * inter * depth
        gflops = flops / st["median_s"] / 1e9
        entry = dict(st, gflops=gflops, activation_bytes=activation_bytes(variants().get(v), n, hidden, inter, d),
                     speedup_vs_baseline=base["median_s"] / st["median_s"] if base else None,
                     speedup_vs_float32=f32["median_s"] / st["median_s"] if f32 else None,
                     paired_vs_baseline=paired(stats, base_key, key) if base else None,
                     paired_vs_peer=paired(stats, peer_key, key) if peer_key in stats else None)
        label = f"{preset} {v}/{j} {d} N={n}" + (" in a model" if kind == "model" else "")
        figures["peak"][label] = gflops
        if n == 1:  # median against the probe's median in the same rounds, best against best
            weight_bytes = 3 * hidden * inter * SIZE[d] * depth
            entry["weight_gbps"] = weight_bytes / st["median_s"] / 1e9
            figures["median"][label], figures["best"][label] = entry["weight_gbps"], weight_bytes / st["min_s"] / 1e9
        else:  # median against the ceiling's median, and the best call against the best ceiling
            figures["median"][label], figures["best"][label] = gflops, flops / st["min_s"] / 1e9
        labelled.append((entry, label))
        if kind == "model":
            entry["per_block_ms"] = st["median_s"] * 1e3 / depth
            cell["in_model"][f"{v}/{j}"] = entry
        else:
            if j == args.jit[0] and v in memory:
                entry["peak_added_bytes"] = memory[v]
            cell["variants"][f"{v}/{j}"] = entry
    if peaks is None:  # the probes found the host busy: no ceiling counts, so no fraction is given
        for entry, _ in labelled:
            entry["fraction_of_ceiling"] = entry["fraction_of_ceiling_min"] = entry["fraction_of_peak"] = None
        cell["remeasured"] = {}
        return cell
    remeasure = remeasure or {}

    def again(kind, *args):  # the ceiling measured again, once for the median's and the best's
        return functools.cache(lambda: remeasure[kind](*args)) if kind in remeasure else None

    if n == 1:
        probe = again("read")
        ceilings = {"median": Ceiling("read probe's median in the same rounds", read_loop["median"], "GB/s", probe),
                    "best": Ceiling("read probe's best in the same rounds", read_loop["best"], "GB/s", probe)}
    else:
        gemm = again("gemm", n, dtype)
        ceilings = {"median": Ceiling(f"best {dtype} GEMM's median in the same rounds", ceil_median, "GFLOP/s", gemm),
                    "best": Ceiling(f"best {dtype} GEMM's best in the same rounds", best_gemm, "GFLOP/s", gemm)}
    ceilings["peak"] = Ceiling(f"compute peak of {dtype}", peak, "GFLOP/s", again("peak", dtype))
    fractions = {k: c.fractions(figures[k]) for k, c in ceilings.items()}
    for entry, label in labelled:
        entry["fraction_of_ceiling"], entry["fraction_of_ceiling_min"], entry["fraction_of_peak"] = (
            fractions[k][label] for k in ("median", "best", "peak"))
    cell["peak_gflops"] = ceilings["peak"].value
    cell["remeasured"] = {c.name: c.record() for c in ceilings.values() if c.record()}
    return cell


def probe_peaks():
    """The machine's compute peaks (tools/probes.py: peaks, checked on every thread), measured in a fresh process;
    ProbeError where they could not be."""
    import json  # noqa: PLC0415

    try:
        return json.loads(probe_process("ms_swiglu.tools.bench_mlp", ["peaks"], "peak probe process", timeout=300))
    except RuntimeError as e:
        raise ProbeError(str(e)) from None


def _print_cell(cell):
    ceil = cell["gemm_ceiling_gflops"]
    read = cell["read_gbps_in_rounds"]
    read = f"; read {read['median']:.1f} GB/s (best {read['best']:.1f}) in the same rounds" if read else ""
    dist = cell["disturbance"]
    flag = "\n  DISTURBED: the ratios below are not reliable" if dist["flagged"] else ""
    gemms = ", ".join(f"{k} {v:.0f}" for k, v in ceil.items())
    graph = cell["graph_call_ms"]
    peak = "-" if cell["peak_gflops"] is None else f"{cell['peak_gflops']:.0f}"
    print(f"\n{cell['preset']} {cell['dtype']} N={cell['tokens']}: GEMM ceiling {gemms} GFLOP/s, peak "
          f"{peak}{read}\n  MindSpore's cost of one graph call (x + 1, one element) in the same "
          f"rounds: {graph['median']:.2f} ms (min {graph['min']:.2f}); every variant's call pays it once\n"
          f"  disturbance {dist['fraction']:.1%} of the CPU time (other processes "
          f"{dist['other_cpu_s']:.2f} s, steal {dist['steal_s']:.2f} s over {dist['wall_s']:.1f} s), "
          f"{dist['slow_calls']:.0%} of the calls in a slow phase of the host; attempt {dist['attempts']}{flag}")
    print(f"  {'variant':<28} {'median ms':>10} {'min ms':>9} {'spread':>7} {'GFLOP/s':>8} {'vs base':>8} "
          f"{'vs f32':>7} {'vs peer':>8} {'of ceil':>8} {'of peak':>8} {'act MB':>8} {'peak MB':>8}")
    rows = [(k, e) for k, e in cell["variants"].items()]
    rows += [(f"{k} in model", e) for k, e in cell["in_model"].items()]
    for key, e in rows:
        peak = f"{e['peak_added_bytes'] / 2**20:8.1f}" if "peak_added_bytes" in e else f"{'-':>8}"
        vs = f"{e['speedup_vs_baseline']:7.2f}x" if e["speedup_vs_baseline"] else f"{'-':>8}"
        vf = f"{e['speedup_vs_float32']:6.2f}x" if e["speedup_vs_float32"] else f"{'-':>7}"
        vp = f"{e['paired_vs_peer']['median']:7.2f}x" if e["paired_vs_peer"] else f"{'-':>8}"
        print(f"  {key:<28} {e['median_s'] * 1e3:10.2f} {e['min_s'] * 1e3:9.2f} {e['spread']:7.2f} "
              f"{e['gflops']:8.1f} {vs} {vf} {vp} {_fraction(e['fraction_of_ceiling'], 0)} "
              f"{_fraction(e['fraction_of_peak'], 1)} "
              f"{e['activation_bytes'] / 2**20:8.1f} {peak}", flush=True)
    key, e = max(rows, key=lambda row: abs(row[1]["order_effect"]))
    print(f"  order effect: reversed / forward rounds' median at most {e['order_effect']:+.1%} ({key})")


def _fraction(v, digits):
    return f"{'-':>8}" if v is None else f"{v:8.{digits}%}"


def plot(data, path, force=False):
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator  # noqa: PLC0415

    groups = sorted({(c["preset"], c["dtype"]) for c in data["results"]})
    fig, axes = plt.subplots(len(groups), 2, figsize=(12, 4 * len(groups)), squeeze=False)
    for row, (preset, dtype) in enumerate(groups):
        cells = [c for c in data["results"] if (c["preset"], c["dtype"]) == (preset, dtype)]
        ns = [c["tokens"] for c in cells]
        for key in cells[0]["variants"]:
            axes[row][0].plot(ns, [c["variants"][key]["gflops"] for c in cells], marker="o", label=key)
            axes[row][1].plot(ns, [c["variants"][key]["activation_bytes"] / 2**20 for c in cells], marker="o",
                              label=key + " (activations)")
            if "peak_added_bytes" in cells[0]["variants"][key]:
                axes[row][1].plot(ns, [c["variants"][key]["peak_added_bytes"] / 2**20 for c in cells], ls="--",
                                  marker="x", label=key + " (peak added)")
        for key in cells[0]["in_model"]:
            axes[row][0].plot(ns, [c["in_model"][key]["gflops"] for c in cells], ls=":", marker="s",
                              label=key + " in a model")
        axes[row][0].plot(ns, [max(c["gemm_ceiling_gflops"].values()) for c in cells], "k--", label="GEMM ceiling")
        if all(c["peak_gflops"] for c in cells):
            axes[row][0].plot(ns, [c["peak_gflops"] for c in cells], "k:", label="compute peak")
        axes[row][0].set(xscale="log", yscale="log", xlabel="tokens N", ylabel="GFLOP/s",
                         title=f"{preset} {dtype}: throughput")
        axes[row][1].set(xscale="log", yscale="log", xlabel="tokens N", ylabel="MiB", title="memory")
        for ax in axes[row]:  # ticks at the measured N only: log-scale minor labels overlap
            ax.xaxis.set_major_locator(FixedLocator(ns))
            ax.xaxis.set_major_formatter(FixedFormatter([str(n) for n in ns]))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.legend(fontsize=7)
    fig.tight_layout()
    with OutputSet([path], force) as out:
        out.write(out.paths[0], lambda tmp: fig.savefig(tmp, dpi=80, format="png"))
        out.commit()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["--probe", "peaks"]:
        import json  # noqa: PLC0415

        try:
            print(json.dumps(peaks()))
        except ProbeError as e:  # its message as the last line, for the parent's error
            print(e, file=sys.stderr)
            return 1
        return 0
    if argv and argv[0] == "--probe":
        variant, hidden, inter, dtype, n, jit = argv[1:]
        print(memory_probe(variant, int(hidden), int(inter), dtype, int(n), jit))
        return 0
    parser = ArgumentParser(prog="ms-swiglu bench", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", nargs="+", default=["llama-7b"], choices=sorted(PRESETS))
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 16, 128, 512])
    parser.add_argument("--dtype", nargs="+", default=["float32"], choices=DTYPE_NAMES)
    parser.add_argument("--variants", nargs="+", default=list(variants()), choices=list(variants()))
    parser.add_argument("--jit", nargs="+", default=["O0"], choices=("O0", "O1"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--layers", type=int, default=1,
                        help="chain this many MLPs with distinct weights per call (> 1: cold caches, as in a model)")
    parser.add_argument("--model-blocks", type=int, default=0,
                        help="also time each variant in a model: this many FFN blocks (RMSNorm -> MLP -> residual)")
    parser.add_argument("--retries", type=int, default=2,
                        help=f"re-run a token count this often while other processes take > {DISTURBED * 100:.0f}%% of the CPU "
                             f"or > {SLOW_CALLS * 100:.0f}%% of its calls run in a slow phase of the host")
    add_settle_option(parser)
    parser.add_argument("--peer-python", help="an interpreter with torch: adds HF LlamaMLP in PyTorch as a peer")
    parser.add_argument("--memory", action="store_true", help="peak memory per variant, each in its own process")
    parser.add_argument("--json")
    parser.add_argument("--plot")
    parser.add_argument("--force", action="store_true", help="replace an existing --json / --plot")
    args = parser.parse_args(argv)
    _check(args)
    args.json, args.plot = (os.path.abspath(p) if p else p for p in (args.json, args.plot))
    t0 = time.time()
    started = datetime.datetime.fromtimestamp(t0, datetime.timezone.utc).isoformat(timespec="seconds")
    with scratch_cwd():  # AKG writes its kernels into the working directory
        try:
            data = run(args)
        except ProbeError as e:  # a ceiling not measured, or a figure above it: no report rather than a wrong one
            print(f"ms-swiglu bench: refused: {e}", file=sys.stderr)
            return 1
    data["args"] = vars(args)
    data["seconds"] = time.time() - t0
    data["date"] = started  # when the run started, UTC (tools/docs.py keeps the latest run per machine kind)
    if args.json:
        write_json(args.json, data, args.force)
    if args.plot:
        plot(data, args.plot, args.force)
    return 0


def _check(args):
    """Every argument before any work: counts, the peer, the outputs, and the weights against the memory."""
    for name, low in (("tokens", 1), ("rounds", 1), ("layers", 1), ("model_blocks", 0), ("retries", 0)):
        values = getattr(args, name)
        for value in values if isinstance(values, list) else [values]:
            if value < low:
                raise InputError(f"--{name.replace('_', '-')}: expected integers >= {low}, got {value}")
    if args.peer_python and not (os.path.isfile(args.peer_python) and os.access(args.peer_python, os.X_OK)):
        raise InputError(f"--peer-python: expected an executable Python, got {args.peer_python!r}")
    for path in (args.json, args.plot):
        if path:
            check_writable(path, args.force)
    hidden, inter = max(PRESETS[p] for p in args.preset)
    depth = args.layers + args.model_blocks  # MLPs per variant and dtype; the peer holds as many, the ceiling one
    per_dtype = 3 * hidden * inter * depth * (len(args.variants) * len(args.jit) + bool(args.peer_python))
    weights = sum(SIZE[d] * (per_dtype + 2 * hidden * inter * (1 + bool(args.peer_python))) for d in args.dtype)
    probes = PROBES_AT_ONCE * 3 * hidden * inter * max(SIZE[d] for d in args.dtype) if args.memory else 0
    check_fits("bench", weights + probes + 4 * max(args.tokens) * (2 * hidden + 3 * inter) * 3)


if __name__ == "__main__":
    sys.exit(main())
