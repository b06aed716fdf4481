"""docs/performance.md: written by tools/docs.py from the benchmark results stored in docs/bench/<machine kind>/
<tool>.json (the latest run of each tool per machine kind), one section per kind with each run's date and machine
and one table per tool of the ratios the tool reports. The results here are synthetic, two runs per tool on each
of two machine kinds, in the shape the tools write (bench_mlp's cells by its own ``_cell``)."""
import argparse
import json
import os
import re
import shutil
import statistics

import pytest

from ms_swiglu.tools import bench_mlp, bench_moe, bench_quant, docs
from ms_swiglu.tools.timing import DISTURBED, SLOW_CALLS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AMD = {"cpu": "AMD EPYC 7B13 64-Core Processor", "flags": ["avx2"], "cpus": 2, "l3": "32768K"}
XEON = {"cpu": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", "cpus": 8, "l3": "107520K",
        "flags": ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8"]}
KINDS = {"AMD EPYC (AVX2)": AMD, "Intel Xeon (AVX-512, AMX)": XEON}
OLD, NEW = "2025-03-01T08:00:00+00:00", "2025-04-02T17:45:12+00:00"


def _stat(times):
    return {"min_s": min(times), "median_s": statistics.median(times), "spread": 0.1, "order_effect": 0.01,
            "times_s": times}


def _disturbance(flagged=False):
    return {"other_cpu_s": 0.1, "steal_s": 0.0, "wall_s": 5.0, "fraction": 0.08 if flagged else 0.01,
            "attempts": 3 if flagged else 1, "flagged": flagged, "slow_calls": 0.0}


def mlp_result(machine, date, scale, fma=400.0, read_slower=1.0, remeasure=None):
    """A bench_mlp JSON: its cells by bench_mlp._cell from synthetic rounds (baseline 10 ms, packed-cpu 5 ms, the
    torch peer 7.5 ms at one token, times ``scale``; with the float32 peak ``fma`` and the read probe's times not
    multiplied by ``read_slower``, each figure at most 84% of its read probe, GEMM or peak), the rest as
    bench_mlp.run / main / timing.write_json write; ``remeasure`` as bench_mlp._cell's."""
    args = argparse.Namespace(jit=["O0"], layers=1, model_blocks=0, memory=False)
    peaks = {"fma_float32": fma, "avx512_bfloat16": 800.0, "amx_bfloat16": None, "int8_widen": 100.0,
             "int8_vpdpwssd": 150.0, "int8_vpmaddwd": 120.0, "int16_gemm_vpmaddwd": 190.0}
    dtypes, cells = ("float32", "bfloat16"), []
    for n in (1, 16):
        keys = [(v, j, d, "mlp") for d in dtypes for v, j in (("baseline", "O0"), ("packed-cpu", "O0"),
                                                                ("peer-torch", "eager"))]
        ms = {"baseline": 10.0, "packed-cpu": 5.0, "peer-torch": 7.5}
        stats = {}
        for v, j, d, kind in keys:
            t = ms[v] * scale * n ** 0.5 * (0.6 if d == "bfloat16" else 1.0) / 1e3
            stats[f"{v}/{j}/{d}/{kind}"] = _stat([t, t * 1.1, t * 0.95])
        for d in dtypes:
            half = 0.5 if d == "bfloat16" else 1.0
            stats[f"ceiling/library/{d}"] = _stat([0.0006 * n * scale * half] * 3)
            stats[f"ceiling/torch/{d}"] = _stat([0.0007 * n * scale * half] * 3)
        stats["ceiling/mindspore/float32"] = _stat([0.006 * n] * 3)
        stats["ceiling/numpy/float32"] = _stat([0.007 * n] * 3)
        stats["graph call/mindspore"] = _stat([0.001] * 3)
        if n == 1:  # 1 GiB in 8.5 ms: llama-7b's float32 weights (541 MB) in 5 ms are 86% of it
            stats["read/omp"] = _stat([t * scale * read_slower for t in (0.008, 0.0085, 0.0079)])
        for d in dtypes:
            cells.append(bench_mlp._cell(args, "llama-7b", d, n, stats, _disturbance(flagged=n == 16), peaks,
                                         20.0 / scale, 15.0 / scale, keys, remeasure))
    return {"machine": machine, "read_gbps": 20.0 / scale, "rw_gbps": 15.0 / scale, "peaks_gflops": peaks,
            "disturbed_above": DISTURBED, "slow_calls_above": SLOW_CALLS, "host_probe_best": {"read": 2e10},
            "results": cells,
            "args": {"preset": ["llama-7b"], "tokens": [1, 16], "dtype": list(dtypes), "variants": ["baseline",
                     "packed-cpu"], "jit": ["O0"], "rounds": 3, "layers": 1, "model_blocks": 0, "retries": 2,
                     "settle": 0.5, "peer_python": "/usr/bin/python3", "memory": False, "json": "b.json",
                     "plot": None, "force": False},
            "seconds": 100.0, "date": date}


def _quant_entry(ms, nbytes, read=None):
    e = {"median_ms": ms, "min_ms": ms * 0.9, "spread": 0.05, "bytes": nbytes, "GB/s": nbytes / ms / 1e6}
    if read:
        e["fraction_of_read"] = e["GB/s"] / read
    return e


def quant_result(machine, date, scale):
    """A bench_quant JSON in the shape bench_quant.main / speed write (its rows are built inside the timed loop)."""
    rows = []
    for n in (1, 16):
        read = 60.0 / scale if n == 1 else None  # each entry's GB/s at most 83% of it
        row = {"tokens": n, "shapes": ["dynamic", "static"], "disturbance": _disturbance(),
               "graph_call_ms": {"median": 1.0, "min": 0.9}}
        if n > 1:
            row["multiply_peaks"] = {"fma_float32": 200.0, "int16_gemm_vpmaddwd": 190.0}
        for suffix, extra in (("", 1.0), (" static", 0.8)):
            b, q = 30.0 * scale * extra * n ** 0.3, 16.0 * scale * extra * n ** 0.4
            row["bfloat16" + suffix] = dict(_quant_entry(b, 811e6, read), over_library_ms=1.0)
            row["int8" + suffix] = dict(_quant_entry(q, 406e6, read), over_library_ms=1.1)
            if n == 1:
                row["int8" + suffix]["fraction_of_conversion_peak"] = 0.4
            s = row["int8/bf16 speedup" + suffix] = {"median": b / q, "min": b / q * 1.02,
                                                    "paired": {"median": b / q * 0.99, "p10": b / q * 0.9,
                                                               "p90": b / q * 1.1}}
            if n == 1:
                s["ceiling"] = 2.5 / scale
        row["bfloat16 library"] = _quant_entry(29.0 * scale, 811e6, read)
        row["int8 library"] = _quant_entry(15.0 * scale * n ** 0.4, 406e6, read)
        if n == 1:
            row["read_probe_GB/s"] = read
            row["int8_conversion_peak"] = {"probe": "int8_vpmaddwd", "G weights/s": 60.0}
            row["projections"] = {proj: {"bfloat16": _quant_entry(b, 500e6, read), "int8": _quant_entry(q, 250e6, read),
                                         "int8/bf16 speedup": {"median": b / q, "paired": {"median": b / q,
                                                                                           "p10": 1.5, "p90": 2.1}}}
                                  for proj, b, q in (("gate_up", 20.0 * scale, 11.0 * scale),
                                                     ("down", 10.0 * scale, 6.0 * scale))}
        rows.append(row)
    accuracy = [{"outliers": o, "scales": s, "max_rel": 0.0328 * scale, "mean_rel": 0.00033, "frobenius_rel": 0.0145}
                for o in ("rows", "columns") for s in ("per output row", "per group of 128")]
    return {"machine": machine, "date": date, "preset": "llama-7b", "hidden": 4096, "intermediate": 11008,
            "layers": 3, "repeat": 1, "rounds": 7, "settle_s": 0.5, "accuracy": accuracy, "speed": rows}


def moe_result(machine, date, scale):
    """A bench_moe JSON in the shape bench_moe.run / main write (its cells are built inside the timed loop)."""
    hidden, inter, e, k = 2048, 768, 128, 8
    results = []
    for d in ("float32", "bfloat16"):
        for n in (1, 256):
            moe, dense = _stat([0.004 * scale * n ** 0.5] * 3), _stat([0.003 * scale * n ** 0.5, 0.0031, 0.0029])
            read = {"median": 20.0, "best": 22.0} if n == 1 else None
            cell = {"shape": "qwen3-30b-a3b", "dtype": d, "tokens": n, "hidden": hidden, "inter": inter, "experts": e,
                    "top_k": k, "moe": moe, "dense": dense, "moe_over_dense": moe["median_s"] / dense["median_s"],
                    "moe_over_dense_min": moe["min_s"] / dense["min_s"],
                    "expected_active_experts": e * (1 - (1 - k / e) ** n), "all_experts_read_floor_ms": 70.0,
                    "read_gbps_in_rounds": read}
            if n == 1:
                cell["weight_gbps"] = 9.0 / scale
                cell["fraction_of_read"] = cell["weight_gbps"] / read["median"]
            results.append(cell)
    for d in ("float32", "bfloat16"):  # the probes' entries, after a shape's timed cells
        results.append({"shape": "qwen3-30b-a3b", "dtype": d,
                        "build_and_first_call_s": {"8": [0.1 * scale, 0.2, 1.5], "128": [0.3, 2.5 * scale, 1.75]},
                        "peak_added_bytes": {"256": 3.5 * 2**20 * scale}, "activation_bytes_tk_h_plus_i": 2**22,
                        "stacked_weight_bytes": 3 * e * hidden * inter * 4})
    return {"machine": machine, "read_gbps": 20.0, "backend": "cpu", "results": results,
            "args": {"shape": ["qwen3-30b-a3b"], "tokens": None, "dtype": ["float32", "bfloat16"], "backend": "cpu",
                     "rounds": 7, "no_probes": False, "json": "m.json"}, "date": date}


def moe_quant_result(machine, date, scale):
    """A bench_moe_quant JSON in the shape bench_moe_quant.run / main write."""
    results = [{"tokens": 1, "quant": q, "min_ms": 0.9 * ms, "median_ms": ms, "speedup_vs_int8": 4.0 * scale / ms,
                "paired": {"median": 1.3, "p10": 1.2, "p90": 1.4} if q != "int8" else None,
                "weights_gbps": 30.0 / scale} for q, ms in (("int8", 4.0 * scale), ("int4-g128", 3.0 * scale))]
    return {"machine": machine, "shape": "qwen3-30b-a3b", "layers": 3, "results": results, "date": date,
            "args": {"shape": "qwen3-30b-a3b", "quant": ["int8", "int4-g128"], "layers": 3, "tokens": [1],
                     "rounds": 7, "json": "q.json"}}


RESULTS = {"bench_mlp": mlp_result, "bench_quant": quant_result, "bench_moe": moe_result,
           "bench_moe_quant": moe_quant_result}


def _x(v):
    return f"{v:.2f}x"


def _paired(p):
    return f"{p['median']:.2f}x ({p['p10']:.2f}-{p['p90']:.2f})"


def expected_tables(tool, data):
    """The tables a tool's result should give, as lists of {header: cell}, from the JSON's numbers."""
    if tool == "bench_mlp":
        rows = []
        for c in data["results"]:
            for key, e in c["variants"].items():
                n = c["tokens"]
                rows.append({"preset": c["preset"], "dtype": c["dtype"], "N": str(n), "variant": key,
                             "median ms": f"{e['median_s'] * 1e3:.2f}", "vs baseline": _x(e["speedup_vs_baseline"]),
                             "vs torch (paired)": _paired(e["paired_vs_peer"]),
                             "vs float32": _x(e["speedup_vs_float32"]) if c["dtype"] == "bfloat16" else "-",
                             "of read probe": f"{e['fraction_of_ceiling']:.0%}" if n == 1 else "-",
                             "of best GEMM": f"{e['fraction_of_ceiling']:.0%}" if n > 1 else "-",
                             "of peak": f"{e['fraction_of_peak']:.1%}",
                             "flag": "DISTURBED" if c["disturbance"]["flagged"] else "-"})
        return [rows]
    if tool == "bench_quant":
        rows = []
        for r in data["speed"]:
            def row(calls, b, q, speedup, paired="-", ceiling="-"):
                return {"N": str(r["tokens"]), "format": "int8", "calls": calls, "bfloat16 ms": f"{b['median_ms']:.2f}",
                        "quantized ms": f"{q['median_ms']:.2f}", "speed-up": _x(speedup), "paired (p10-p90)": paired,
                        "at its ceiling": ceiling,
                        "bfloat16 of read": f"{b['fraction_of_read']:.0%}" if "fraction_of_read" in b else "-",
                        "quantized of read": f"{q['fraction_of_read']:.0%}" if "fraction_of_read" in q else "-"}
            for suffix, label in (("", "graph, dynamic shapes"), (" static", "graph, static shapes")):
                s = r["int8/bf16 speedup" + suffix]
                rows.append(row(label, r["bfloat16" + suffix], r["int8" + suffix], s["median"], _paired(s["paired"]),
                                _x(s["ceiling"]) if "ceiling" in s else "-"))
            b, q = r["bfloat16 library"], r["int8 library"]
            rows.append(row("library", b, q, b["median_ms"] / q["median_ms"]))
            for proj, e in r.get("projections", {}).items():
                s = e["int8/bf16 speedup"]
                rows.append(row(f"{proj} alone", e["bfloat16"], e["int8"], s["median"], _paired(s["paired"])))
        accuracy = [{"outliers": a["outliers"], "scales": a["scales"], "max rel": f"{a['max_rel']:.4f}",
                     "mean rel": f"{a['mean_rel']:.5f}", "Frobenius rel": f"{a['frobenius_rel']:.4f}"}
                    for a in data["accuracy"]]
        peaks = next((r["multiply_peaks"] for r in data["speed"] if r.get("multiply_peaks")), {})
        ceilings = [{"multiply peak above one token": k, "GOP/s": f"{v:.0f}",
                     "vs float32 FMA": _x(v / peaks["fma_float32"])} for k, v in peaks.items() if v]
        return [rows, *([ceilings] if ceilings else []), accuracy]
    if tool == "bench_moe_quant":
        return [[{"T": str(r["tokens"]), "experts": r["quant"], "min ms": f"{r['min_ms']:.2f}",
                  "median ms": f"{r['median_ms']:.2f}", "vs int8": _x(r["speedup_vs_int8"]),
                  "paired (p10-p90)": _paired(r["paired"]) if r["paired"] else "-",
                  "weights GB/s": f"{r['weights_gbps']:.1f}"} for r in data["results"]]]
    runs = [{"shape": c["shape"], "dtype": c["dtype"], "T": str(c["tokens"]),
             "moe ms": f"{c['moe']['median_s'] * 1e3:.2f}", "dense ms": f"{c['dense']['median_s'] * 1e3:.2f}",
             "moe/dense": _x(c["moe_over_dense"]), "moe/dense (min)": _x(c["moe_over_dense_min"]),
             "of read probe": f"{c['fraction_of_read']:.0%}" if "fraction_of_read" in c else "-"}
            for c in data["results"] if "moe" in c]
    probes = [c for c in data["results"] if "build_and_first_call_s" in c]
    build = [{"shape": c["shape"], "dtype": c["dtype"], "E": e, "build s": f"{b:.2f}", "load s": f"{w:.2f}",
              "compile and first call s": f"{f:.2f}"}
             for c in probes for e, (b, w, f) in c["build_and_first_call_s"].items()]
    memory = [{"shape": c["shape"], "dtype": c["dtype"], "T": t, "peak added MiB": f"{v / 2**20:.1f}",
               "T*k*(H+I) MiB": f"{c['activation_bytes_tk_h_plus_i'] / 2**20:.1f}",
               "stacked weights MiB": f"{c['stacked_weight_bytes'] / 2**20:.1f}"}
              for c in probes for t, v in c["peak_added_bytes"].items()]
    return [runs, build, memory]


def parse_tables(text):
    """The Markdown tables of ``text`` as lists of {header: cell}."""
    tables, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append([cell.strip() for cell in line.strip("|").split("|")])
        elif block:
            header, _, *rows = block
            tables.append([dict(zip(header, row, strict=True)) for row in rows])
            block = []
    return tables


def split(text, level):
    """``{heading: body}`` of the sections at Markdown heading ``level`` (2: "## ")."""
    mark = "\n" + "#" * level + " "
    head, *parts = ("\n" + text).split(mark)
    return {part.partition("\n")[0]: part.partition("\n")[2] for part in parts}


def test_machine_kinds_name_the_cpu_family_and_the_isa_the_kernels_choose_between():
    assert docs.machine_kind(AMD) == "AMD EPYC (AVX2)"
    assert docs.machine_kind(XEON) == "Intel Xeon (AVX-512, AMX)"
    # this repository's AVX-512 AMD host (its model name as KVM gives it), and a VNNI-only Xeon
    assert docs.machine_kind({"cpu": "AMD EPYC", "flags": ["avx2", "avx512f", "avx512_vnni", "avx512_bf16"]}) == \
        "AMD EPYC (AVX-512, AVX512-BF16)"
    assert docs.machine_kind({"cpu": "Intel(R) Xeon(R) Gold 6248 CPU", "flags": ["avx2", "avx512f", "avx512_vnni"]}) \
        == "Intel Xeon (AVX-512, AVX512-VNNI)"
    assert docs.machine_kind({"cpu": "12th Gen Intel(R) Core(TM) i7-12700H", "flags": ["avx2"]}) == "Intel Core (AVX2)"
    assert docs.machine_kind({"cpu": "unknown", "flags": []}) == "unknown (no AVX2)"
    assert [docs.slug(k) for k in KINDS] == ["amd-epyc-avx2", "intel-xeon-avx-512-amx"]


def test_performance_doc_has_a_section_per_machine_kind_with_the_latest_run_of_each_tool(tmp_path):
    root, runs = tmp_path / "repo", tmp_path / "runs"
    (root / "docs").mkdir(parents=True)
    runs.mkdir()
    shutil.copy(os.path.join(ROOT, "docs", "ascend.md"), root / "docs" / "ascend.md")
    latest = {}
    for k, (kind, machine) in enumerate(KINDS.items()):
        for t, (tool, result) in enumerate(RESULTS.items()):
            old, new = (result(machine, date, scale) for date, scale in ((OLD, 3.0), (NEW, 1.0 + 0.25 * k + 0.1 * t)))
            paths = {}
            for name, data in (("old", old), ("new", new)):
                paths[name] = runs / f"{docs.slug(kind)}-{tool}-{name}.json"
                paths[name].write_text(json.dumps(data, indent=1))
            stored = root / "docs" / "bench" / docs.slug(kind) / f"{tool}.json"
            if k == 0:  # the new run first: the old one is refused and the new one kept
                assert docs.main(["--record", tool, str(paths["new"])], root=str(root)) == 0
                assert docs.main(["--record", tool, str(paths["old"])], root=str(root)) == 2
            else:  # the old run first: the new one replaces it
                assert docs.main(["--record", tool, str(paths["old"])], root=str(root)) == 0
                assert json.loads(stored.read_text())["date"] == OLD
                assert docs.main(["--record", tool, str(paths["new"])], root=str(root)) == 0
            want = json.loads(paths["new"].read_text())  # the run's JSON without the host's paths
            for key in ("json", "plot"):
                want.get("args", {}).pop(key, None)
            if want.get("args", {}).get("peer_python"):
                want["args"]["peer_python"] = "(torch)"
            assert json.loads(stored.read_text()) == want
            latest[kind, tool] = new
    text = (root / "docs" / "performance.md").read_text()  # written by --record
    assert text == docs.performance_doc(str(root / "docs" / "bench"))
    assert docs.main(["--check"], root=str(root)) == 0
    sections = split(text, 2)
    assert list(sections) == sorted(KINDS)  # one section per machine kind
    assert "2025-03-01" not in text  # no history: only the latest run of each tool
    for kind, machine in KINDS.items():
        body = sections[kind]
        line = f"{machine['cpu']}, {machine['cpus']} CPUs, {' '.join(machine['flags'])}, L3 {machine['l3']}"
        assert parse_tables(body.split("\n### ")[0])[0] == [
            {"tool": f"`{name}`", "date": "2025-04-02 17:45 UTC", "machine": line, "settings": f"`{settings}`"}
            for name, settings in (("ms-swiglu bench", "--preset llama-7b --layers 1 --rounds 3 --peer-python (torch)"),
                                   ("python -m ms_swiglu.tools.bench_quant",
                                    "--preset llama-7b --layers 3 --repeat 1 --rounds 7"),
                                   ("python -m ms_swiglu.tools.bench_moe", "--backend cpu --rounds 7"),
                                   ("python -m ms_swiglu.tools.bench_moe_quant",
                                    "--shape qwen3-30b-a3b --layers 3 --rounds 7"))]
        tools = split(body, 3)
        assert list(tools) == list(RESULTS)
        for tool in RESULTS:
            assert parse_tables(tools[tool]) == expected_tables(tool, latest[kind, tool]), (kind, tool)
    # spot checks against the synthetic rounds: packed-cpu twice as fast as the baseline, the peer 1.5x its time
    mlp = parse_tables(split(sections["AMD EPYC (AVX2)"], 3)["bench_mlp"])[0]
    packed = next(r for r in mlp if r["variant"] == "packed-cpu/O0" and r["N"] == "1" and r["dtype"] == "float32")
    assert (packed["median ms"], packed["vs baseline"], packed["vs torch (paired)"]) == ("5.00", "2.00x",
                                                                                         "1.50x (1.50-1.50)")
    assert packed["vs float32"] == "-" and packed["of best GEMM"] == "-" and packed["flag"] == "-"
    quant = parse_tables(split(sections["AMD EPYC (AVX2)"], 3)["bench_quant"])[0]
    assert "flag" not in quant[0]  # no run flagged: no column
    (root / "docs" / "performance.md").write_text(text.replace("5.00", "4.00"))
    assert docs.main(["--check"], root=str(root)) == 1
    assert docs.main([], root=str(root)) == 0 and (root / "docs" / "performance.md").read_text() == text


def test_record_refuses_a_result_without_a_date_or_of_another_tool(tmp_path, capsys):
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    undated = dict(mlp_result(AMD, NEW, 1.0))
    del undated["date"]
    (tmp_path / "undated.json").write_text(json.dumps(undated))
    (tmp_path / "moe.json").write_text(json.dumps(moe_result(AMD, NEW, 1.0)))
    assert docs.main(["--record", "bench_mlp", str(tmp_path / "undated.json")], root=str(root)) == 2
    assert "it lacks date" in capsys.readouterr().err
    (tmp_path / "undated.json").write_text(json.dumps(dict(undated, date="last Tuesday")))
    assert docs.main(["--record", "bench_mlp", str(tmp_path / "undated.json")], root=str(root)) == 2
    assert "expected a 'date' field (ISO 8601" in capsys.readouterr().err
    assert docs.main(["--record", "bench_mlp", str(tmp_path / "moe.json")], root=str(root)) == 2
    assert "lacks peaks_gflops" in capsys.readouterr().err
    assert docs.main(["--record", "bench_linear", str(tmp_path / "moe.json")], root=str(root)) == 2
    assert not (root / "docs" / "bench").exists() and not (root / "docs" / "performance.md").exists()


def test_the_tools_json_carries_the_machine_and_the_date(tmp_path, monkeypatch):
    """Each tool's --json as its main writes it (the measurements stubbed): what --record needs, machine and date."""
    monkeypatch.setattr(bench_mlp, "run", lambda args: {"peaks_gflops": {}, "results": []})
    monkeypatch.setattr(bench_quant, "speed", lambda *args, **kwargs: [])
    monkeypatch.setattr(bench_moe, "run", lambda args: {"read_gbps": 1.0, "backend": "cpu", "results": []})
    for tool, main, argv in (("bench_mlp", bench_mlp.main, ["--preset", "tiny"]),
                             ("bench_quant", bench_quant.main, ["--preset", "tiny"]),
                             ("bench_moe", bench_moe.main, ["--shape", "tiny"])):
        path = tmp_path / f"{tool}.json"
        assert main([*argv, "--json", str(path)]) == 0
        data = docs.load(tool, str(path))
        assert set(data["machine"]) == {"cpu", "flags", "cpus", "l3"}
        assert docs.run_date(data, tool).tzinfo is not None


def test_the_repository_performance_doc_is_what_the_tool_writes_from_docs_bench():
    bench = os.path.join(ROOT, "docs", "bench")
    with open(os.path.join(ROOT, "docs", "performance.md")) as f:
        text = f.read()
    assert text == docs.performance_doc(bench), "run python -m ms_swiglu.tools.docs"
    assert "python -m ms_swiglu.tools.docs --record TOOL FILE.json" in text
    if not any(f.endswith(".json") for _, _, files in os.walk(bench) for f in files):
        assert "No results are recorded yet" in text and "\n## " not in text


@pytest.mark.parametrize("field", ["machine", "date"])
def test_generation_refuses_a_stored_file_without_its_machine_or_date(tmp_path, field):
    data = quant_result(XEON, NEW, 1.0)
    del data[field]
    folder = tmp_path / "intel-xeon-avx-512-amx"
    folder.mkdir()
    (folder / "bench_quant.json").write_text(json.dumps(data))
    with pytest.raises(docs.InputError, match=field):
        docs.performance_doc(str(tmp_path))


def test_bench_mlp_gives_no_fraction_above_its_ceiling_measured_again_once():
    """A figure above its ceiling: the ceiling is measured again (the higher value kept) or the run refused."""
    from ms_swiglu.tools.probes import CeilingError

    # packed-cpu in float32 at N=16: 216 GFLOP/s, against a float32 peak of 100 that nothing measures again
    with pytest.raises(CeilingError, match=r"llama-7b packed-cpu/O0 float32 N=16: 216\.4 GFLOP/s is 216\.4% of the "
                                           r"compute peak of float32 \(100\.0 GFLOP/s; no way to measure it again\)"):
        mlp_result(AMD, NEW, 1.0, fma=100.0)
    asked = []
    again = {"peak": lambda dtype: asked.append(dtype) or 400.0}  # measured again: 400
    data = mlp_result(AMD, NEW, 1.0, fma=100.0, remeasure=again)
    cell = next(c for c in data["results"] if (c["dtype"], c["tokens"]) == ("float32", 16))
    assert cell["peak_gflops"] == 400.0 and "float32" in asked and "bfloat16" not in asked  # bfloat16: below its peak
    assert cell["remeasured"] == {"compute peak of float32": {"first": 100.0, "again": 400.0}}
    for e in cell["variants"].values():
        assert e["fraction_of_peak"] == pytest.approx(e["gflops"] / 400.0) and e["fraction_of_peak"] <= 1
    with pytest.raises(CeilingError, match=r"216\.4 GFLOP/s is 144\.3% of the compute peak of float32 \(100\.0 "
                                           r"GFLOP/s; measured again: 150\.0 GFLOP/s\), expected <= 100%"):
        mlp_result(AMD, NEW, 1.0, fma=100.0, remeasure={"peak": lambda dtype: 150.0})
    # the decode fraction's ceiling (the read probe in the same rounds) likewise
    with pytest.raises(CeilingError, match=r"packed-cpu/O0 float32 N=1: .* of the read probe's median in the same "
                                           r"rounds .* measured again: 1\.0 GB/s"):
        mlp_result(AMD, NEW, 1.0, read_slower=2.0, remeasure={"read": lambda: 1.0})
    data = mlp_result(AMD, NEW, 1.0, read_slower=2.0, remeasure={"read": lambda: 200.0})
    cell = data["results"][0]
    assert cell["remeasured"] == {f"read probe's {k} in the same rounds": {"first": cell["read_gbps_in_rounds"][k],
                                                                           "again": 200.0} for k in ("median", "best")}
    assert cell["variants"]["packed-cpu/O0"]["fraction_of_ceiling"] == pytest.approx(
        cell["variants"]["packed-cpu/O0"]["weight_gbps"] / 200.0)


@pytest.mark.parametrize("tool, where, field, row", [
    ("bench_mlp", lambda d: d["results"][2]["variants"]["packed-cpu/O0"], "fraction_of_peak",
     "results[2] (llama-7b float32 N=16).variants.packed-cpu/O0.fraction_of_peak"),
    ("bench_quant", lambda d: d["speed"][0]["int8"], "fraction_of_read", "speed[0] (N=1).int8.fraction_of_read"),
    ("bench_moe", lambda d: d["results"][0], "fraction_of_read",
     "results[0] (qwen3-30b-a3b float32 N=1).fraction_of_read")])
def test_generation_refuses_a_fraction_above_100_percent_and_writes_one_at_100(tmp_path, capsys, tool, where,
                                                                                field, row):
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    data = RESULTS[tool](AMD, NEW, 1.0)
    where(data)[field] = 1.197  # as a run recorded before the probes were checked on every thread
    (tmp_path / "above.json").write_text(json.dumps(data))
    assert docs.main(["--record", tool, str(tmp_path / "above.json")], root=str(root)) == 2
    err = capsys.readouterr().err
    assert f"above.json: {row} = 1.197 (119.7%), expected <= 100% of its ceiling" in err
    assert not (root / "docs" / "bench").exists() and not (root / "docs" / "performance.md").exists()
    folder = root / "docs" / "bench" / "amd-epyc-avx2"  # stored by hand: the generator refuses it too
    folder.mkdir(parents=True)
    (folder / f"{tool}.json").write_text(json.dumps(data))
    with pytest.raises(docs.InputError, match=re.escape(f"{tool}.json: {row} = 1.197 (119.7%)")):
        docs.performance_doc(str(root / "docs" / "bench"))
    where(data)[field] = 1.0  # at the ceiling: written
    (folder / f"{tool}.json").write_text(json.dumps(data))
    assert "| 100% |" in docs.performance_doc(str(root / "docs" / "bench")).replace("100.0%", "100%")
