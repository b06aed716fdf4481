"""`ms-swiglu bench` end to end on a tiny shape: every field of the report, the JSON and the plot."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from ms_swiglu.tools.probes import MACHINE_FLAGS

CLI = [os.path.join(os.path.dirname(sys.executable), "ms-swiglu")]


def _unless_busy(first, again, prog, outputs):
    """A benchmark's run (``first``: a CompletedProcess) that its probes may refuse on a busy host (a ceiling
    measured while a thread waited for a CPU is refused; the test suite runs beside other processes): run
    ``again()`` once where it was, and where that is refused too, check the refusal (one line naming the probe and
    what it expected, no ``outputs`` written) and skip the report's checks, saying so."""
    def refused(r):
        return r.returncode == 1 and f"{prog}: refused:" in r.stderr and "the host is busy" in r.stderr

    r = again() if refused(first) else first
    if refused(r):
        line = r.stderr.strip().splitlines()[-1]
        assert re.fullmatch(rf"{re.escape(prog)}: refused: (peak probe process: )?(compute peak probe \w+|read probe): "
                            r".*expected >= .*; the host is busy(, or its CPUs share a core)? \(measured 3 times\)",
                            line), line
        assert not any(path.exists() for path in outputs)  # no report rather than a wrong one
        pytest.skip(f"the host stayed busy for {prog}'s ceilings, twice: {line}")
    return r


def _bench_result(bench_run):
    """conftest's bench run, started beside the other test files: run again here (they are done by now) where the
    host was too busy for its probes, with the same options, working directory, $TMPDIR and outputs."""
    from conftest import BENCH, EXE

    def again():
        return subprocess.run([EXE, *BENCH, "--json", str(bench_run.json), "--plot", str(bench_run.png)],
                              cwd=bench_run.cwd, capture_output=True, text=True, timeout=900,
                              env=dict(os.environ, TMPDIR=str(bench_run.cwd.parent / "tmp")))

    return _unless_busy(bench_run.result, again, "ms-swiglu bench", [bench_run.json, bench_run.png])


