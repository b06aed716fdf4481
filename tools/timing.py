"""Interleaved timing: every variant once per round, so that the machine's drift (20-40% here) hits all alike."""
import argparse
import statistics
import time


class CPUClock:
    """CPU time of the machine (busy, steal) and of the processes ``pids`` (this one by default), from /proc."""

    def __init__(self, pids=()):
        import os  # noqa: PLC0415

        self.pids = [os.getpid(), *pids]
        self.hz, self.cpus = os.sysconf("SC_CLK_TCK"), len(os.sched_getaffinity(0))

    def read(self):
        import time  # noqa: PLC0415

        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]  # user nice system idle iowait irq softirq steal ...
        own = 0
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                own += int(fields[11]) + int(fields[12])  # utime, stime (every thread)
            except OSError:
                pass
        return time.perf_counter(), v[0] + v[1] + v[2] + v[5] + v[6], v[7], own

    def disturbance(self, before, after):
        """``{"other_cpu_s", "steal_s", "wall_s", "fraction"}`` between two reads: the CPU time other processes and
        the hypervisor took, and its fraction of the machine's CPU time."""
        wall = after[0] - before[0]
        other = max(0, (after[1] - before[1]) - (after[3] - before[3])) / self.hz
        steal = (after[2] - before[2]) / self.hz
        return {"other_cpu_s": other, "steal_s": steal, "wall_s": wall,
                "fraction": (other + steal) / max(wall * self.cpus, 1e-9)}


# A cell is flagged when other processes and the hypervisor took more than this fraction of the machine's CPU
# time during its rounds: a load of x% preempts the kernels' threads for about x% of the time, and the ratios
# the benchmarks report differ by 5-15%, so a cell above 5% cannot carry them.
DISTURBED = 0.05

# Seconds between the end of one timed call and the start of the next. Libraries' worker threads keep spinning
# after a call and take the cores from whatever runs next: PyTorch's OpenMP threads for ~20 ms (the cpu MLP at
# N=16, bfloat16: 13.1-19.1 ms right after a torch call, 8.8-9.2 ms 20 ms later or after itself), NumPy's OpenBLAS
# threads for 2^28 cycles (the read probe right after NumPy's matmul: 46-51 ms, 32.7 ms 0.12 s later, 24.5 ms
# 0.3 s later). The pause is busy (:func:`pause`): a machine left idle for 0.2 s runs the next call slower, and
# not every call alike (AMD EPYC host, 3 llama-7b MLPs at one token, bfloat16 x, interleaved with the read probe,
# one process per run: int8 weights 23.3-26.2 ms after a 0.2 s sleep (4 runs) against 17.3-18.8 after a 0.02 or
# 0.05 s sleep or a 0.2 s busy pause (2 runs each), bfloat16 weights 37.4-40.5 ms against 29.1-32.6; through the
# graph, bench_quant, two consecutive runs: int8 23.3 ms after a sleep, 17.0 after a busy pause, bfloat16 31.4 and
# 32.0); at 16 tokens the kind of pause made no difference (bfloat16 weights 47.2 / 48.1 ms after a busy pause,
# 48.9 / 46.9 after a sleep).
SETTLE_S = 0.2


def add_settle_option(parser):
    """A benchmark's ``--settle S``: the pause before each timed call, 0 to 60 seconds (``SETTLE_S`` by default)."""

    def seconds(text):
        try:
            value = float(text)
        except ValueError:
            value = None
        if value is None or not 0 <= value <= 60:  # (NaN fails the comparison too)
            raise argparse.ArgumentTypeError(f"expected seconds in [0, 60], got {text!r}")
        return value

    parser.add_argument("--settle", type=seconds, default=SETTLE_S,
                        help=f"seconds of busy pause before each timed call (default {SETTLE_S}: other libraries' "
                             f"threads stop spinning; 0: back to back)")


def pause(seconds):
    """Wait ``seconds`` spinning on this thread (one core; the others stay free for the threads still spinning)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# A call ran in a slow phase of the host when a probe sampled just before it ran below this fraction of the best
# rate the run has seen. This host has phases that /proc cannot show (no steal, no other process): the AMX loop
# (tools/probes.py) at 4100-4600 GFLOP/s in normal phases and 1800-3200 in slow ones, the read probe at 38-45 GB/s
# against 12-34, switching within seconds to minutes, while the FMA loop stays at 260-340 in both; a normal phase
# varies by 6-8%.
SLOW_HOST = 0.8
# A cell is flagged when more than this fraction of its calls ran in a slow phase: a median over 9 rounds or more
# stays within a few percent while at most one call in ten is slowed (2x here), and the ratios differ by 5-15%.
SLOW_CALLS = 0.1


class HostSpeed:
    """What /proc cannot see: the host's own speed, sampled by ``probes`` ({name: callable returning a rate,
    higher = faster}) before every timed call (after its pause). A sample's speed is its slowest probe's rate over
    the best rate that probe has given this object at least ``BEST_OF`` times by the end of the cell's rounds, so
    one object per benchmark run judges each cell by the run's best so far, and a lone outlier does not: on an AMD EPYC host the 512 MiB read probe gave 29-35 GB/s in 40
    idle samples and once 62 GB/s in a bench run, against which 88-95% of every cell's calls counted as slow."""

    BEST_OF = 3

    def __init__(self, probes):
        self.probes, self._top = dict(probes), {}

    @property
    def best(self):
        """{name: the BEST_OF-th highest rate so far (the lowest one while there are fewer)}"""
        return {name: top[-1] for name, top in self._top.items()}

    def sample(self):
        rates = {name: probe() for name, probe in self.probes.items()}
        for name, rate in rates.items():
            self._top[name] = sorted([*self._top.get(name, []), rate], reverse=True)[:self.BEST_OF]
        return rates

    def speed(self, rates):
        return min(rate / self.best[name] for name, rate in rates.items())


