"""Weight-only int8 against bfloat16 on the cpu backend: speed (interleaved, one process) and accuracy.

    python -m ms_swiglu.tools.bench_quant [--preset llama-7b] [--tokens 1 16 128 512] [--layers 3] [--repeat 1]
                                          [--rounds 7] [--quant int8 [int8-g128]] [--shapes dynamic static]
                                          [--settle S] [--accuracy] [--json FILE]

Speed: per token count, a chain of ``--layers`` packed MLPs with distinct weights (larger than the L3 together:
every layer's weights come from memory, as in a model), bfloat16 weights against their int8 quantization
(``--quant``: per output row, and / or per group of 128 inputs), the activations bfloat16 in all; interleaved
rounds with the disturbance accounting of ``tools/timing.py`` (other processes, steal, and the host's slow
phases). At N=1 the 1 GiB read probe runs in the same rounds, and each
variant's bytes per call (weights, and the int8 scales) over its median time is given as a fraction of the
probe's median read bandwidth. The speed-up is also given paired by round (``tools/timing.py: paired``):
bfloat16's time over int8's in the same round, which a slow phase of the host slows alike. Each chain runs as two
graphs over the same Cells (``--shapes``): one compiled for any number of tokens ("dynamic", as ``ms-swiglu run``
compiles it) and one per token count ("static", as a decode step of fixed batch would be); MindSpore's runtime costs
the dynamic one more per op (below).

At N=1 the int8 weights are also held against the machine's peak for the instructions the kernel spends on each
weight (``tools/probes.py: peaks``, from L1: the integer dot kernel's, VPDPWSSD or VPMADDWD, where the CPU has one,
else sign-extend, convert to float32 and FMA), and the speed-up int8 would have at the better of its two ceilings is
given beside the measured one (the conversions at that peak; the bytes at the read probe's bandwidth or at
bfloat16's own in the same rounds, the higher: the bfloat16 kernel reads faster than the probe on some hosts). On
the AMD EPYC AVX2 host the widening's conversion issues once per cycle per core, 52 G weights/s on both cores
(405 M weights of 3 llama-7b layers: 7.8 ms, against 16-21 ms for bfloat16's 811 MB there); VPMADDWD, one
conversion per 32 weights, takes both projections (x rounded to one int16 part per block of 32).

Above one token int8 weights are multiplied in float32 as bfloat16 ones are (the panel kernel's rows widened in L1
up to 128 tokens, then oneDNN), bound by the multiplies, not the bytes, from 16 tokens; an integer-dot GEMM could
only win by multiplying faster. The run gives the float32 FMA peak beside the multiplies of an int16 GEMM on
VPMADDWD (``multiply_peaks``, tools/probes.py: ``peaks``): on the AMD EPYC AVX2 host 187-196 GOP/s against 197-203
GFLOP/s on both cores (0.93-0.98x in six runs; 0.95-0.96x on one), VPMADDWD issuing about once per cycle and the
FMAs twice, so an integer-dot GEMM would not multiply faster there, and int8 runs level with bfloat16.

At N=1 the same rounds also time each projection alone through the library (``projections``: the layers'
gate_up on the input, then their down_proj on the SwiGLU output the first layer gives), since their x differ:
down_proj's, sparse and wide-ranged, kept it on the widening kernel until VPMADDWD rounded x to its blocks.

The same rounds also time each chain as direct calls of the cpu backend's C++ ops on the same weights (``the
library's calls alone``: the kernels the graph launches, checked to give the graph's output bit for bit, without
MindSpore's runtime between them) and MindSpore's cost of one graph call (``x + 1`` on one element); each graph's
median over the library's is given as the graph's own time per call. Where it goes (AMD EPYC host, ``perf sched``
over 1 s of back-to-back calls of 3 int8 llama-7b layers at one token, 12-13 ms a call): the kernels' second thread
sleeps 0.03-0.06 ms between the 6 ops of a call, static or dynamic shapes, and 0.8-1.0 ms between calls, while the
calling thread runs MindSpore's work per call (``Cell.__call__``, which walks the graph's 19 Cells, the launch, the
output). Per op it is small: back to back, graphs of 3 and 12 tiny int8 MLPs cost 0.43 / 0.75 ms a call with
static shapes and 0.60 / 1.20 ms with dynamic ones, 0.018 / 0.033 ms per op. Per call it runs slower after the call
has streamed its weights through the caches: the 3 tiny MLPs 0.46 ms a call back to back and 0.72 ms with 128 MB
read between calls, ``x + 1`` 0.33 / 0.52 ms. A decoder pays that once per token for all its layers. ``--repeat R``
applies the chain R times per graph call (R x ``--layers`` MLPs per call, as a deeper model; each MLP still reads
its weights from memory, the chain's other layers' being larger than the L3), the library's calls likewise: 3 int8
llama-7b layers x 4 at one token (three runs, all flagged for the host's slow phases), int8 / bfloat16 paired
1.81-1.93x through either graph and int8 reading 98-106% of the probe, where 3 MLPs per call gave 1.66-1.81x and
88-97% in the runs between them (the library 1.87-1.90x and 1.62-1.92x).

Accuracy (``--accuracy``, NumPy, float64): the MLP at the preset's shape with random weights (std 0.02) with
outlier rows (1% of rows x20) or outlier input columns (1% of columns x20), int8 per output row (the package's
format "int8") and per group of 128 along the input ("int8-g128") where 128 divides H and I: max and mean relative
error of the output (to each row's max |y|) and the relative Frobenius error, against the float32 weights.
"""
import argparse
import datetime
import functools
import json
import sys