def test_bench_reports_every_variant_with_ceilings_memory_json_and_plot(bench_run):
    r = _bench_result(bench_run)  # conftest's: the tiny shape, conftest.BENCH's options, --json and --plot
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(bench_run.json.read_text())
    assert data["read_gbps"] > 0 and data["rw_gbps"] > 0 and data["args"]["layers"] == 2
    assert data["args"]["settle"] == 0.01  # a short pause: this test checks the structure, not the times
    assert data["disturbed_above"] == 0.05
    # the ceilings on every thread, checked against one thread's (tools/probes.py: peaks, read_rates); where the
    # host was too busy for that (the suite runs beside other processes) no fraction of them is given, and why
    measured = data["ceilings_unmeasured"] is None
    if measured:
        peaks, read_probe, cpus = data["peaks_gflops"], data["read_probe"], len(os.sched_getaffinity(0))
        assert peaks["threads"] == read_probe["threads"] == cpus and peaks["one_thread"]["fma_float32"] > 0
        assert peaks["scaling"]["fma_float32"] >= 0.9 * cpus and read_probe["concurrency"] >= 0.9
        assert read_probe["scaling"] == pytest.approx(read_probe["all_threads"] / read_probe["one_thread"])
    else:
        assert data["peaks_gflops"] is None and data["read_probe"] is None
        assert f"ceilings: not measured ({data['ceilings_unmeasured']})" in r.stdout
        assert "expected >= " in data["ceilings_unmeasured"] and "the host is busy" in data["ceilings_unmeasured"]
    assert data["slow_calls_above"] == 0.1 and {"read"} <= set(data["host_probe_best"]) <= {"read", "amx"}
    assert all(rate > 0 for rate in data["host_probe_best"].values())
    with open("/proc/cpuinfo") as f:  # the machine it ran on, read from the same source by hand
        lines = f.read().splitlines()
    model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    flags = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
    assert data["machine"]["cpu"] == model and data["machine"]["cpus"] == len(os.sched_getaffinity(0))
    assert data["machine"]["flags"] == [x for x in MACHINE_FLAGS if x in flags]
    assert f"machine: {model}, " in r.stdout
    # both dtypes interleaved at each token count
    assert [(c["tokens"], c["dtype"]) for c in data["results"]] == [
        (1, "float32"), (1, "bfloat16"), (4, "float32"), (4, "bfloat16")]
    for cell in data["results"]:
        # each dtype has its own GEMM ceilings: the library's in that dtype, MindSpore's and NumPy's in float32
        extra = {"mindspore", "numpy"} if cell["dtype"] == "float32" else set()
        assert set(cell["gemm_ceiling_gflops"]) == {"library"} | extra
        if measured:
            peaks = data["peaks_gflops"]  # bfloat16: AMX, else AVX512-BF16, where the CPU has them
            want = [peaks["amx_bfloat16"], peaks["avx512_bfloat16"]] if cell["dtype"] == "bfloat16" else []
            assert cell["peak_gflops"] == next((p for p in want if p), peaks["fma_float32"])
        else:
            assert cell["peak_gflops"] is None
        assert cell["remeasured"] == {}  # the tiny shape's figures are far below every ceiling
        dist = cell["disturbance"]  # the same rounds for every dtype of one N
        assert set(dist) == {"other_cpu_s", "steal_s", "wall_s", "fraction", "attempts", "flagged", "slow_calls"}
        assert dist["wall_s"] > 0 and dist["attempts"] == 1 and 0 <= dist["slow_calls"] <= 1  # --retries 0
        assert dist["flagged"] == (dist["fraction"] > 0.05 or dist["slow_calls"] > 0.1)
        graph = cell["graph_call_ms"]  # MindSpore's cost of one graph call, in the same rounds
        assert 0 < graph["min"] <= graph["median"]
        read = cell["read_gbps_in_rounds"]  # N=1: the read probe interleaved with the variants
        assert (read is not None) == (cell["tokens"] == 1)
        if read:
            assert read["best"] >= read["median"] > 0
        assert len(cell["variants"]) == 8 and len(cell["in_model"]) == 8  # 4 variants x (O0, O1), alone and in a model
        for where in ("variants", "in_model"):
            for key, e in cell[where].items():
                assert e["median_s"] > 0 and e["gflops"] > 0 and e["activation_bytes"] > 0
                # the figures from the stored times: an MLP is 6 N H I FLOPs, 2 layers (or blocks) per call; at
                # N=1 its 3 H I weights are read once each, against the read probe's median in the same rounds
                times, n, size = e["times_s"], cell["tokens"], {"float32": 4, "bfloat16": 2}[cell["dtype"]]
                assert e["median_s"] == np.median(times) and e["min_s"] == min(times)
                assert e["order_effect"] == pytest.approx(times[1] / times[0] - 1)  # odd rounds reversed
                assert e["gflops"] == pytest.approx(6 * n * cell["hidden"] * cell["inter"] * 2 / e["median_s"] / 1e9)
                if n == 1:
                    gbps = 3 * cell["hidden"] * cell["inter"] * size * 2 / e["median_s"] / 1e9
                    assert e["weight_gbps"] == pytest.approx(gbps)
                assert ("peak_added_bytes" in e) == (key.endswith("/O0") and where == "variants")
                assert ("per_block_ms" in e) == (where == "in_model")
                assert ("weight_gbps" in e) == (cell["tokens"] == 1)
                if not measured:
                    assert e["fraction_of_ceiling"] is e["fraction_of_ceiling_min"] is e["fraction_of_peak"] is None
                elif n == 1:
                    assert e["fraction_of_ceiling"] == pytest.approx(gbps / read["median"])
                else:
                    assert e["fraction_of_ceiling"] == pytest.approx(e["gflops"] / cell["gemm_ceiling_median_gflops"])
                if measured:
                    assert e["fraction_of_ceiling"] > 0 and e["fraction_of_ceiling_min"] > 0
                    assert max(e["fraction_of_ceiling"], e["fraction_of_ceiling_min"], e["fraction_of_peak"]) <= 1
                    assert 0 < e["fraction_of_peak"] == e["gflops"] / cell["peak_gflops"]
                assert e["speedup_vs_baseline"] > 0 and e["speedup_vs_float32"] > 0
                assert len(e["times_s"]) == 2 and e["paired_vs_peer"] is None  # --rounds 2, no --peer-python
                pb = e["paired_vs_baseline"]
                assert 0 < pb["p10"] <= pb["median"] <= pb["p90"]
                if cell["dtype"] == "float32":
                    assert e["speedup_vs_float32"] == 1.0
    fused, base = (data["results"][2]["variants"][k]["activation_bytes"] for k in ("packed-cpu/O0", "baseline/O0"))
    assert fused < base
    assert bench_run.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "GEMM ceiling" in r.stdout and "in the same rounds" in r.stdout
    assert "bench [" not in r.stderr  # the progress bar only where stderr is a terminal
    assert "disturbance" in r.stdout and "in model" in r.stdout and r.stdout.count("order effect") == 4
    assert r.stdout.count("cost of one graph call") == 4


