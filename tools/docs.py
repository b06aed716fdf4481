"""Writes the parts of docs/ that come from the code and the measurements: the Ascend support table of
docs/ascend.md, from ``ms_swiglu.backends.ascend_support``, and docs/performance.md, from the benchmark results
stored in docs/bench/<machine kind>/<tool>.json (the latest run of each tool per machine kind: no history).

    python -m ms_swiglu.tools.docs                          rewrite both documents
    python -m ms_swiglu.tools.docs --check                  exit 1 where a document differs from what it would write
    python -m ms_swiglu.tools.docs --record TOOL FILE.json  store a run (TOOL: bench_mlp, bench_quant, bench_moe;
                                                            FILE.json: the tool's --json output), then rewrite
                                                            docs/performance.md

The machine kind of a result comes from its ``machine`` field (tools/timing.py: write_json; tools/probes.py:
machine): the CPU's vendor and family from its model name, and the widest vector ISA with the matrix / dot
extension the kernels choose between, e.g. "AMD EPYC (AVX2)", "AMD EPYC (AVX-512, AVX512-BF16)",
"Intel Xeon (AVX-512, AMX)". A recorded run replaces the stored one of its tool and kind unless that one is later
(the ``date`` field, when the run started).

No figure is written as more than 100% of the ceiling it is a fraction of: a result with a ``fraction_of_*`` field
above 1 (the "of peak", "of read", "of best GEMM" cells) is refused, to record or to write from (the benchmarks
refuse to produce one: tools/probes.py, Ceiling); the run is recorded again instead."""
import argparse
import datetime
import glob
import json
import os
import re
import sys

from ms_swiglu.backends import ascend_support
from ms_swiglu.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- support table:", "<!-- end of support table -->"
TOOLS = {  # tool: (what runs it, the fields its JSON has beside machine and date)
    "bench_mlp": ("ms-swiglu bench", ("peaks_gflops", "results")),
    "bench_quant": ("python -m ms_swiglu.tools.bench_quant", ("speed",)),
    "bench_moe": ("python -m ms_swiglu.tools.bench_moe", ("backend", "results")),
    "bench_moe_quant": ("python -m ms_swiglu.tools.bench_moe_quant", ("shape", "layers", "results")),
    "bench_convert": ("python -m ms_swiglu.tools.bench_convert", ("args", "results")),
    "bench_ep": ("python -m ms_swiglu.tools.bench_ep", ("ranks", "results")),
}
RECORD = "python -m ms_swiglu.tools.docs --record TOOL FILE.json"


def ascend_doc(text):
    """docs/ascend.md's text with the support table between its markers written anew."""
    head, _, rest = text.partition(BEGIN)
    marker, _, rest = rest.partition("\n")
    _, _, tail = rest.partition(END)
    return "\n".join([head + BEGIN + marker, *ascend_support.table(), END + tail])


# --- machine kinds -------------------------------------------------------------------------------------------------

def machine_kind(machine):
    """The kind of a result's ``machine`` (``{"cpu", "flags", ...}``): "<vendor> <family> (<vector ISA>[, <matrix or
    dot extension>])". Vendor and family: the word after Intel or AMD in the model name ("(R)", "(TM)" dropped),
    else its first two words; vector ISA: AVX-512 (avx512f), else AVX2, else "no AVX2"; extension: AMX (amx_bf16),
    else AVX512-BF16, else AVX512-VNNI, where the CPU has one."""
    words = re.sub(r"\((R|TM)\)", " ", str(machine.get("cpu") or "unknown"), flags=re.I).split()
    vendor = next((i for i, w in enumerate(words) if w.lower() in ("intel", "amd")), 0)
    name = " ".join(words[vendor:vendor + 2]) or "unknown"
    flags = set(machine.get("flags") or ())
    isa = ["AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"]
    extensions = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512_vnni", "AVX512-VNNI"))
    isa += [label for flag, label in extensions if flag in flags][:1]
    return f"{name} ({', '.join(isa)})"


def slug(kind):
    """The folder name of a machine kind under docs/bench: "AMD EPYC (AVX2)" -> "amd-epyc-avx2"."""
    return re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-")