import numpy as np

from ms_swiglu.checkpoint import to_bf16_bits
from ms_swiglu.config import preset as preset_shape, PRESETS
from ms_swiglu import quant as formats
from ms_swiglu.quant.base import Activation
from ms_swiglu.tools.bench_mlp import TorchPeer
from ms_swiglu.tools.probes import (Ceiling, ProbeError, graph_call, host_probes, machine_line, peaks, read_rates,
                                    read_sum)
from ms_swiglu.tools.timing import SETTLE_S, HostSpeed, add_settle_option, paired, watched, write_json

READ_PROBE_FLOATS = 2**28  # 1 GiB
SHAPES = ("dynamic", "static")


def _chain(hidden, inter, layers, quant):
    """``layers`` packed bfloat16 MLPs with distinct weights (seeded by layer), quantized to ``quant`` if given."""
    import mindspore as ms  # noqa: PLC0415

    from ms_swiglu import PackedSwiGLUMLP  # noqa: PLC0415
    from ms_swiglu.mlp import to_quantized  # noqa: PLC0415

    mlps = []
    for seed in range(layers):
        ms.set_seed(seed)
        mlp = PackedSwiGLUMLP(hidden, inter, dtype=ms.bfloat16, backend="cpu")
        mlps.append(to_quantized(mlp, quant) if quant else mlp)
    return mlps


def _graph(mlps, shapes, repeat=1):
    """The MLPs, ``repeat`` times over, as one graph: with ``shapes`` "dynamic" compiled once for any number of
    tokens (as ``ms-swiglu run`` compiles), with "static" once per token count (the ops' shapes known at compile
    time). The two graphs of a chain share its MLP Cells, so their parameters too."""
    import mindspore as ms  # noqa: PLC0415
    from mindspore import nn  # noqa: PLC0415

    net = nn.SequentialCell(mlps * repeat)
    if shapes == "dynamic":
        net.set_inputs(ms.Tensor(shape=[None, mlps[0].hidden_size], dtype=ms.bfloat16))
    return net


def _graph_name(name, shapes):
    return name if shapes == "dynamic" else f"{name} {shapes}"


def _bytes(mlps):
    return sum(p.nbytes for mlp in mlps for p in mlp.get_parameters())


# W8A8's ceilings above one token: the float32 FMAs bfloat16 runs on, then each integer dot a W8A8 GEMM could run on
# (tools/probes.py: peaks; None where the CPU lacks it)
W8A8_CEILINGS = ("fma_float32", "int8_gemm_vpdpbusd", "int16_gemm_vpmaddwd", "int8_gemm_vpmaddubsw", "amx_int8")


