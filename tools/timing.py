"""Interleaved timing: every variant once per round, so that the machine's drift (20-40% here) hits all alike."""
import statistics
import time


def interleave(variants, rounds, warmup=3):
    """``{name: {"min_s", "median_s", "spread"}}`` for ``{name: callable}``; spread = (p90 - p10) / median."""
    for call in variants.values():  # compile and warm up
        for _ in range(warmup):
            call()
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, call in variants.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    stats = {}
    for name, ts in times.items():
        ts = sorted(ts)
        med = statistics.median(ts)
        stats[name] = {"min_s": ts[0], "median_s": med,
                       "spread": (ts[int(0.9 * (len(ts) - 1))] - ts[int(0.1 * (len(ts) - 1))]) / med}
    return stats


def write_json(path, data, force=True):
    """JSON as one whole file (``ms_swiglu.outputs``); an existing one is replaced only with ``force``."""
    import json  # noqa: PLC0415

    from ms_swiglu.outputs import OutputSet  # noqa: PLC0415

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
    import subprocess  # noqa: PLC0415

    from ms_swiglu.processes import python  # noqa: PLC0415

    r = subprocess.run(python(module, "--probe", *args), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{what}: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return r.stdout.strip().splitlines()[-1]