def test_bench_quant_reports_int8_against_bfloat16_with_the_read_probe_and_paired_rounds(tmp_path, background_done):
    def run():
        return subprocess.run([sys.executable, "-m", "ms_swiglu.tools.bench_quant", "--preset", "tiny", "--tokens", "1",
                               "4", "--layers", "1", "--rounds", "3", "--settle", "0.01", "--accuracy", "--json",
                               str(tmp_path / "q.json")],
                              capture_output=True, text=True, timeout=600)

    r = _unless_busy(run(), run, "bench_quant", [tmp_path / "q.json"])
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads((tmp_path / "q.json").read_text())
    assert (data["preset"], data["hidden"], data["intermediate"], data["layers"], data["repeat"]) == (
        "tiny", 64, 176, 1, 1)
    assert data["settle_s"] == 0.01
    assert [row["tokens"] for row in data["speed"]] == [1, 4]
    for row in data["speed"]:
        b, q = row["bfloat16"], row["int8"]
        # where the host was too busy for the peaks (the suite runs beside other processes): times and ratios, no
        # fraction of a ceiling, and why
        measured = row["ceilings_unmeasured"] is None
        assert measured or "the host is busy" in row["ceilings_unmeasured"]
        # int8 weights: half the bytes of bfloat16 ones, plus a float32 scale per row (2I + H rows)
        assert q["bytes"] == b["bytes"] // 2 + 4 * (2 * 176 + 64)
        s = row["int8/bf16 speedup"]
        assert s["median"] == pytest.approx(b["median_ms"] / q["median_ms"])
        assert 0 < s["paired"]["p10"] <= s["paired"]["median"] <= s["paired"]["p90"]
        assert ("read_probe_GB/s" in row) == (row["tokens"] == 1 and measured) == ("fraction_of_read" in q)
        if row["tokens"] == 1 and measured:  # int8's conversions against the machine's peak for the kernel's instructions
            from ms_swiglu.backends.cpu import kernels

            peak = row["int8_conversion_peak"]
            assert peak["probe"] == {"vpdpwssd": "int8_vpdpwssd", "vpmaddwd": "int8_vpmaddwd", None: "int8_widen"}[
                kernels.tuning()["int8_one_token_dot"]]
            weights = 3 * 176 * 64  # gate_up [2I, H] and down [H, I]
            assert q["fraction_of_conversion_peak"] == pytest.approx(
                weights / (q["median_ms"] / 1e3) / 1e9 / peak["G weights/s"])
            memory = max(row["read_probe_GB/s"], b["GB/s"])
            fastest_s = max(weights / peak["G weights/s"], q["bytes"] / memory) / 1e9
            assert s["ceiling"] == pytest.approx(b["median_ms"] / 1e3 / fastest_s)
            assert "fraction_of_conversion_peak" not in b  # bfloat16 weights: nothing to convert
            # each projection alone: its share of the bytes, and the speed-up from its own timings
            proj = row["projections"]
            assert proj["gate_up"]["int8"]["bytes"] == 2 * 176 * 64 + 4 * 2 * 176
            assert proj["down"]["int8"]["bytes"] == 64 * 176 + 4 * 64
            assert (proj["gate_up"]["bfloat16"]["bytes"], proj["down"]["bfloat16"]["bytes"]) == (4 * 176 * 64,
                                                                                              2 * 64 * 176)
            assert sum(p["int8"]["bytes"] for p in proj.values()) == q["bytes"]
            for p in proj.values():
                ps = p["int8/bf16 speedup"]
                assert ps["median"] == pytest.approx(p["bfloat16"]["median_ms"] / p["int8"]["median_ms"])
                assert 0 < ps["paired"]["p10"] <= ps["paired"]["median"] <= ps["paired"]["p90"]
                assert p["int8"]["fraction_of_read"] == pytest.approx(p["int8"]["GB/s"] / row["read_probe_GB/s"])
        else:
            assert "int8_conversion_peak" not in row and "ceiling" not in s and "projections" not in row
            # above one token int8 weights take a float32 GEMM: its FMAs' peak beside an int16 GEMM's multiplies
            if measured:
                assert row["multiply_peaks"]["fma_float32"] > 0 and row["multiply_peaks"]["int16_gemm_vpmaddwd"] > 0
        assert ("multiply_peaks" in row) == (row["tokens"] > 1 and measured)
        # the same MLP Cells as a graph compiled for this token count: the same bytes, its own times and speed-up
        assert row["shapes"] == ["dynamic", "static"]
        bs, qs, ss = row["bfloat16 static"], row["int8 static"], row["int8/bf16 speedup static"]
        assert (bs["bytes"], qs["bytes"]) == (b["bytes"], q["bytes"])
        assert ss["median"] == pytest.approx(bs["median_ms"] / qs["median_ms"])
        assert 0 < ss["paired"]["p10"] <= ss["paired"]["median"] <= ss["paired"]["p90"]
        assert ("ceiling" in ss) == ("ceiling" in s) == (row["tokens"] == 1 and measured)
        assert {"fraction", "slow_calls", "attempts", "flagged"} <= set(row["disturbance"])
        # the same weights through the library's calls alone (bit-equal to the graph, or the bench stops)
        for name, graph in (("bfloat16", b), ("int8", q)):
            lib = row[f"{name} library"]
            assert lib["bytes"] == graph["bytes"] and 0 < lib["min_ms"] <= lib["median_ms"]
            assert lib["GB/s"] == pytest.approx(lib["bytes"] / lib["median_ms"] / 1e6)
            assert ("fraction_of_read" in lib) == (row["tokens"] == 1 and measured)
        assert 0 < row["graph_call_ms"]["min"] <= row["graph_call_ms"]["median"]
    # a graph line per shape kind at each N, and (ceilings measured) each projection alone at N=1
    alone = 2 * (data["speed"][0]["ceilings_unmeasured"] is None)
    assert r.stdout.count("paired by round") == 2 * 2 + alone and r.stdout.count("the library's calls alone") == 2
    assert r.stdout.count("graph, dynamic shapes") == r.stdout.count("graph, static shapes") == 2
    assert r.stdout.count("conversions against their peak") == 3 * alone // 2  # N=1: both graphs and the library's
    assert r.stdout.count("alone (library)") == alone  # gate_up and down at N=1
    # the formats without groups: groups of 128 divide neither H=64 nor I=176
    assert [(a["outliers"], a["format"], a["scales"]) for a in data["accuracy"]] == [
        (o, f, s) for o in ("rows", "columns") for f, s in (("int8", "per output row"),
                                                            ("w8a8", "per output row, int8 activations per token"))]
    assert all(a["max_rel"] >= a["mean_rel"] > 0 and a["frobenius_rel"] > 0 for a in data["accuracy"])


@pytest.fixture
def fixed_peaks(monkeypatch):
    """bench_quant's compute peaks without their probes (seconds of both cores, refused on a busy host): far above
    any figure, for tests of what the peaks do not decide."""
    from ms_swiglu.tools import bench_quant

    monkeypatch.setattr(bench_quant, "peaks", lambda names, **kwargs: {name: 1e6 for name in names})


def test_bench_quant_stops_when_the_library_calls_are_not_the_graphs_computation(monkeypatch, fixed_peaks):
    from ms_swiglu.tools import bench_quant

    library = bench_quant._library

    def off_by_one_bit(*args):  # the real calls, with one output bit flipped
        call = library(*args)
        return lambda x: call(x) ^ 1

    monkeypatch.setattr(bench_quant, "_library", off_by_one_bit)
    with pytest.raises(AssertionError, match="bfloat16: the library's direct calls differ from the graph's output"):
        bench_quant.speed(64, 176, [2], 1, 1, settle=0)