def w8a8_dot_peak(n):
    """The peak (tools/probes.py: peaks) of the instructions the cpu backend's W8A8 GEMM runs on this CPU at ``n``
    tokens (the tuning table's ``w8a8_dot`` for the row kernel, ``w8a8_panel_dot`` above its tokens, oneDNN's
    implementation above ``w8a8_panel_max_tokens``): VPDPBUSD with AVX512-VNNI, TDPBSSD on AMX-INT8 tiles,
    VPMADDUBSW on AVX2's panel kernel, else VPMADDWD; None for the scalar kernel."""
    from ms_swiglu.backends.cpu import kernels  # noqa: PLC0415
    t = kernels.tuning()
    rows_max, panel_max = t["w8a8_rows_max_tokens"], t["w8a8_panel_max_tokens"]
    dot = t["w8a8_panel_dot"] if rows_max is not None and n > rows_max else t["w8a8_dot"]
    if panel_max is not None and n > panel_max:  # oneDNN's int8 matmul: its tiles where its name says so
        dot = "tdpbssd" if "amx" in (t["w8a8_onednn"] or "") else "vpdpbusd"
    return {"vpdpbusd": "int8_gemm_vpdpbusd", "vpmaddwd": "int16_gemm_vpmaddwd",
            "vpmaddubsw": "int8_gemm_vpmaddubsw", "tdpbssd": "amx_int8"}.get(dot)


def _int8_activations(quant):
    return quant != "bfloat16" and formats.get(quant).activation is not Activation.NONE


def _int8_weights(mlps):
    import mindspore as ms  # noqa: PLC0415

    return sum(p.size for mlp in mlps for p in mlp.get_parameters() if p.dtype == ms.int8)


def _host_layers(mlps):
    """Per MLP of the chain: ``(its weight format's name or None, gate_up, down)``, each projection's host copy
    (bfloat16 as its bits, as the library takes it) as the list of its op's weight inputs: the weight, and with
    int8 its scales."""
    from ms_swiglu.mlp import weights  # noqa: PLC0415

    def host(a):
        return a.view(np.uint16) if a.dtype.itemsize == 2 else a

    layers = []
    for mlp in mlps:
        w = {name: host(a) for name, a in weights(mlp).items()}
        gate_up, down = ([w[k] for k in (f"{proj}.weight", f"{proj}.weight_scale") if k in w]
                         for proj in ("gate_up_proj", "down_proj"))
        layers.append((mlp.quant, gate_up, down))
    return layers


def _library(mlps, repeat=1):
    """The chain's MLPs, ``repeat`` times over, as direct calls of the cpu backend's C++ ops (``GateUpSwiglu`` +
    ``Linear`` of the weights' format: kernels.op_name, the ones its graph launches) on host copies of the same
    weights, made once, no MindSpore in between: ``call(x)`` with x bfloat16 bits [n, H] returns the last layer's output, bfloat16 bits [n, H]."""
    from ms_swiglu.backends.cpu import kernels  # noqa: PLC0415

    layers = _host_layers(mlps) * repeat
    buffers = {}  # the outputs for the current token count: [n, I] and one [n, H] per layer

    def call(x):
        n = x.shape[0]
        if n not in buffers:
            buffers.clear()
            buffers[n] = (np.empty((n, mlps[0].intermediate_size), np.uint16),
                          [np.empty((n, mlps[0].hidden_size), np.uint16) for _ in layers])
        act, outs = buffers[n]
        for (q, gate_up, down), out in zip(layers, outs):
            kernels.run(kernels.op_name("GateUpSwiglu", q), x, *gate_up, act, dtype="bfloat16")
            x = kernels.run(kernels.op_name("Linear", q), act, *down, out, dtype="bfloat16")
        return x

    return call


