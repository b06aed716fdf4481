"""Runs an exported MindIR on the golden inputs of its kit and applies the kit's acceptance criterion.

    python verify_on_device.py [KIT_FOLDER] [--device Ascend|CPU] [--calls N] [--lite MODEL.mindir]

An expert-parallel export (``export --ep-size K``) is a folder of K rank kits whose graphs run together: start
this script on every rank with msrun, as its ``manifest.json`` says (``verify_command``); rank r verifies
``rank{r}/``.

Needs only ``mindspore`` and ``numpy``: copy the kit folder to the NPU host and run it there. The MindIR is loaded
with ``mindspore.load`` + ``nn.GraphCell`` (MindSpore's own runtime, GRAPH_MODE), fed every golden input, and each
output compared with its golden output (float32, computed without intermediate rounding from exactly the weights
and inputs the device gets) by the criterion in ``manifest.json``'s ``acceptance``. Prints one line per case (its
errors and the time per call) and exits 0 only if every case passes; 1 if one fails, 2 if the kit is not whole
(a file whose sha256 is not the manifest's) or the arguments are bad. ``--lite`` runs a converter_lite output
through ``mindspore_lite`` instead (a second mode, unverified: no run of it has been checked).

The criterion (also :func:`check`, which the package's tests use): for output element j of token t,
``e_j = |device_j - golden_j| / (|golden_j| + rms_t)``, rms_t the root mean square of token t's golden outputs
(the scale every rounding of the chain is relative to, so that outputs near zero get an absolute floor of their
token's magnitude, not a tiny denominator). A correct device rounds each stored intermediate to the dtype
(``roundings`` of them along the chain, counted by ``chain.py``, each an error of at most u = the unit
roundoff, uniform: variance u^2/3) and sums each GEMM of ``reduction`` terms in float32 in its own order
(variance about (2^-24)^2 K / 2 relative);
sigma = sqrt(roundings u^2/3 + gemms (2^-24)^2 K/2). It passes when mean(e) <= mean_factor sigma and
max(e) <= max_factor sigma, for tokens whose routing is not ambiguous (``excluded_tokens``: a MoE token whose
expert set a correct device may choose otherwise, its router scores within the dtype's rounding of a tie, is off by
a whole expert's output).
"""
import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import time

import numpy as np

UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
# sigma is an upper bound (an error uniform in +-u has variance u^2/3, round-to-nearest's is 0.18 u^2 on average
# over a binade; branches that meet in an add are summed), so mean(e) <= 0.8 sigma (the mean of |N(0, sigma)|).
# Measured (tests/test_acceptance.py: a simulated correct device, tests/device_sim.py, and the package's own CPU
# run; dense, MoE, FFN stacks, every dtype and quantization, 20 seeds, 1 and 16 tokens): mean(e) 0.05-0.6 sigma,
# max(e) up to 4.1 sigma. Near misses (an int8-g128 scale from the neighbouring group, weights not renormalised,
# the shared expert's gate ignored, on bfloat16) give mean(e) >= 6 sigma on one token (bar one whose fault changes
# little: DeepSeek-V3 scores summing to 0.93 left unrenormalised, 2.9), >= 8.9 on 16; gross errors >= 18.
# MEAN_FACTOR 3 passes a correct run by >= 5x and fails a near miss by >= 2x (3x on 16 tokens); MAX_FACTOR 12 is
# 2.9x the largest correct max(e): room for more outputs (the max grows as sqrt(2 ln n)) and later layers.
MEAN_FACTOR, MAX_FACTOR = 3.0, 12.0


def acceptance(dtype, roundings, reduction, gemms):
    """The acceptance criterion of an export, as ``manifest.json`` holds it."""
    u = UNIT_ROUNDOFF[dtype]
    sigma = math.sqrt(roundings * u * u / 3 + gemms * reduction * (2.0 ** -24) ** 2 / 2)
    return {"error": "e = |device - golden| / (|golden| + rms of the token's golden outputs)",
            "dtype": dtype, "unit_roundoff": u, "roundings": roundings, "reduction": reduction, "gemms": gemms,
            "sigma": sigma, "mean_max": MEAN_FACTOR * sigma, "max_max": MAX_FACTOR * sigma}


def check(got, golden, criterion, excluded=()):
    """``{"mean": .., "max": .., "ok": bool}`` of a device result ``got`` against ``golden`` ([..., H] each)."""
    got = np.asarray(got, np.float64)
    golden = np.asarray(golden, np.float64)
    if got.shape != golden.shape:
        return {"mean": None, "max": None, "ok": False, "why": f"shape {list(got.shape)} != {list(golden.shape)}"}
    g = golden.reshape(-1, golden.shape[-1])
    d = got.reshape(-1, got.shape[-1])
    keep = np.setdiff1d(np.arange(g.shape[0]), np.asarray(excluded, np.int64))
    g, d = g[keep], d[keep]
    rms = np.sqrt(np.mean(g * g, axis=-1, keepdims=True))
    e = np.abs(d - g) / (np.abs(g) + rms + np.finfo(np.float64).tiny)
    if e.size == 0:
        return {"mean": 0.0, "max": 0.0, "ok": True, "tokens": 0}
    mean, top = float(np.mean(e)), float(np.max(e))  # NaN in the result compares False: not accepted
    ok = bool(mean <= criterion["mean_max"] and top <= criterion["max_max"])
    return {"mean": mean, "max": top, "ok": ok, "tokens": int(g.shape[0])}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _whole(kit, manifest):
    """The files whose sha256 is not the manifest's (or that are missing)."""
    bad = []
    for name, digest in manifest["files"].items():
        path = os.path.join(kit, name)
        if not os.path.isfile(path) or sha256(path) != digest:
            bad.append(name)
    return bad