def test_bench_quant_times_int8_g128_beside_int8(fixed_peaks):
    from ms_swiglu.tools import bench_quant

    rows = bench_quant.speed(256, 512, [2], 1, 2, settle=0, quants=("int8", "int8-g128"))
    b, q, g = rows[0]["bfloat16"], rows[0]["int8"], rows[0]["int8-g128"]
    # per row: a float32 scale per row (2I + H rows); per group: one per 128 inputs of each row
    assert q["bytes"] == b["bytes"] // 2 + 4 * (2 * 512 + 256)
    assert g["bytes"] == b["bytes"] // 2 + 4 * (2 * 512 * 256 // 128 + 256 * 512 // 128)
    for quant, entry in (("int8", q), ("int8-g128", g)):
        s = rows[0][f"{quant}/bf16 speedup"]
        assert s["median"] == pytest.approx(b["median_ms"] / entry["median_ms"])
        assert rows[0][f"{quant} library"]["bytes"] == entry["bytes"]


def test_bench_quant_repeats_the_chain_per_graph_call(fixed_peaks):
    import mindspore as ms
    from mindspore import nn

    from ms_swiglu.tools import bench_quant

    ms.set_context(mode=ms.GRAPH_MODE)
    mlps = bench_quant._chain(64, 176, 2, "int8")
    x = ms.Tensor(np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)).astype(ms.bfloat16)
    once = nn.SequentialCell(mlps)
    expected = once(once(once(x)))  # the 2 layers, 3 times over
    assert np.array_equal(bench_quant._graph(mlps, "static", 3)(x).asnumpy(), expected.asnumpy())
    # per call: 3 x 2 layers of int8 weights [2I, H] and [H, I] with a float32 scale per row; the library's calls
    # repeat as the graph does (speed() stops where the two outputs differ by a bit)
    rows = bench_quant.speed(64, 176, [2], 2, 1, settle=0, shapes=("static",), repeat=3)
    row = rows[0]
    assert row["int8 static"]["bytes"] == row["int8 library"]["bytes"] == 3 * 2 * (3 * 176 * 64 + 4 * (2 * 176 + 64))
    for key in ("bfloat16 static", "int8 static"):
        library = row[key.replace("static", "library")]
        assert row[key]["over_library_ms"] == pytest.approx(row[key]["median_ms"] - library["median_ms"])


def test_bench_quant_accuracy_compares_groups_of_128_where_they_divide():
    import numpy as np

    from ms_swiglu import quant
    from ms_swiglu.tools.bench_quant import _quantize, accuracy

    rows = {(a["outliers"], a["format"]): a for a in accuracy(256, 384, tokens=4)}
    assert set(rows) == {(o, f) for o in ("rows", "columns") for f in quant.names()}
    # outlier input columns widen every row's range; a group without one keeps its own, finer scale
    assert rows["columns", "int8-g128"]["frobenius_rel"] < rows["columns", "int8"]["frobenius_rel"]
    # int4 (16 levels) loses more than int8 (255) with the same groups; int8 activations add to int8 weights' loss
    assert rows["rows", "int4-g128"]["frobenius_rel"] > rows["rows", "int8-g128"]["frobenius_rel"]
    assert rows["rows", "w8a8"]["frobenius_rel"] > rows["rows", "int8"]["frobenius_rel"]
    w = np.array([[127.0] * 128 + [12700.0] * 128])  # two groups 100x apart: scales 1 and 100, each exact
    g128, per_row = quant.get("int8-g128"), quant.get("int8")
    assert np.array_equal(_quantize(w, g128), w) and not np.array_equal(_quantize(w, per_row), w)


def test_disturbance_is_the_cpu_time_of_other_processes_and_steal():
    from ms_swiglu.tools.timing import CPUClock

    clock = CPUClock()
    clock.hz, clock.cpus = 100, 2
    # (wall s, busy ticks of the machine, steal ticks, ticks of the watched processes)
    d = clock.disturbance((10.0, 1000, 5, 400), (11.0, 1150, 15, 480))
    assert d["other_cpu_s"] == (150 - 80) / 100 and d["steal_s"] == 10 / 100 and d["wall_s"] == 1.0
    assert d["fraction"] == (0.7 + 0.1) / (1.0 * 2)
    assert clock.disturbance((0.0, 0, 0, 0), (1.0, 10, 0, 50))["other_cpu_s"] == 0  # own time is never "other"


def test_a_busy_neighbour_flags_the_rounds_and_they_are_retried():
    import time

    from ms_swiglu.tools.timing import DISTURBED, CPUClock, watched

    variants = {"a": lambda: time.sleep(0.02), "b": lambda: time.sleep(0.02)}
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # one core of two, busy all the time
    try:
        time.sleep(0.3)
        # 20 calls 0.04 s apart: 0.8 s of rounds, 80 ticks of /proc's clock
        stats, dist = watched(variants, rounds=10, retries=1, warmup=1, settle=0.02)
        assert set(stats) == {"a", "b"} and dist["attempts"] == 2 and dist["flagged"]
        assert dist["fraction"] > 0.3 > DISTURBED and dist["other_cpu_s"] > 0.2
        # the same neighbour counted as one of ours (the torch peer is): its CPU time leaves "other". Two clocks
        # read at the same moments, so that whatever else the host runs counts the same in both; the two readings
        # of a moment lie microseconds apart, within which each of the 2 CPUs' and 2 processes' tick counters
        # (10 ms) may step once: at most 4 ticks apart at each end
        mine, plain = CPUClock(pids=[busy.pid]), CPUClock()
        before = mine.read(), plain.read()
        time.sleep(0.5)
        after = mine.read(), plain.read()
        neighbour_s = ((after[0][3] - before[0][3]) - (after[1][3] - before[1][3])) / mine.hz
        assert neighbour_s > 0.3  # it ran on its core
        other, other_plain = (clock.disturbance(b, a)["other_cpu_s"] for clock, b, a in
                              zip((mine, plain), before, after))
        assert other == pytest.approx(max(0.0, other_plain - neighbour_s), abs=0.08)
    finally:
        busy.kill()
        busy.wait()