def _projections(mlps, x):
    """Each projection of the chain's layers alone, as the library's direct calls at one input: gate_up on x
    (bfloat16 bits [n, H]) and down on the SwiGLU output the chain's first layer gives for x, as in the chain
    (down_proj's x decides the one-token int8 kernel: its range); each with the bytes its weights (and scales)
    take: ``{"gate_up": (call, bytes), "down": (call, bytes)}``."""
    from ms_swiglu.backends.cpu import kernels  # noqa: PLC0415

    layers = _host_layers(mlps)
    act = np.empty((x.shape[0], mlps[0].intermediate_size), np.uint16)
    out = np.empty((x.shape[0], mlps[0].hidden_size), np.uint16)
    kernels.run(kernels.op_name("GateUpSwiglu", layers[0][0]), x, *layers[0][1], act, dtype="bfloat16")
    act_in = act.copy()

    def gate_up():
        for q, w, _ in layers:
            kernels.run(kernels.op_name("GateUpSwiglu", q), x, *w, act, dtype="bfloat16")

    def down():
        for q, _, w in layers:
            kernels.run(kernels.op_name("Linear", q), act_in, *w, out, dtype="bfloat16")

    return {"gate_up": (gate_up, sum(a.nbytes for _, w, _ in layers for a in w)),
            "down": (down, sum(a.nbytes for _, _, w in layers for a in w))}


def _entry(stats, name, nbytes):
    s = stats[name]
    return {"median_ms": s["median_s"] * 1e3, "min_ms": s["min_s"] * 1e3, "spread": s["spread"], "bytes": nbytes,
            "GB/s": nbytes / s["median_s"] / 1e9}


def _fractions(entries, read, peak):
    """At N=1 each entry's ``fraction_of_read`` (its GB/s over the read probe's, ``read``: a Ceiling) and, for
    ``(entry, int8 weights)`` with int8 weights, ``fraction_of_conversion_peak`` (its G weights/s over ``peak``: a
    Ceiling, or None where there is none): never above 1 (Ceiling.fractions). ``entries``: {label: (entry,
    int8 weights)}."""
    for label, f in read.fractions({label: e["GB/s"] for label, (e, _) in entries.items()}).items():
        entries[label][0]["fraction_of_read"] = f
    if peak is not None:
        weights = {label: w / (e["median_ms"] / 1e3) / 1e9 for label, (e, w) in entries.items() if w}
        for label, f in peak.fractions(weights).items():
            entries[label][0]["fraction_of_conversion_peak"] = f


def conversion_probe():
    """The name of the peak (tools/probes.py: ``peaks``) of the instructions the cpu backend's kernel spends on an
    int8 weight at one token with 16-bit x: its integer dot kernel's (the tuning table's ``int8_one_token_dot``:
    VPDPWSSD, VPMADDWD) where it has one, else the widening to float32's."""
    from ms_swiglu.backends.cpu import kernels  # noqa: PLC0415

    return f"int8_{kernels.tuning()['int8_one_token_dot'] or 'widen'}"


def conversion_peak(machine_peaks):
    """``(name, G weights/s)``: the machine's peak for one token against int8 weights in L1, by the instructions
    the cpu backend's kernel uses on this CPU at one token with 16-bit x (``machine_peaks``, tools/probes.py:
    ``peaks``): its integer dot kernel's (the tuning table's ``int8_one_token_dot``: VPDPWSSD, VPMADDWD) where it
    has one, else the widening to float32's; None where neither runs. (Non-finite x takes the widening kernel: below
    this peak.)"""
    name = conversion_probe()
    gflops = machine_peaks[name]
    return name, gflops / 2 if gflops else None