def _runner(kit, manifest, device, lite):
    """A function input (float32 array, exact values) -> output (float64 array)."""
    dtype = manifest["dtype"]
    if lite:
        import mindspore_lite as mslite  # noqa: PLC0415

        context = mslite.Context()
        context.target = ["ascend" if device == "Ascend" else "cpu"]
        model = mslite.Model()
        model.build_from_file(lite, mslite.ModelType.MINDIR, context)

        def run_lite(x):
            inputs = model.get_inputs()
            model.resize(inputs, [list(x.shape)])
            inputs[0].set_data_from_numpy(x.astype(np.float16 if dtype == "float16" else np.float32))
            return model.predict(inputs)[0].get_data_to_numpy().astype(np.float64)

        return run_lite
    import mindspore as ms  # noqa: PLC0415
    from mindspore import nn  # noqa: PLC0415

    if ms.get_context("device_target") != device:
        ms.set_device(device)
    ms.set_context(mode=ms.GRAPH_MODE)
    cell = nn.GraphCell(ms.load(os.path.join(kit, manifest["model_file"])))

    def run(x, tokens=None):
        inputs = [ms.Tensor(x).astype(getattr(ms, dtype))]
        if tokens is not None:  # an expert-parallel rank's own tokens: how many rows of x are real
            inputs.append(ms.Tensor([tokens], ms.int32))
        return cell(*inputs).astype(ms.float32).asnumpy().astype(np.float64)

    return run


def verify(kit, device="Ascend", calls=5, lite=None, out=print):
    """Run every golden case of the kit in ``kit``; the exit status (0: all pass)."""
    with open(os.path.join(kit, "manifest.json")) as f:
        manifest = json.load(f)
    bad = _whole(kit, manifest)
    if bad:
        out(f"verify_on_device: the kit is not whole: {', '.join(bad)} differ from manifest.json's sha256")
        return 2
    criterion = manifest["acceptance"]
    run = _runner(kit, manifest, device, lite)
    failed = 0
    for case in manifest["golden"]:
        x = np.load(os.path.join(kit, case["input"]["npy"]))
        want = np.load(os.path.join(kit, case["output"]["npy"]))
        tokens = case.get("tokens_input")
        got = run(x, tokens) if tokens is not None else run(x)  # the first call compiles
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            run(x, tokens) if tokens is not None else run(x)
            times.append((time.perf_counter() - t0) * 1e3)
        r = check(got, want, criterion, case.get("excluded_tokens", ()))
        failed += not r["ok"]
        errors = (f"mean e {r['mean']:.2e} (<= {criterion['mean_max']:.2e}), max e {r['max']:.2e} "
                  f"(<= {criterion['max_max']:.2e})" if r["mean"] is not None else r["why"])
        out(f"case {case['case']} {case['shape']}: {'pass' if r['ok'] else 'FAIL'}: {errors}, "
            f"{statistics.median(times) if times else float('nan'):.3f} ms per call")
    mode = "mindspore_lite (unverified mode)" if lite else f"mindspore.load + nn.GraphCell on {device}"
    out(f"{manifest['model_file']}: {len(manifest['golden']) - failed} of {len(manifest['golden'])} cases pass "
        f"({mode})")
    return 1 if failed else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kit", nargs="?", default=os.path.dirname(os.path.abspath(__file__)),
                   help="the kit folder (default: this script's)")
    p.add_argument("--device", default="Ascend", choices=("Ascend", "CPU"))
    p.add_argument("--calls", type=int, default=5, help="timed calls per case after the compiling one")
    p.add_argument("--lite", help="a converter_lite output (.mindir) to run with mindspore_lite instead")
    args = p.parse_args(argv)
    if not os.path.isfile(os.path.join(args.kit, "manifest.json")):
        print(f"verify_on_device: expected a kit folder with manifest.json, got {args.kit}", file=sys.stderr)
        return 2
    with open(os.path.join(args.kit, "manifest.json")) as f:
        ranks = json.load(f).get("ranks")
    if ranks:  # an expert-parallel set: this process is one of its ranks
        if "MS_WORKER_NUM" not in os.environ and "RANK_SIZE" not in os.environ:
            print(f"verify_on_device: expected to run as one of {len(ranks)} ranks under msrun (manifest.json's "
                  f"verify_command), got a single process", file=sys.stderr)
            return 2
        import mindspore as ms  # noqa: PLC0415
        from mindspore.communication import get_group_size, get_rank, init  # noqa: PLC0415

        ms.set_device(args.device)
        init()
        if get_group_size() != len(ranks):
            print(f"verify_on_device: expected {len(ranks)} ranks (the set's kits), got {get_group_size()}",
                  file=sys.stderr)
            return 2
        kit = os.path.join(args.kit, ranks[get_rank()]["kit"])
        return verify(kit, args.device, max(args.calls, 0), args.lite,
                      out=lambda line: print(f"rank {get_rank()}: {line}", flush=True))
    return verify(args.kit, args.device, max(args.calls, 0), args.lite)


if __name__ == "__main__":
    sys.exit(main())