def watched(variants, rounds, pids=(), retries=2, warmup=3, host=None, settle=SETTLE_S):
    """:func:`interleave` with the disturbance of its rounds measured: the CPU time of other processes and of the
    hypervisor (:class:`CPUClock`) and, with ``host`` (:class:`HostSpeed`), the fraction of calls that ran in a
    slow phase of the host (``slow_calls``); ``settle`` as for :func:`interleave`. A flagged run is repeated up to
    ``retries`` times and the least disturbed kept. Returns (stats, disturbance), the latter with the number of
    attempts made and whether the kept one is still flagged."""
    clock, best = CPUClock(pids), None
    for attempt in range(retries + 1):
        for call in variants.values():  # the warm-up stays out of the accounting
            for _ in range(warmup):
                call()
        before = clock.read()
        stats = interleave(variants, rounds, warmup=0, settle=settle, host=host)
        dist = clock.disturbance(before, clock.read())
        if host:
            dist["slow_calls"] = sum(s["slow_calls"] for s in stats.values()) / (rounds * len(variants))
        # the worse of the two measures, each against its own threshold: above 1 is flagged
        score = max(dist["fraction"] / DISTURBED, dist.get("slow_calls", 0.0) / SLOW_CALLS)
        if best is None or score < best[2]:
            best = (stats, dist, score)
        if score <= 1:
            break
    best[1].update(attempts=attempt + 1, flagged=best[2] > 1)
    return best[:2]


def interleave(variants, rounds, warmup=3, settle=SETTLE_S, host=None):
    """``{name: {"min_s", "median_s", "spread", "order_effect", "times_s"}}`` for ``{name: callable}``; spread =
    (p90 - p10) / median; times_s: the calls' times by round (for :func:`paired`). Each timed call starts after a
    busy pause of ``settle`` seconds (:func:`pause`). Odd rounds run the variants in reverse, so each one follows
    both of its neighbours: order_effect = median over reversed rounds / median over forward rounds - 1 says
    whether a time still depends on what ran before it (0 with fewer than two rounds).
    With ``host`` (:class:`HostSpeed`), sampled after each call's pause, also ``slow_calls``: the calls that ran
    in a slow phase of the host (below ``SLOW_HOST`` of the best rate seen by the end of the rounds)."""
    for call in variants.values():  # compile and warm up
        for _ in range(warmup):
            call()
    names = list(variants)
    times, samples = {name: [] for name in names}, {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            if settle:
                pause(settle)
            if host:  # after the pause: the previous call's library threads (OpenBLAS, torch) spin until then
                samples[name].append(host.sample())
            t0 = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - t0)
    stats = {}
    for name, rounds_s in times.items():
        fwd, rev = rounds_s[0::2], rounds_s[1::2]
        ts = sorted(rounds_s)
        med = statistics.median(ts)
        stats[name] = {"min_s": ts[0], "median_s": med, "spread": (_percentile(ts, 0.9) - _percentile(ts, 0.1)) / med,
                       "order_effect": statistics.median(rev) / statistics.median(fwd) - 1 if rev else 0.0,
                       "times_s": rounds_s}
        if host:
            stats[name]["slow_calls"] = sum(host.speed(rates) < SLOW_HOST for rates in samples[name])
    return stats


def _percentile(ascending, q):
    """The q-quantile of sorted values, linear between neighbours (so p10 <= median <= p90 for any count)."""
    i = q * (len(ascending) - 1)
    lo = int(i)
    return ascending[lo] + (ascending[min(lo + 1, len(ascending) - 1)] - ascending[lo]) * (i - lo)


def paired(stats, base, other):
    """``other``'s speed-up over ``base`` round by round, from :func:`interleave`'s ``stats``: ``{"median", "p10",
    "p90"}`` of base's time / other's time in the same round. Both calls of a round ran seconds apart, so a slow
    phase of the host (which lasts seconds to minutes) slows both, and their ratio keeps what the ratio of the two
    medians loses when the phases fall unevenly on the variants' slowest rounds."""
    ratios = sorted(b / o for b, o in zip(stats[base]["times_s"], stats[other]["times_s"], strict=True))
    return {"median": statistics.median(ratios), "p10": _percentile(ratios, 0.1), "p90": _percentile(ratios, 0.9)}


def write_json(path, data, force=True):
    """JSON as one whole file (``ms_swiglu.outputs``), with the machine it was measured on (``probes.machine``);
    an existing one is replaced only with ``force``."""
    import json  # noqa: PLC0415

    from ms_swiglu.outputs import OutputSet  # noqa: PLC0415
    from ms_swiglu.tools.probes import machine  # noqa: PLC0415

    data = {"machine": machine(), **data}

    def dump(tmp):
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)

    with OutputSet([path], force) as out:
        out.write(out.paths[0], dump)
        out.commit()


def reset_peak_memory():
    """Reset this process's peak resident size (VmHWM) and return the resident size now (bytes)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return proc_status("VmRSS")


def proc_status(key):
    """A size field of /proc/self/status (VmRSS, VmHWM, ...) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status: expected {key}, found none")


def probe_process(module, args, what, timeout):
    """``python -m module --probe *args`` in a fresh process; its last stdout line. Raises RuntimeError naming
    `what` and the child's last stderr line when it fails."""
    from ms_swiglu import processes  # noqa: PLC0415

    r = processes.run(processes.python(module, "--probe", *args), timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{what}: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return r.stdout.strip().splitlines()[-1]