def speed(hidden, inter, tokens, layers, rounds, settle=SETTLE_S, quants=("int8",), shapes=SHAPES, repeat=1,
          peer_python=None):
    import mindspore as ms  # noqa: PLC0415

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    print(machine_line())
    try:
        names = (conversion_probe(), "fma_float32", "int16_gemm_vpmaddwd",
                 *(W8A8_CEILINGS[1:] if any(map(_int8_activations, quants)) else ()))
        machine_peaks, unmeasured = peaks(names=names), None
    except ProbeError as e:  # a busy host: the times and ratios stand, no figure is given as a fraction of a ceiling
        machine_peaks, unmeasured = None, str(e)
        print(f"ceilings: not measured ({e}): no fraction of a ceiling is given")
    peak_name, peak = conversion_peak(machine_peaks) if 1 in tokens and machine_peaks else (None, None)
    # a figure above the conversion peak: the peak measured again, once per run
    peak_again = functools.cache(lambda: conversion_peak(peaks(names=(conversion_probe(),)))[1])
    if peak:
        print(f"int8 weights at one token, from L1 ({peak_name}): {peak:.1f} G weights/s")
    # above one token int8 weights take the float32 GEMM 16-bit ones take: its FMAs against an int16 GEMM's multiplies
    multiply = {k: machine_peaks[k] if machine_peaks else 0 for k in ("fma_float32", "int16_gemm_vpmaddwd")}
    if any(n > 1 for n in tokens) and all(multiply.values()):
        print(f"above one token: float32 FMA {multiply['fma_float32']:.0f} GFLOP/s; an int16 GEMM's multiplies on "
              f"VPMADDWD {multiply['int16_gemm_vpmaddwd']:.0f} GOP/s "
              f"({multiply['int16_gemm_vpmaddwd'] / multiply['fma_float32']:.2f}x)", flush=True)
        if any(map(_int8_activations, quants)):
            print("W8A8's integer dots against the float32 FMAs: " + ", ".join(
                f"{k} {machine_peaks[k]:.0f} GOP/s ({machine_peaks[k] / multiply['fma_float32']:.2f}x)"
                for k in W8A8_CEILINGS[1:] if machine_peaks[k]), flush=True)
    chains = {"bfloat16": _chain(hidden, inter, layers, None)}
    chains.update({q: _chain(hidden, inter, layers, q) for q in quants})
    graphs = {_graph_name(name, sh): (name, _graph(mlps, sh, repeat)) for sh in shapes for name, mlps in chains.items()}
    nbytes = {name: _bytes(mlps) * repeat for name, mlps in chains.items()}  # per call
    # (W8A8's int8 weights meet int8 activations: no conversion, so no conversion peak)
    int8s = {name: 0 if _int8_activations(name) else _int8_weights(mlps) * repeat for name, mlps in chains.items()}
    ops = 2 * 3 * hidden * inter * layers * repeat  # per token: the chain's multiplies, 2 OP each
    big = np.ones(READ_PROBE_FLOATS, np.float32)
    rows, host, graph_call_probe = [], HostSpeed(host_probes()), graph_call()
    library = {f"{name} library": _library(mlps, repeat) for name, mlps in chains.items()}
    # the peer: PyTorch's eager LlamaMLP in bfloat16, the weights a quantized checkpoint dequantizes to
    peer = TorchPeer(peer_python, hidden, inter, "bfloat16", layers * repeat) if peer_python else None
    for n in tokens:
        x32 = np.random.default_rng(n).standard_normal((n, hidden)).astype(np.float32)
        x, bits = ms.Tensor(x32).astype(ms.bfloat16), to_bf16_bits(x32)
        variants = {key: (lambda net=net: net(x).asnumpy()) for key, (_, net) in graphs.items()}
        for key, (name, _) in graphs.items():  # the same computation, or the comparison means nothing
            graph, direct = variants[key]().view(np.uint16), library[f"{name} library"](bits)
            if not np.array_equal(graph, direct):
                raise AssertionError(f"{key}: the library's direct calls differ from the graph's output "
                                     f"(max |diff| of the bits {np.abs(graph.astype(int) - direct).max()})")
        variants.update({key: (lambda call=call: call(bits)) for key, call in library.items()})
        variants["graph call"] = graph_call_probe
        if peer:
            peer.tokens(n)
            variants["peer-torch"] = peer.run
        if n == 1 and not unmeasured:
            variants["read probe"] = lambda: read_sum(big)
            projections = {name: _projections(mlps, bits) for name, mlps in chains.items()}
            variants.update({f"{name} {proj}": call for name, p in projections.items()
                             for proj, (call, _) in p.items()})
        stats, dist = watched(variants, rounds, host=host, settle=settle)
        read = big.nbytes / stats["read probe"]["median_s"] / 1e9 if "read probe" in stats else None
        row = {"tokens": n, "shapes": list(shapes), "disturbance": dist, "ceilings_unmeasured": unmeasured,
               "graph_call_ms": {k: stats["graph call"][f"{k}_s"] * 1e3 for k in ("median", "min")}}
        if n > 1 and all(multiply.values()):
            row["multiply_peaks"] = dict(multiply)
            if any(map(_int8_activations, quants)):  # W8A8's ceilings: each integer dot's peak against the FMAs'
                row["multiply_peaks"].update({k: machine_peaks[k] for k in W8A8_CEILINGS[1:]})
        for key, (name, _) in graphs.items():
            row[key] = _entry(stats, key, nbytes[name])
            # the graph's own time per call: its median over the library's calls of the same ops
            row[key]["over_library_ms"] = (stats[key]["median_s"] - stats[f"{name} library"]["median_s"]) * 1e3
        for name in chains:
            row[f"{name} library"] = _entry(stats, f"{name} library", nbytes[name])
        if peer:
            row["peer-torch"] = _entry(stats, "peer-torch", nbytes["bfloat16"])
            for q in quants:  # the format's graph (the first shapes') against the peer, each round's pair
                g = _graph_name(q, shapes[0])
                row[f"{q}/peer speedup"] = {"median": stats["peer-torch"]["median_s"] / stats[g]["median_s"],
                                            "paired": paired(stats, "peer-torch", g)}
        row_peak = None  # the conversion peak at N=1
        if read:
            row["projections"] = {proj: {name: _entry(stats, f"{name} {proj}", p[proj][1])
                                         for name, p in projections.items()} for proj in ("gate_up", "down")}
            # every figure's fraction of its ceiling at once, so that all are of the same (measured again) value
            read_c = Ceiling("read probe's median in the same rounds", read, "GB/s",
                             lambda: read_rates(big)["all_threads"])
            peak_c = Ceiling(f"peak of {peak_name}", peak, "G weights/s", peak_again) if peak else None
            entries = {key: (row[key], int8s[name]) for key, (name, _) in graphs.items()}
            entries.update({f"{name} library": (row[f"{name} library"], int8s[name]) for name in chains})
            entries.update({f"{name} {proj}": (e[name], 0) for proj, e in row["projections"].items() for name in e})
            _fractions(entries, read_c, peak_c)
            row["remeasured"] = {c.name: c.record() for c in (read_c, peak_c) if c and c.record()}
            read, row_peak = read_c.value, peak_c and peak_c.value  # measured again, where a figure was above
        for sh in shapes:
            base = _graph_name("bfloat16", sh)
            for q in quants:
                other = _graph_name(q, sh)
                s = row[_graph_name(f"{q}/bf16 speedup", sh)] = {
                    "median": stats[base]["median_s"] / stats[other]["median_s"],
                    "min": stats[base]["min_s"] / stats[other]["min_s"], "paired": paired(stats, base, other)}
                dot_name = w8a8_dot_peak(n)
                dot_peak = machine_peaks and machine_peaks.get(dot_name)
                if n > 1 and _int8_activations(q) and dot_peak:  # W8A8 above one token: its int8 dots' peak
                    row[other]["fraction_of_int8_dot_peak"] = ops * n / stats[other]["median_s"] / 1e9 / dot_peak
                    row[other]["int8_dot_peak"] = dot_name
                if read and row_peak:
                    # bfloat16's time over int8's at the better of its two ceilings: its conversions at their peak,
                    # its bytes at the read probe's bandwidth or bfloat16's own in these rounds, the higher
                    best_s = max(int8s[q] / row_peak, nbytes[q] / max(read, row[base]["GB/s"])) / 1e9
                    s["ceiling"] = stats[base]["median_s"] / best_s
        if read:
            row["read_probe_GB/s"] = read
            if row_peak:
                row["int8_conversion_peak"] = {"probe": peak_name, "G weights/s": row_peak}
            for proj, entries in row["projections"].items():
                for q in quants:
                    entries[f"{q}/bf16 speedup"] = {
                        "median": stats[f"bfloat16 {proj}"]["median_s"] / stats[f"{q} {proj}"]["median_s"],
                        "paired": paired(stats, f"bfloat16 {proj}", f"{q} {proj}")}
        rows.append(row)
        for q in quants:
            _print_row(row, q)
            _print_projections(row, q)
            if peer:
                s = row[f"{q}/peer speedup"]
                print(f"        PyTorch eager (bfloat16) {row['peer-torch']['median_ms']:8.2f} ms: {q} "
                      f"{s['median']:.2f}x ({_paired(s['paired'])})", flush=True)
    if peer:
        peer.close()
    return rows