def machine_line(machine):
    """A result's machine as the benchmarks print it (tools/probes.py: machine_line), without "machine: "."""
    return f"{machine['cpu']}, {machine['cpus']} CPUs, {' '.join(machine['flags'])}, L3 {machine['l3']}"


def run_date(data, where):
    """The start of a result's run (its ``date``, ISO 8601), as an aware datetime."""
    try:
        date = datetime.datetime.fromisoformat(data["date"])
    except (KeyError, TypeError, ValueError):
        raise InputError(f"{where}: expected a 'date' field (ISO 8601, written by the benchmark tools' --json), got "
                         f"{data.get('date')!r}") from None
    return date if date.tzinfo else date.replace(tzinfo=datetime.timezone.utc)


def load(tool, path, fractions=True):
    """A benchmark result: the tool's JSON with its machine, date and the tool's own fields (and, unless
    ``fractions`` is False, no figure above its ceiling)."""
    if tool not in TOOLS:
        raise InputError(f"tool: expected one of {', '.join(TOOLS)}, got {tool!r}")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: expected a JSON result of {tool}, could not read it: {e}") from None
    missing = [k for k in ("machine", "date", *TOOLS[tool][1]) if not isinstance(data, dict) or k not in data]
    if missing:
        raise InputError(f"{path}: expected a JSON result of {tool} (fields machine, date, "
                         f"{', '.join(TOOLS[tool][1])}), it lacks {', '.join(missing)}")
    if not {"cpu", "flags", "cpus", "l3"} <= set(data["machine"]):
        raise InputError(f"{path}: expected machine with cpu, flags, cpus, l3, got {data['machine']!r}")
    run_date(data, path)
    if fractions:
        check_fractions(data, path)
    return data