def test_slow_phases_of_the_host_are_counted_per_call_and_retried(monkeypatch):
    """A probe sampled before every call judges it against the best rate seen by the end of the rounds (the
    host's slow phases do not show in /proc): planted slow samples are counted per variant, a run with more than
    SLOW_CALLS of its calls slow is repeated, and the least disturbed attempt is kept."""
    from ms_swiglu.tools import timing

    class QuietClock:  # no other process and no steal: only the host's speed decides
        def __init__(self, pids=()):
            pass

        def read(self):
            return None

        def disturbance(self, before, after):
            return {"other_cpu_s": 0.0, "steal_s": 0.0, "wall_s": 1.0, "fraction": 0.0}

    monkeypatch.setattr(timing, "CPUClock", QuietClock)
    amx = iter([5, 5, 10, 10, 10, 10, 10, 10,  # interleave: the first two calls slow against the best (10) seen later
                10, 4, 4, 10, 10, 4, 4, 10,   # watched, attempt 1: 4 slow calls of 8
                10, 9, 8, 10, 10, 8, 10, 9])  # attempt 2: none below 0.8 of the best
    host = timing.HostSpeed({"amx": lambda: next(amx), "read": lambda: 2.0})
    variants = {"a": lambda: None, "b": lambda: None}
    stats = timing.interleave(variants, rounds=4, warmup=0, host=host, settle=0)  # calls: a b, b a, a b, b a
    assert (stats["a"]["slow_calls"], stats["b"]["slow_calls"]) == (1, 1) and host.best == {"amx": 10, "read": 2.0}
    stats, dist = timing.watched(variants, rounds=4, retries=2, warmup=0, host=host, settle=0)
    assert dist["attempts"] == 2 and not dist["flagged"] and dist["slow_calls"] == 0
    assert stats["a"]["slow_calls"] == stats["b"]["slow_calls"] == 0
    assert host.speed({"amx": 7.0, "read": 2.0}) == 0.7 < timing.SLOW_HOST  # the slowest probe decides
    assert host.speed({"amx": 10.0, "read": 1.0}) == 0.5
    # a lone outlier (twice the rate, as a read probe once gave) is not the best until BEST_OF samples reach it
    read = iter([31.0, 62.0, 30.0, 32.0, 33.0, 62.0, 62.0])
    host = timing.HostSpeed({"read": lambda: next(read)})
    seen = [host.best["read"] for _ in range(7) if host.sample()]
    assert seen == [31.0, 31.0, 30.0, 31.0, 32.0, 33.0, 62.0]
    assert host.speed({"read": 30.0}) == 30.0 / 62.0


def test_host_probes_give_the_read_rate_and_the_amx_rate_where_there_is_amx():
    from ms_swiglu.tools.probes import _lib, host_probes

    rates = {name: probe() for name, probe in host_probes(read_floats=2**22, amx_iterations=1000).items()}
    assert set(rates) == ({"read", "amx"} if _lib().probe_amx_peak(1, 10) > 0 else {"read"})
    assert rates["read"] > 1e9 and rates.get("amx", 1e10) >= 1e10  # bytes/s, FLOP/s


def test_interleave_alternates_the_order_and_reports_its_effect(monkeypatch):
    """Odd rounds run in reverse, so every variant follows both neighbours; a time that depends on its
    predecessor shows as order_effect (a fake clock: each call advances it by a planted duration)."""
    from ms_swiglu.tools import timing

    now, ran, pauses = [0.0], [], []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(timing, "pause", pauses.append)  # the pause before each call: not timed

    def call(name, seconds):
        def run():
            # "b" pays 5 ms more when it runs right after "a" (caches, spinning threads...)
            now[0] += seconds(ran[-1] if ran else None)
            ran.append(name)
        return run

    variants = {"a": call("a", lambda prev: 0.010), "b": call("b", lambda prev: 0.025 if prev == "a" else 0.020),
                "c": call("c", lambda prev: 0.030)}
    stats = timing.interleave(variants, rounds=4, warmup=0)
    assert ran == list("abc" "cba" "abc" "cba") and pauses == [timing.SETTLE_S] * 12
    # b follows a in forward rounds (25 ms) and c in reversed ones (20 ms)
    assert stats["b"]["order_effect"] == pytest.approx(0.020 / 0.025 - 1)
    assert stats["a"]["order_effect"] == pytest.approx(0, abs=1e-9) == stats["c"]["order_effect"]
    assert stats["b"]["min_s"] == pytest.approx(0.020) and stats["b"]["median_s"] == pytest.approx(0.0225)
    assert timing.interleave({"a": variants["a"]}, rounds=1, warmup=0, settle=0)["a"]["order_effect"] == 0
    assert len(pauses) == 12