def _print_row(row, q):
    flag = " DISTURBED" if row["disturbance"]["flagged"] else ""
    print(f"N={row['tokens']:4d}  disturbance {row['disturbance']['fraction']:.1%}, slow host "
          f"{row['disturbance']['slow_calls']:.0%}{flag}; one graph call (x + 1) {row['graph_call_ms']['median']:.2f} ms"
          + (f"; read probe {row['read_probe_GB/s']:.1f} GB/s" if "read_probe_GB/s" in row else ""), flush=True)
    for label, b, qr, s in [*((f"graph, {sh} shapes", row[_graph_name("bfloat16", sh)], row[_graph_name(q, sh)],
                               row[_graph_name(f"{q}/bf16 speedup", sh)]) for sh in row["shapes"]),
                            ("the library's calls alone", row["bfloat16 library"], row[f"{q} library"], None)]:
        frac = (f"; read: bf16 {b['fraction_of_read']:.0%}, {q} {qr['fraction_of_read']:.0%}"
                if "fraction_of_read" in b else "")
        speedup = (f"  {q} speedup {s['median']:.2f}x (min {s['min']:.2f}x, {_paired(s['paired'])})" if s else
                   f"  {q} speedup {b['median_ms'] / qr['median_ms']:.2f}x")
        print(f"        {label:27s} bf16 {b['median_ms']:8.2f} ms (min {b['min_ms']:.2f})  {q} {qr['median_ms']:8.2f} ms "
              f"(min {qr['min_ms']:.2f}){speedup}{frac}", flush=True)
        if "over_library_ms" in qr:
            print(f"        {'':27s} the graph's own time per call (median over the library's calls): bf16 "
                  f"{b['over_library_ms']:.2f} ms, {q} {qr['over_library_ms']:.2f} ms", flush=True)
        if "fraction_of_int8_dot_peak" in qr:
            print(f"        {'':27s} {q}'s int8 x int8 multiplies against the peak of {qr['int8_dot_peak']} "
                  f"{qr['fraction_of_int8_dot_peak']:.0%}", flush=True)
        if "fraction_of_conversion_peak" in qr:
            ceiling = (f"; at the better of its two ceilings (conversions, bytes at the read probe's or bf16's "
                       f"bandwidth) {q} would be {s['ceiling']:.2f}x bf16's median" if s else "")
            print(f"        {'':27s} {q}'s conversions against their peak {qr['fraction_of_conversion_peak']:.0%}"
                  f"{ceiling}", flush=True)