def _above_one(node, path):
    """(path, value) of every ``fraction_of_*`` field above 1 under ``node``; a path names a row of a list by its
    index and the fields that tell it (preset or shape, dtype, tokens), e.g. "results[4] (llama-7b bfloat16 N=16)"."""
    if isinstance(node, dict):
        for key, value in node.items():
            if str(key).startswith("fraction_of") and isinstance(value, (int, float)) and value > 1:
                yield f"{path}.{key}" if path else key, value
            else:
                yield from _above_one(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, row in enumerate(node):
            tell = [str(row[k]) for k in ("preset", "shape", "dtype") if isinstance(row, dict) and k in row]
            tell += [f"N={row['tokens']}"] if isinstance(row, dict) and "tokens" in row else []
            yield from _above_one(row, f"{path}[{i}]" + (f" ({' '.join(tell)})" if tell else ""))


def check_fractions(data, where):
    """Refuses (InputError naming the file, the row and the value) a result with a fraction of a ceiling above 1:
    a figure above its ceiling says that the ceiling was measured low, not that the figure beat it."""
    above = list(_above_one(data, ""))
    if above:
        (row, value), more = above[0], f" (and {len(above) - 1} more)" if len(above) > 1 else ""
        raise InputError(f"{where}: {row} = {value:.4g} ({value:.1%}), expected <= 100% of its ceiling{more}: a "
                         f"figure above its ceiling says the ceiling was measured low; record the run again")


def record(tool, path, bench_dir):
    """Store the result ``path`` of ``tool`` as ``bench_dir/<kind slug>/<tool>.json`` (replacing the stored run,
    unless that one is later); returns where."""
    data = load(tool, path)
    dest = os.path.join(bench_dir, slug(machine_kind(data["machine"])), f"{tool}.json")
    if os.path.exists(dest):
        stored = load(tool, dest, fractions=False)  # (only its date counts: the new run replaces it)
        if run_date(stored, dest) > run_date(data, path):
            raise InputError(f"{path}: expected a run no older than the stored {dest} ({stored['date']}), got one of "
                             f"{data['date']}; kept the stored one")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    args = data.get("args")
    if isinstance(args, dict):  # paths of the host that ran it say nothing about the result
        for key in ("json", "plot"):
            args.pop(key, None)
        if args.get("peer_python"):
            args["peer_python"] = "(torch)"
    with open(dest + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(dest + ".tmp", dest)
    return dest


# --- docs/performance.md ---------------------------------------------------------------------------------------------

def _x(v):
    return "-" if v is None else f"{v:.2f}x"


def _pct(v, digits=0):
    return "-" if v is None else f"{v:.{digits}%}"


def _ms(v):
    return "-" if v is None else f"{v:.2f}"


def _paired(p):
    return "-" if not p else f"{p['median']:.2f}x ({p['p10']:.2f}-{p['p90']:.2f})"


def table(columns, rows):
    """A Markdown table; ``columns``: (header, numeric, optional); an optional column with "-" in every row is
    left out."""
    keep = [i for i, (_, _, optional) in enumerate(columns) if not optional or any(r[i] != "-" for r in rows)]
    lines = ["| " + " | ".join(columns[i][0] for i in keep) + " |",
             "|" + "|".join("---:" if columns[i][1] else "---" for i in keep) + "|"]
    return lines + ["| " + " | ".join(str(r[i]) for i in keep) + " |" for r in rows]


def _flag(disturbance):
    return "DISTURBED" if disturbance and disturbance.get("flagged") else "-"


def mlp_tables(data):
    """``ms-swiglu bench``: per (preset, dtype, N) and variant, the median and the tool's ratios."""
    columns = [("preset", False, False), ("dtype", False, False), ("N", True, False), ("variant", False, False),
               ("median ms", True, False), ("vs baseline", True, False), ("vs torch (paired)", True, True),
               ("vs float32", True, True), ("of read probe", True, True), ("of best GEMM", True, True),
               ("of peak", True, False), ("flag", False, True)]
    rows = []
    for cell in data["results"]:
        n = cell["tokens"]
        entries = [*cell["variants"].items(), *((f"{k} in model", e) for k, e in cell.get("in_model", {}).items())]
        for key, e in entries:
            rows.append([cell["preset"], cell["dtype"], n, key, _ms(e["median_s"] * 1e3),
                         _x(e["speedup_vs_baseline"]),
                         _paired(e["paired_vs_peer"]) if e.get("paired_vs_peer") else "-",
                         _x(e["speedup_vs_float32"]) if cell["dtype"] != "float32" else "-",
                         _pct(e["fraction_of_ceiling"]) if n == 1 else "-",
                         _pct(e["fraction_of_ceiling"]) if n > 1 else "-",
                         _pct(e["fraction_of_peak"], 1), _flag(cell["disturbance"])])
    return [table(columns, rows)]


def _quants(row):
    """The int8 formats of a bench_quant row, in its order (the keys "<q>/bf16 speedup[ static]")."""
    out = []
    for key in row:
        m = re.fullmatch(r"(.+)/bf16 speedup( \w+)?", key)
        if m and m.group(1) not in out:
            out.append(m.group(1))
    return out


def _graph_name_of(row, q):
    return q if row["shapes"][0] == "dynamic" else f"{q} {row['shapes'][0]}"


def quant_tables(data):
    """bench_quant: per N, quantized format and calls (the graph with dynamic / static shapes, the library's calls,
    each projection alone at N=1), bfloat16's and the format's median, the speed-up, paired by round, at the
    format's ceiling, the fractions of the read probe and (W8A8 above one token) of its integer dot's peak; the
    multiplies' peaks above one token against the float32 FMAs'; the accuracy table where it ran."""
    columns = [("N", True, False), ("format", False, False), ("calls", False, False), ("bfloat16 ms", True, False),
               ("quantized ms", True, False), ("speed-up", True, False), ("paired (p10-p90)", True, True),
               ("at its ceiling", True, True), ("bfloat16 of read", True, True), ("quantized of read", True, True),
               ("of int8 dot peak", True, True), ("flag", False, True)]
    rows = []
    for row in data["speed"]:
        n, flag = row["tokens"], _flag(row["disturbance"])
        for q in _quants(row):
            calls = [(f"graph, {sh} shapes", *(row[name if sh == "dynamic" else f"{name} {sh}"]
                                                for name in ("bfloat16", q, f"{q}/bf16 speedup")))
                     for sh in row["shapes"]]
            calls.append(("library", row["bfloat16 library"], row[f"{q} library"], None))
            calls += [(f"{proj} alone", e["bfloat16"], e[q], e[f"{q}/bf16 speedup"])
                      for proj, e in row.get("projections", {}).items()]
            if "peer-torch" in row:  # (its "bfloat16 ms": PyTorch's eager MLP on the dequantized weights)
                calls.append(("graph vs PyTorch eager", row["peer-torch"],
                              row[_graph_name_of(row, q)], row[f"{q}/peer speedup"]))
            for label, b, qe, s in calls:
                rows.append([n, q, label, _ms(b["median_ms"]), _ms(qe["median_ms"]),
                             _x(s["median"] if s else b["median_ms"] / qe["median_ms"]),
                             _paired(s and s.get("paired")), _x(s and s.get("ceiling")),
                             _pct(b.get("fraction_of_read")), _pct(qe.get("fraction_of_read")),
                             _pct(qe.get("fraction_of_int8_dot_peak")), flag])
    tables = [table(columns, rows)]
    ceilings = next((row["multiply_peaks"] for row in data["speed"] if row.get("multiply_peaks")), None)
    if ceilings:  # above one token: each multiply's peak (tools/probes.py: peaks) against the float32 FMAs'
        tables.append(table([("multiply peak above one token", False, False), ("GOP/s", True, False),
                             ("vs float32 FMA", True, False)],
                            [[name, f"{v:.0f}", _x(v / ceilings["fma_float32"])]
                             for name, v in ceilings.items() if v]))
    if data.get("accuracy"):
        tables.append(table([("outliers", False, False), ("scales", False, False), ("max rel", True, False),
                             ("mean rel", True, False), ("Frobenius rel", True, False)],
                            [[a["outliers"], a["scales"], f"{a['max_rel']:.4f}", f"{a['mean_rel']:.5f}",
                              f"{a['frobenius_rel']:.4f}"] for a in data["accuracy"]]))
    return tables


def moe_tables(data):
    """bench_moe: per (shape, dtype, T) the MoE block's and the dense MLP's medians, their ratio (also of the
    minima) and, at T=1, the active weights' fraction of the read probe; then the build probes (per number of
    experts) and the memory probe, where they ran."""
    runs = [[c["shape"], c["dtype"], c["tokens"], _ms(c["moe"]["median_s"] * 1e3), _ms(c["dense"]["median_s"] * 1e3),
             _x(c["moe_over_dense"]), _x(c["moe_over_dense_min"]), _pct(c.get("fraction_of_read"))]
            for c in data["results"] if "moe" in c]
    tables = [table([("shape", False, False), ("dtype", False, False), ("T", True, False), ("moe ms", True, False),
                     ("dense ms", True, False), ("moe/dense", True, False), ("moe/dense (min)", True, False),
                     ("of read probe", True, True)], runs)]
    probes = [c for c in data["results"] if "build_and_first_call_s" in c]
    if probes:
        tables.append(table([("shape", False, False), ("dtype", False, False), ("E", True, False),
                             ("build s", True, False), ("load s", True, False),
                             ("compile and first call s", True, False)],
                            [[c["shape"], c["dtype"], e, *(f"{v:.2f}" for v in times)]
                             for c in probes for e, times in c["build_and_first_call_s"].items()]))
        tables.append(table([("shape", False, False), ("dtype", False, False), ("T", True, False),
                             ("peak added MiB", True, False), ("T*k*(H+I) MiB", True, False),
                             ("stacked weights MiB", True, False)],
                            [[c["shape"], c["dtype"], t, f"{b / 2**20:.1f}",
                              f"{c['activation_bytes_tk_h_plus_i'] / 2**20:.1f}",
                              f"{c['stacked_weight_bytes'] / 2**20:.1f}"] for c in probes
                             for t, b in c["peak_added_bytes"].items()]))
    return tables


def moe_quant_tables(data):
    """bench_moe_quant: per T and format, the chain's min and median, against the first format (at the medians and
    paired by round) and the weight bytes a call reads per second."""
    base = data["args"]["quant"][0]
    return [table([("T", True, False), ("experts", False, False), ("min ms", True, False), ("median ms", True, False),
                   (f"vs {base}", True, False), ("paired (p10-p90)", True, True), ("weights GB/s", True, False)],
                  [[r["tokens"], r["quant"], _ms(r["min_ms"]), _ms(r["median_ms"]), _x(r[f"speedup_vs_{base}"]),
                    _paired(r["paired"]), f"{r['weights_gbps']:.1f}"] for r in data["results"]])]


def convert_tables(data):
    """bench_convert: per number of experts and output, the peak resident memory of convert on an FP8 checkpoint,
    against the float32 bytes of one expert and of the checkpoint."""
    mib = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    return [table([("E", True, False), ("layers", True, False), ("writes", False, False), ("peak MiB", True, False),
                   ("one expert float32 MiB", True, False), ("checkpoint float32 MiB", True, False),
                   ("s", True, False)],
                  [[c["experts"], c["layers"], c["quant"], mib(c["peak_resident_bytes"]),
                    mib(c["expert_float32_bytes"]), mib(c["float32_bytes"]), f"{c['seconds']:.1f}"]
                   for c in data["results"]])]


def ep_tables(data):
    """bench_ep: per shape each rank's weights against one process and the goal (the routed experts / K plus the
    replicated parts); per (shape, T) the medians of tensor and expert parallelism over the same ranks, their
    ratio paired by round, the rows each rank's experts computed, and the bytes per token against the minimum."""
    mib = lambda b: f"{b / 2**20:.0f}"  # noqa: E731
    weights = [[r["shape"], r["ranks"], mib(m["single_process"]), mib(m["ep"]), _pct(m["ep"] / m["single_process"], 1),
                mib(m["goal"]), _pct(m["goal"] / m["single_process"], 1), mib(m["tp"])]
               for r in data["results"] for m in (r["memory"],)]
    runs = []
    for r in data["results"]:
        for c in r["results"]:
            t, b = c["times"], c["bytes_per_token"]
            runs.append([r["shape"], c["tokens"], *(_ms(t[v]["median_s"] * 1e3) for v in ("tp", "ep-replicated",
                                                                                         "ep-sharded")),
                         _x(c["ep_over_tp"]["ep-replicated"]), _x(c["ep_over_tp"]["ep-sharded"]),
                         " / ".join(map(str, c["rows_per_rank"])), f"{b['minimum']:.0f}",
                         f"{b['ep_replicated']:.0f} ({b['ep_replicated'] / b['minimum']:.2f}x)",
                         f"{b['ep_sharded']:.0f} ({b['ep_sharded'] / b['minimum']:.2f}x)"])
    return [table([("shape", False, False), ("ranks", True, False), ("one process MiB", True, False),
                   ("ep rank MiB", True, False), ("of one process", True, False), ("goal MiB", True, False),
                   ("goal of one process", True, False), ("tp rank MiB", True, False)], weights),
            table([("shape", False, False), ("T", True, False), ("tp ms", True, False),
                   ("ep replicated ms", True, False), ("ep sharded ms", True, False),
                   ("replicated / tp (paired)", True, False), ("sharded / tp (paired)", True, False),
                   ("rows per rank", False, False), ("minimum bytes/token", True, False),
                   ("replicated bytes/token", True, False), ("sharded bytes/token", True, False)], runs)]


TABLES = {"bench_mlp": mlp_tables, "bench_quant": quant_tables, "bench_moe": moe_tables,
          "bench_moe_quant": moe_quant_tables, "bench_convert": convert_tables, "bench_ep": ep_tables}


def settings(tool, data):
    """The run's options that the tables do not show."""
    if tool == "bench_mlp":
        a = data.get("args", {})
        return (f"--preset {' '.join(a.get('preset', []))} --layers {a.get('layers')} --rounds {a.get('rounds')}"
                + (f" --model-blocks {a['model_blocks']}" if a.get("model_blocks") else "")
                + (" --peer-python (torch)" if a.get("peer_python") else ""))
    if tool == "bench_quant":
        return (f"--preset {data['preset']} --layers {data['layers']} --repeat {data['repeat']} "
                f"--rounds {data['rounds']}")
    a = data.get("args", {})
    if tool == "bench_convert":
        return f"--hidden {a['hidden']} --inter {a['inter']} --experts {a['experts']} --layers {a['layers']}"
    if tool == "bench_moe_quant":
        return f"--shape {data['shape']} --layers {data['layers']} --rounds {a.get('rounds')}"
    if tool == "bench_ep":
        return (f"--ranks {data['ranks']} --rounds {a.get('rounds')} ({data['dtype']}; the ranks share the host's "
                f"cores; rows per rank under random router weights; bytes at the dtype, ring collectives)")
    return f"--backend {data['backend']} --rounds {a.get('rounds')}"


def results(bench_dir):
    """``{kind: {tool: data}}`` from ``bench_dir/*/*.json``; each file's folder must be its machine kind's."""
    out = {}
    for path in sorted(glob.glob(os.path.join(bench_dir, "*", "*.json"))):
        tool = os.path.splitext(os.path.basename(path))[0]
        data = load(tool, path)
        kind = machine_kind(data["machine"])
        if os.path.basename(os.path.dirname(path)) != slug(kind):
            raise InputError(f"{path}: expected it in {slug(kind)}/ (its machine is {kind})")
        out.setdefault(kind, {})[tool] = data
    return out


def performance_doc(bench_dir):
    """docs/performance.md's text from the results stored under ``bench_dir``."""
    stored = results(bench_dir)
    lines = ["# Performance", "",
             "Generated by `python -m ms_swiglu.tools.docs` from the benchmark results in docs/bench/: the latest run",
             "of each tool per machine kind. Record a run with", "",
             f"    {RECORD}", "",
             f"(TOOL: {', '.join(TOOLS)}; FILE.json: the tool's `--json` output): it is stored as",
             "docs/bench/<machine kind>/TOOL.json, and this file is written anew.", ""]
    if not stored:
        return "\n".join(lines + ["No results are recorded yet: docs/bench/ holds none, for any machine kind.", ""])
    for kind in sorted(stored):
        tools = stored[kind]
        lines += [f"## {kind}", ""]
        lines += table([("tool", False, False), ("date", False, False), ("machine", False, False),
                        ("settings", False, False)],
                       [[f"`{TOOLS[t][0]}`", run_date(d, t).astimezone(datetime.timezone.utc).strftime(
                           "%Y-%m-%d %H:%M UTC"), machine_line(d["machine"]), f"`{settings(t, d)}`"]
                        for t, d in ((t, tools[t]) for t in TOOLS if t in tools)])
        lines.append("")
        for tool in (t for t in TOOLS if t in tools):
            lines += [f"### {tool}", ""]
            try:
                for t in TABLES[tool](tools[tool]):
                    lines += [*t, ""]
            except (KeyError, TypeError, IndexError) as e:
                raise InputError(f"docs/bench/{slug(kind)}/{tool}.json: expected a result of {tool}, lacks "
                                 f"{e}") from None
    return "\n".join(lines)


# --- the command ---------------------------------------------------------------------------------------------------

def main(argv=None, root=ROOT):
    p = argparse.ArgumentParser(prog="python -m ms_swiglu.tools.docs", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare only: exit 1 where a document differs")
    p.add_argument("--record", nargs=2, metavar=("TOOL", "FILE.json"),
                   help=f"store a benchmark result ({', '.join(TOOLS)}) as the latest of its machine kind")
    args = p.parse_args(argv)
    bench_dir = os.path.join(root, "docs", "bench")
    try:
        if args.record:
            dest = record(*args.record, bench_dir)
            print(f"recorded {args.record[1]} as {os.path.relpath(dest, root)}")
        docs = {os.path.join(root, "docs", "performance.md"): lambda text: performance_doc(bench_dir)}
        if not args.record:
            docs[os.path.join(root, "docs", "ascend.md")] = ascend_doc
        differ = 0
        for path, write in docs.items():
            text = ""
            if os.path.exists(path):
                with open(path) as f:
                    text = f.read()
            new = write(text)
            if args.check:
                if new != text:
                    print(f"{os.path.relpath(path, root)} differs from what python -m ms_swiglu.tools.docs writes",
                          file=sys.stderr)
                    differ = 1
            elif new != text:
                with open(path, "w") as f:
                    f.write(new)
        return differ
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