def test_paired_speedups_divide_the_times_of_the_same_round(monkeypatch):
    """A slow phase of the host slows both calls of a round (a fake clock: each variant's k-th call takes a planted
    time; round 2 is slow for both, round 4 only for b): the paired ratios are a's time over b's per round."""
    from ms_swiglu.tools import timing

    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(timing, "pause", lambda s: None)
    planted = {"a": [10, 30, 10, 10, 10], "b": [8, 24, 8, 10, 8]}  # ms by round

    def call(name):
        def run():
            now[0] += planted[name][run.k] / 1e3
            run.k += 1
        run.k = 0
        return run

    stats = timing.interleave({"a": call("a"), "b": call("b"), "c": call("a")}, rounds=5, warmup=0)
    assert stats["b"]["times_s"] == pytest.approx([t / 1e3 for t in planted["b"]])  # by round, reversed ones too
    p = timing.paired(stats, "a", "b")  # ratios 1.25, 1.25, 1.25, 1.0, 1.25; p10 0.4 of the way from 1.0 to 1.25
    assert p["median"] == pytest.approx(1.25) and p["p10"] == pytest.approx(1.1) and p["p90"] == pytest.approx(1.25)
    assert timing.paired(stats, "b", "a")["median"] == pytest.approx(0.8)
    with pytest.raises(ValueError):  # rounds of different runs cannot be paired
        timing.paired({"a": stats["a"], "b": {"times_s": [1.0]}}, "a", "b")


def test_the_pause_between_timed_calls_spins_on_the_clock_and_never_sleeps(monkeypatch):
    """The pause spins instead of sleeping (a machine left idle runs the next call slower): it polls the clock
    until the time is up and never gives the CPU away (no sleep, no wait). The clock is a fake one, so the test
    sees what the code does, not how busy the host is."""
    from ms_swiglu.tools import timing

    step = 2.0 ** -10  # exact in binary: the polls land on the end exactly
    now, polls = [100.0], []

    def clock():
        polls.append(now[0])
        now[0] += step
        return polls[-1]

    def refuse(*_):
        raise AssertionError("the pause gave the CPU away")

    monkeypatch.setattr(timing.time, "perf_counter", clock)
    monkeypatch.setattr(timing.time, "sleep", refuse)
    timing.pause(50 * step)
    assert polls == [100.0 + k * step for k in range(51)]  # the start, then every poll until the end is reached


def test_bandwidth_probes_compute_what_they_read():
    import numpy as np

    from ms_swiglu.tools.probes import add, read_sum

    x = np.random.default_rng(0).integers(-4, 5, 3 * 4096 + 77).astype(np.float32)
    with open("/proc/cpuinfo") as f:
        flags = next(line.split(":", 1)[1].split() for line in f if line.startswith("flags"))
    has = {"generic": True, "avx2": "avx2" in flags, "avx512": "avx512f" in flags, "best": True}
    for name in has:  # the read probe is compiled per ISA (8 streams per thread)
        if not has[name]:  # an ISA this CPU lacks is refused by name
            with pytest.raises(ValueError, match=f"got '{name}'"):
                read_sum(x, name)
            continue
        for n in (0, 5, 1000, x.size):  # shorter than one stream block, and with a tail
            for threads in (None, 1, 2):  # every CPU by default
                assert read_sum(x[:n], name, threads) == float(x[:n].astype(np.float64).sum()), (name, n, threads)
    a, b = x[:5000].copy(), x[5000:10000].copy()
    c = np.empty_like(a)
    add(a, b, c)
    np.testing.assert_array_equal(c, a + b)


PROBES_THREADS = r"""
import os, numpy as np
from ms_swiglu.tools.probes import ProbeError, add, peaks, read_rates, read_sum
threads = lambda: sorted(os.listdir("/proc/self/task"))
x = np.ones(1 << 20, np.float32)
before = threads()
assert read_sum(x) == x.size
add(x, x, np.empty_like(x))
try:  # each probe on one thread and on all (a busy host refuses them: their threads must be gone all the same)
    read_rates(np.ones(1 << 25, np.float32))  # 128 MiB: a read of milliseconds, the threads' start a small part
except ProbeError as e:
    assert "expected >= " in str(e), e
try:
    measured = peaks(seconds=0.002)
except ProbeError as e:
    assert "expected >= " in str(e), e
    measured = None
if measured:
    assert measured["fma_float32"] > 0
    with open("/proc/cpuinfo") as f:  # a peak for each instruction set the CPU has, None for the others
        flags = next(line.split(":", 1)[1].split() for line in f if line.startswith("flags"))
    assert (measured["avx512_bfloat16"] is not None) == ("avx512_bf16" in flags)
    assert (measured["int8_vpdpwssd"] is not None) == ("avx512_vnni" in flags)
    assert (measured["int8_widen"] is not None) == ("avx2" in flags or "avx512bw" in flags)
    assert (measured["int8_vpmaddwd"] is not None) == ("avx2" in flags)
    assert (measured["int16_gemm_vpmaddwd"] is not None) == ("avx2" in flags)
    # one FMA lane per int8 weight, counted as 2 FLOP: the loop can not beat the FMAs alone (slack for short calls)
    assert measured["int8_widen"] is None or measured["int8_widen"] <= 1.5 * measured["fma_float32"]
# a joined thread's task stays listed for a moment after the join returns (the kernel wakes the joining thread
# before it reaps the task; seen once in a full run on 2 CPUs), while OpenMP's spinning workers stay for good
import time
deadline = time.monotonic() + 2.0
while threads() != before and time.monotonic() < deadline:
    time.sleep(0.01)
print("THREADS", len(before), threads() == before)
"""