def _print_projections(row, q):
    for proj, e in row.get("projections", {}).items():
        b, qe, s = e["bfloat16"], e[q], e[f"{q}/bf16 speedup"]
        print(f"        {proj:7s} alone (library): bf16 {b['median_ms']:7.2f} ms, {q} {qe['median_ms']:7.2f} ms, "
              f"{s['median']:.2f}x ({_paired(s['paired'])}); read: bf16 {b['fraction_of_read']:.0%}, "
              f"{q} {qe['fraction_of_read']:.0%}", flush=True)


def _paired(p):
    return f"paired by round {p['median']:.2f}x, p10-p90 {p['p10']:.2f}-{p['p90']:.2f}x"


def _quantize(w, method):
    """The weights as the format ``method`` stores them, decoded (float64)."""
    return method.decode(method.encode(w)).astype(np.float64)


def _tokens(x):
    """x quantized to int8 per token as the device's DynamicQuant does (s = max|x| / 127), and back."""
    s = np.abs(x).max(-1, keepdims=True) / 127
    s = np.where(s > 0, s, 1)
    return np.clip(np.rint(x / s), -127, 127) * s


def _mlp(x, gate_up, down, int8_activations=False):
    act = _tokens if int8_activations else (lambda a: a)
    z = act(x) @ gate_up.T
    inter = gate_up.shape[0] // 2
    with np.errstate(over="ignore"):
        return act(z[:, :inter] / (1 + np.exp(-z[:, :inter])) * z[:, inter:]) @ down.T


def _label(method):
    """A format's row of the accuracy table: its weights' bits and scales, and its activations."""
    scales = f"per group of {method.group}" if method.group else "per output row"
    return (f"int4, {scales}" if method.bits == 4 else scales) + (
        ", int8 activations per token" if method.activation is Activation.DYNAMIC else "")


def accuracy(hidden, inter, tokens=16, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, hidden))
    out = []
    for outliers in ("rows", "columns"):
        gu, down = rng.standard_normal((2 * inter, hidden)) * 0.02, rng.standard_normal((hidden, inter)) * 0.02
        for w in (gu, down):
            if outliers == "rows":
                w[rng.choice(w.shape[0], w.shape[0] // 100, replace=False)] *= 20
            else:
                w[:, rng.choice(w.shape[1], w.shape[1] // 100, replace=False)] *= 20
        gu, down = gu.astype(np.float32).astype(np.float64), down.astype(np.float32).astype(np.float64)
        ref = _mlp(x, gu, down)
        for method in map(formats.get, formats.names()):  # every format of the package
            group = method.group
            if group and (hidden % group or inter % group):
                continue  # its groups must divide both input sizes (H and I)
            y = _mlp(x, _quantize(gu, method), _quantize(down, method), method.activation is Activation.DYNAMIC)
            rel = np.abs(y - ref) / np.abs(ref).max(-1, keepdims=True)
            r = {"outliers": outliers, "scales": _label(method), "format": method.name,
                 "max_rel": float(rel.max()), "mean_rel": float(rel.mean()),
                 "frobenius_rel": float(np.linalg.norm(y - ref) / np.linalg.norm(ref))}
            out.append(r)
            print(f"outlier {outliers:7s} {r['format']:10s} {r['scales']:45s} max rel {r['max_rel']:.4f}  mean rel "
                  f"{r['mean_rel']:.5f}  Frobenius rel {r['frobenius_rel']:.4f}", flush=True)
    return out


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def main(argv=None):
    p = argparse.ArgumentParser(prog="bench_quant", description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="llama-7b")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128, 512])
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--repeat", type=_positive, default=1,
                   help="apply the chain this many times per graph call (layers x repeat MLPs per call, as a deeper "
                        "model; each still reads its weights from memory where the chain's others exceed the L3)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--quant", choices=[n for n in formats.names() if formats.get(n).kernel], nargs="+",
                   default=["int8"], help="the formats with cpu kernels (int8) against bfloat16")
    p.add_argument("--shapes", choices=SHAPES, nargs="+", default=list(SHAPES),
                   help="the graphs timed: compiled for any number of tokens (dynamic) and / or per token count (static)")
    add_settle_option(p)
    p.add_argument("--accuracy", action="store_true", help="also the accuracy figures (NumPy, float64)")
    p.add_argument("--peer-python", help="an interpreter with torch: PyTorch's eager MLP on the weights in bfloat16 "
                                         "(what a quantized checkpoint dequantizes to) joins the interleaved calls")
    p.add_argument("--json")
    args = p.parse_args(argv)
    hidden, inter = preset_shape(args.preset)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    # date: when the run started, UTC (tools/docs.py keeps the latest run per machine kind)
    result = {"date": started, "preset": args.preset, "hidden": hidden, "intermediate": inter, "layers": args.layers,
              "repeat": args.repeat, "rounds": args.rounds, "settle_s": args.settle}
    if args.accuracy:
        result["accuracy"] = accuracy(hidden, inter)
    try:
        result["speed"] = speed(hidden, inter, args.tokens, args.layers, args.rounds, args.settle, args.quant,
                                args.shapes, args.repeat, args.peer_python)
    except ProbeError as e:  # a ceiling not measured, or a figure above it: no report rather than a wrong one
        print(f"bench_quant: refused: {e}", file=sys.stderr)
        return 1
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