def test_bandwidth_and_peak_probes_leave_no_thread_behind():
    # a probe's threads that outlive it (OpenMP's spinning workers) slowed whatever was timed right after it; in
    # a process of its own, where no other test's runtime starts threads of its own meanwhile
    out = subprocess.run([sys.executable, "-c", PROBES_THREADS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    count, same = out.stdout.split()[-2:]
    assert int(count) >= 1 and same == "True", out.stdout


def test_bench_linear_times_every_path(tmp_path):
    from ms_swiglu.tools import bench_linear

    assert bench_linear.main(["--preset", "tiny", "--tokens", "1", "9", "--dtype", "float32", "bfloat16",
                              "--rounds", "2", "--settle", "0", "--json", str(tmp_path / "l.json")]) == 0
    data = json.loads((tmp_path / "l.json").read_text())
    assert data["settle_s"] == 0
    assert [(r["dtype"], r["tokens"]) for r in data["rows"]] == [
        ("float32", 1), ("float32", 9), ("bfloat16", 1), ("bfloat16", 9)]
    from ms_swiglu.backends.cpu import kernels
    for r in data["rows"]:
        assert all(r[path]["median_s"] > 0 for path in kernels.paths()) and r["skinny"]["weight_gbps"] > 0
        assert r["path"] == kernels.path(r["dtype"], r["tokens"])  # the automatic choice, restored after forcing
    bf16_9 = "amx" if kernels.tuning()["amx_available"] else "skinny"  # no AMX: skinny up to 16 tokens
    assert [r["path"] for r in data["rows"]] == ["skinny", "onednn-swapped", "skinny", bf16_9]


def test_bench_help_lists_every_option():
    """--help formats every option's help (a literal % in one broke it)."""
    r = subprocess.run(CLI + ["bench", "--help"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for option in ("--model-blocks", "--retries", "--peer-python", "--layers"):
        assert option in r.stdout
    assert "take > 5% of the CPU" in " ".join(r.stdout.split())


def test_a_ceiling_counts_only_where_every_thread_ran_the_whole_call_and_the_threads_scaled():
    from ms_swiglu.tools.probes import ProbeError, judge

    assert judge("p", 2, 100.0, 190.0, 0.97) == 1.9 and judge("p", 1, 100.0, 100.0, 0.95) == 1.0
    # the peaks once recorded on the AMD EPYC host: one thread's rate, where two gave 2x
    with pytest.raises(ProbeError, match=r"^compute peak probe fma_float32: 2 threads gave 1\.02x the 1-thread rate, "
                                         r"expected >= 1\.8x \(every thread on its own CPU\)"):
        judge("compute peak probe fma_float32", 2, 117.0, 119.34, 0.99)
    with pytest.raises(ProbeError, match=r"expected >= 3\.6x"):
        judge("p", 4, 100.0, 350.0, 1.0)
    # fast enough, but a thread waited for a CPU during the call: not counted
    with pytest.raises(ProbeError, match=r"^p: a thread ran 52% of its call's wall time \(on 1 or 2 threads, which "
                                         r"gave 1\.99x the 1-thread rate\), expected >= 90% \(every thread on its own"):
        judge("p", 2, 100.0, 199.0, 0.52)
    # a read: the memory bounds it, not the threads (1.3x is a fine read), but every thread must have run
    assert judge("read probe", 2, 20.0, 26.0, 0.95, scaling=None) == pytest.approx(1.3)
    with pytest.raises(ProbeError, match=r"^read probe: a thread ran 40% of its call's wall time"):
        judge("read probe", 2, 20.0, 26.0, 0.40, scaling=None)


def test_a_probe_is_measured_again_a_bounded_number_of_times_then_refused():
    from ms_swiglu.tools.probes import ATTEMPTS, ProbeError, checked_rates

    def planted(runs):  # measure(threads) -> (rate, concurrency), the planted runs in turn
        runs, asked = iter(runs), []

        def measure(threads):
            asked.append(threads)
            return next(runs)
        return measure, asked

    one, waited, quiet = (100.0, 1.0), (250.0, 0.6), (195.0, 0.98)
    # attempt 1: every 2-thread call had a thread waiting (refused); attempt 2: the best call that counts is kept,
    # not a faster one whose thread waited
    measure, asked = planted([one] * 3 + [waited] * 3 + [one] * 3 + [waited, quiet, (190.0, 0.95)])
    assert checked_rates("p", measure, 2, pause=0) == {"threads": 2, "one_thread": 100.0, "all_threads": 195.0,
                                              "scaling": 1.95, "concurrency": 0.98, "attempts": 2}
    assert asked == [1, 1, 1, 2, 2, 2] * 2
    measure, asked = planted([one] * 3 * ATTEMPTS)  # one thread only: nothing to compare, the concurrency checked
    assert checked_rates("p", measure, 1, pause=0)["all_threads"] == 100.0 and asked == [1] * 3
    # two threads that never scale: refused after ATTEMPTS measurements
    measure, asked = planted(([one] * 3 + [(110.0, 1.0)] * 3) * ATTEMPTS)
    with pytest.raises(ProbeError, match=rf"^p: 2 threads gave 1\.10x the 1-thread rate, expected >= 1\.8x .*"
                                         rf"\(measured {ATTEMPTS} times\)$"):
        checked_rates("p", measure, 2, pause=0)
    assert len(asked) == 6 * ATTEMPTS


def test_peaks_give_the_one_thread_and_every_thread_figures_checked():
    """The real probes, short: checked figures, or a refusal that says why (a busy host); no time is asserted."""
    from ms_swiglu.tools.probes import CONCURRENCY, SCALING, ProbeError, peaks

    names, threads = ("fma_float32", "avx512_bfloat16"), len(os.sched_getaffinity(0))
    try:
        measured = peaks(seconds=0.01, names=names)
    except ProbeError as e:
        assert re.match(r"compute peak probe (fma_float32|avx512_bfloat16): .*expected >= .*\(measured 3 times\)$",
                        str(e)), e
        return
    assert set(measured) == {*names, "threads", "one_thread", "scaling", "concurrency"}
    assert measured["threads"] == threads and measured["fma_float32"] > 0
    for name in names:
        if measured[name] is None:  # a CPU without the instructions
            assert measured["one_thread"][name] is measured["scaling"][name] is None
            continue
        assert measured["scaling"][name] == pytest.approx(measured[name] / measured["one_thread"][name])
        assert measured["scaling"][name] >= SCALING * threads and measured["concurrency"][name] >= CONCURRENCY


def test_the_read_probe_records_its_one_thread_rate_beside_every_threads():
    import numpy as np

    from ms_swiglu.tools.probes import CONCURRENCY, ProbeError, read_rates

    try:
        rates = read_rates(np.ones(1 << 25, np.float32))  # 128 MiB: the structure, not the host's bandwidth
    except ProbeError as e:  # only the concurrency refuses a read (the memory bounds its scaling)
        assert re.match(r"read probe: a thread ran \d+% of its call's wall time .*\(measured 3 times\)$", str(e)), e
        return
    assert set(rates) == {"threads", "one_thread", "all_threads", "scaling", "concurrency", "attempts"}
    assert rates["threads"] == len(os.sched_getaffinity(0)) and rates["one_thread"] > 0
    assert rates["scaling"] == pytest.approx(rates["all_threads"] / rates["one_thread"])
    assert rates["concurrency"] >= CONCURRENCY and 1 <= rates["attempts"] <= 3


def test_a_fraction_above_its_ceiling_has_the_ceiling_measured_again_once_or_refuses_the_run():
    from ms_swiglu.tools.probes import Ceiling, CeilingError

    peak = Ceiling("compute peak of bfloat16", 234.5, "GFLOP/s")
    assert peak.fractions({"a": 117.25, "b": 234.5}) == {"a": 0.5, "b": 1.0} and peak.record() is None
    with pytest.raises(CeilingError, match=r"^b: 280\.7 GFLOP/s is 119\.7% of the compute peak of bfloat16 \(234\.5 "
                                           r"GFLOP/s; no way to measure it again\), expected <= 100%"):
        peak.fractions({"a": 100.0, "b": 280.7})
    asked = []
    peak = Ceiling("compute peak of bfloat16", 234.5, "GFLOP/s", lambda: asked.append(1) or 469.0)
    assert peak.fractions({"a": 100.0, "b": 280.7}) == {"a": 100.0 / 469.0, "b": 280.7 / 469.0}  # all of one value
    assert peak.fractions({"c": 400.0}) == {"c": 400.0 / 469.0} and peak.value == 469.0
    assert peak.record() == {"first": 234.5, "again": 469.0}
    with pytest.raises(CeilingError, match=r"^c: 500\.0 GFLOP/s is 106\.6% of the compute peak of bfloat16 \(234\.5 "
                                           r"GFLOP/s; measured again: 469\.0 GFLOP/s\)"):
        peak.fractions({"c": 500.0})
    assert asked == [1]  # once
    read = Ceiling("read probe", 30.0, "GB/s", lambda: 25.0)  # measured again lower: the higher value kept
    with pytest.raises(CeilingError, match=r"^x: 33\.6 GB/s is 112\.0% of the read probe \(30\.0 GB/s; measured "
                                           r"again: 25\.0 GB/s\)"):
        read.fractions({"x": 33.6})
    assert read.value == 30.0


def test_bench_quant_gives_its_fractions_by_the_ceiling_rule():
    from ms_swiglu.tools.bench_quant import _fractions
    from ms_swiglu.tools.probes import Ceiling, CeilingError

    bf16, int8 = {"GB/s": 30.0, "median_ms": 20.0}, {"GB/s": 33.0, "median_ms": 10.0}
    # int8 reads above the probe's median in the rounds: the probe measured again (36 GB/s), every entry against it
    _fractions({"bfloat16": (bf16, 0), "int8": (int8, 400_000_000)}, Ceiling("read probe", 31.0, "GB/s", lambda: 36.0),
               Ceiling("peak of int8_vpmaddwd", 50.0, "G weights/s"))
    assert (bf16["fraction_of_read"], int8["fraction_of_read"]) == (30.0 / 36.0, 33.0 / 36.0)
    assert int8["fraction_of_conversion_peak"] == 0.8 and "fraction_of_conversion_peak" not in bf16  # 40 G/s of 50
    with pytest.raises(CeilingError, match=r"^int8: 80\.0 G weights/s is 160\.0% of the peak of int8_vpmaddwd"):
        _fractions({"int8": (dict(int8, median_ms=5.0), 400_000_000)}, Ceiling("read probe", 100.0, "GB/s"),
                   Ceiling("peak of int8_vpmaddwd", 50.0, "G weights/s"))


def test_the_bench_and_its_probe_processes_never_import_from_the_working_directory(bench_run):
    """conftest's shared bench (its memory probe processes) runs from a working directory whose glob, json, numpy,
    subprocess, safetensors and mindspore modules leave a mark if imported."""
    from conftest import pwned

    assert bench_run.result.returncode == 0, bench_run.result.stderr[-2000:]
    assert pwned(bench_run.cwd) == []
