"""Runs an exported MindIR on the golden inputs of its kit and applies the kit's acceptance criterion.

    python verify_on_device.py [KIT_FOLDER] [--device Ascend|CPU] [--device-id N] [--calls N] [--lite MODEL.mindir]

An expert-parallel export (``export --ep-size K``) is a folder of K rank kits whose graphs run together: start
this script on every rank with msrun, as its ``manifest.json`` says (``verify_command``); rank r verifies
``rank{r}/``.

Needs only ``mindspore`` and ``numpy``: copy the kit folder to the NPU host and run it there. The MindIR is loaded
with ``mindspore.load`` + ``nn.GraphCell`` (MindSpore's own runtime, GRAPH_MODE), fed every golden input, and each
output compared with its golden output (float32, computed without intermediate rounding from exactly the weights
and inputs the device gets) by the criterion in ``manifest.json``'s ``acceptance``.

It prints first ``kit <sha256 of manifest.json>``, the kit's id (``ms-swiglu export`` prints the same as ``kit id``:
a person compares the two), then one line on the device and its chip, then per case its errors (``case ...``) and
the graph call timed alone (``time case ...``: median and p90 of ``--calls N`` calls, the inputs made on the device
before the loop and the device synchronised after each call) beside the time ``manifest.json``'s roofline predicts
for the chip's model (``roofline``: per case weight and activation bytes and GEMM FLOPs; per model of the kit's
chip family its HBM bandwidth and cube peaks; max(bytes / bandwidth, FLOPs / peak of the dtype) over the figures
that are sourced), and measured/predicted. The model is read from the device (aclrtGetSocName, else
``npu-smi info``); unread, the prediction is the range over the family's models.

``--device-id N`` is the NPU (``mindspore.set_device("Ascend", N)``; default MindSpore's, DEVICE_ID or 0); it is
refused with ``--device CPU`` and under msrun, where each rank takes its own NPU. ``--lite`` runs a converter_lite
output through ``mindspore_lite`` instead, inputs in the model's dtype (a second mode, unverified: no run of it
has been checked).

Exit status: 0 every case passes; 1 a case fails the criterion; 2 the kit is not whole or malformed (a file whose
sha256 is not the manifest's, a manifest.json that is not the exporter's) or the arguments are bad; 3 the kit
cannot run on the device asked for (no such device, a MindIR that does not load or run there, a chip of another
family than the kit's). Every refusal is one line on stderr.

The criterion (also :func:`check`, which the package's tests use): for output element j of token t,
``e_j = |device_j - golden_j| / (|golden_j| + rms_t)``, rms_t the root mean square of token t's golden outputs
(the scale every rounding of the chain is relative to, so that outputs near zero get an absolute floor of their
token's magnitude, not a tiny denominator). A correct device rounds each stored intermediate to the dtype
(``roundings`` of them along the chain, counted by ``chain.py``, each an error of at most u = the unit
roundoff, uniform: variance u^2/3) and sums each GEMM of ``reduction`` terms in float32 in its own order
(variance about (2^-24)^2 K / 2 relative);
sigma = sqrt(roundings u^2/3 + gemms (2^-24)^2 K/2), plus, for int8 activations (W8A8), the values a rounded
input moves to a neighbouring int8 step (:func:`acceptance`). It passes when mean(e) <= mean_factor sigma and
max(e) <= max_factor sigma, for tokens whose routing is not ambiguous (``excluded_tokens``: a MoE token whose
expert set a correct device may choose otherwise, its router scores within the dtype's rounding of a tie, is off by
a whole expert's output).
"""
import argparse
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
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
# The gain of each branch (a block's MLP output, a MoE block's routed and shared parts) is fitted to the device's
# deviation by least squares, each element weighted by 1 / (sigma (|golden| + rms))^2: under the model behind sigma
# (independent errors of standard deviation at most sigma (|golden| + rms)) the fitted gain of a correct device is
# N(0, se^2) or narrower, se from the same weights. |gain| <= GAIN_Z se: a correct device fails with probability
# <= 2 Phi(-4.5) = 7e-6 per branch (less, as sigma is an upper bound); a gain error g fails with probability >= 97.7%
# once g >= (GAIN_Z + 2) se, the branch's detection floor, which the exporter writes into the manifest.
GAIN_Z, GAIN_POWER_Z = 4.5, 2.0


def acceptance(dtype, roundings, reduction, gemms, quantizers=0, peak=0.0):
    """The acceptance criterion of an export, as ``manifest.json`` holds it. ``quantizers``: the int8 activation
    quantizers along the chain (W8A8), ``peak``: the largest ``127 s mean|x| / mean(x^2)`` of a row x of their
    inputs in the golden cases (s its quantization step: max|x| / 127 per token). A device input x (1 + eps)
    lands on another int8 value than the golden's with probability |x eps| / s (fractional parts uniform), an
    error of one step s: variance s |x| E|eps| per element, against the rounding model's x^2 per unit of relative
    variance, so ``peak / 127 * E|eps|`` relative to the row, with E|eps| <= sigma of the roundings: an upper
    bound, as each quantizer sees only the roundings before it."""
    u = UNIT_ROUNDOFF[dtype]
    rounded = roundings * u * u / 3 + gemms * reduction * (2.0 ** -24) ** 2 / 2
    sigma = math.sqrt(rounded + quantizers * peak / 127 * math.sqrt(rounded))
    out = {"error": "e = |device - golden| / (|golden| + rms of the token's golden outputs)",
           "dtype": dtype, "unit_roundoff": u, "roundings": roundings, "reduction": reduction, "gemms": gemms,
           "sigma": sigma, "mean_max": MEAN_FACTOR * sigma, "max_max": MAX_FACTOR * sigma, "gain_z": GAIN_Z}
    if quantizers:
        out.update(quantizers=quantizers, peak=peak)
    return out


def _kept(a, keep):
    """[..., H] -> [kept tokens, H] (float64)."""
    a = np.asarray(a, np.float64)
    return a.reshape(-1, a.shape[-1])[keep]


def gain_fit(golden, branches, criterion, excluded=(), got=None):
    """Per branch (``branches`` [B, ..., H]: the golden outputs of the parts added into ``golden``): the standard
    error ``se`` of its fitted gain and its detection floor; with ``got`` also the fitted gain and its z."""
    g = np.asarray(golden, np.float64)
    keep = np.setdiff1d(np.arange(int(np.prod(g.shape[:-1]))), np.asarray(excluded, np.int64))
    g = _kept(g, keep)
    x = np.stack([_kept(b, keep).reshape(-1) for b in branches], axis=1)  # [n, B]
    rms = np.sqrt(np.mean(g * g, axis=-1, keepdims=True))
    w = (1.0 / (criterion["sigma"] * (np.abs(g) + rms) + np.finfo(np.float64).tiny) ** 2).reshape(-1)
    a = x.T @ (x * w[:, None])
    live = np.diag(a) > 0  # a branch of zeros (no token of it) has no gain to fit
    cov = np.full(a.shape, np.inf)
    if live.any():
        cov[np.ix_(live, live)] = np.linalg.pinv(a[np.ix_(live, live)])
    se = np.sqrt(np.diag(cov))
    out = [{"se": float(s), "floor": float((GAIN_Z + GAIN_POWER_Z) * s)} for s in se]
    if got is not None:
        r = (_kept(got, keep) - g).reshape(-1)
        beta = np.zeros(len(out))
        beta[live] = cov[np.ix_(live, live)] @ (x[:, live].T @ (w * r))
        for o, b in zip(out, beta):
            o.update(gain=float(b), z=float(b / o["se"]) if np.isfinite(o["se"]) else 0.0)
    return out


def check(got, golden, criterion, excluded=(), branches=None):
    """``{"mean": .., "max": .., "ok": bool, "tokens": n}`` of a device result ``got`` against ``golden`` ([..., H]
    each); with ``branches`` (:func:`gain_fit`) also each branch's fitted gain (``gains``), |z| <= GAIN_Z to pass.
    No token compared is not a pass."""
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
        return {"mean": None, "max": None, "ok": False, "tokens": 0, "why": "no token compared"}
    mean, top = float(np.mean(e)), float(np.max(e))  # NaN in the result compares False: not accepted
    ok = bool(mean <= criterion["mean_max"] and top <= criterion["max_max"])
    out = {"mean": mean, "max": top, "ok": ok, "tokens": int(g.shape[0])}
    if branches is not None:
        gains = gain_fit(golden, branches, criterion, excluded, got)
        out["gains"] = gains
        out["ok"] = bool(ok and all(abs(b["z"]) <= GAIN_Z for b in gains))  # NaN: not accepted
    return out


FACTS_KEY = "ms_swiglu.kit"  # the MindIR's user_info entry holding the facts the acceptance is computed from


class KitError(ValueError):
    """A kit that is not whole or not one export's: its files, manifest and MindIR do not agree (exit 2)."""


def read_facts(model_path):
    """The facts the exporter wrote into the MindIR (``user_info[FACTS_KEY]``): the dtype, each output's rounding
    chain and branches, each golden case's shape and left-out tokens."""
    from mindspore.train import mind_ir_pb2  # noqa: PLC0415

    model = mind_ir_pb2.ModelProto()
    try:
        with open(model_path, "rb") as f:
            model.ParseFromString(f.read())
        return json.loads(model.user_info[FACTS_KEY])
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise KitError(f"expected the kit's facts in {os.path.basename(model_path)} (user_info {FACTS_KEY}), got "
                       f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 -- protobuf's DecodeError
        raise KitError(f"expected a MindIR at {os.path.basename(model_path)}, got undecodable data ({exc})") from None


def plan(manifest, facts):
    """The checks a kit's run must pass, from the MindIR's facts alone: [(case entry, [(output entry, criterion,
    branch names)])]. The manifest must say the same (KitError otherwise): its thresholds, cases, left-out tokens
    and outputs are what the facts give, so editing manifest.json alone never changes a verdict."""
    outputs = facts.get("outputs") or []
    criteria = [acceptance(facts["dtype"], **o["chain"]) for o in outputs]
    listed = manifest.get("outputs") or []
    if len(listed) != len(outputs) or any(m.get("acceptance") != c for m, c in zip(listed, criteria)):
        raise KitError("expected manifest.json's outputs and acceptance to be the ones the MindIR's facts give, got "
                       "others")
    cases = manifest.get("golden") or []
    want = facts.get("cases") or []
    if not want or len(cases) != len(want):
        raise KitError(f"expected the {len(want)} golden cases the MindIR names (at least one), got {len(cases)} in "
                       f"manifest.json")
    out = []
    for case, fact in zip(cases, want):
        if (case.get("shape"), case.get("excluded_tokens"), case.get("compared_tokens")) != (
                fact["shape"], fact["excluded_tokens"], fact["compared_tokens"]) or \
                len(case.get("outputs") or []) != len(outputs):
            raise KitError(f"expected golden case {case.get('case')} as the MindIR names it (shape {fact['shape']}, "
                           f"tokens left out {fact['excluded_tokens']}), got another in manifest.json")
        out.append((dict(case, tokens_input=fact.get("tokens_input")),
                    [(entry, c, o["branches"]) for entry, c, o in zip(case["outputs"], criteria, outputs)]))
    if not any(f["compared_tokens"] for f in want):
        raise KitError("expected a golden case with tokens to compare, got none")
    read = [manifest.get("model_file")] + [c["input"]["npy"] for c in cases] + [
        name for c in cases for o in c["outputs"] for name in (o["npy"], o["branches"])]
    unlisted = [name for name in read if name not in (manifest.get("files") or {})]
    if unlisted:  # a file the check reads is vouched for by its sha256 in manifest.json, or the kit is not whole
        raise KitError(f"expected every file the check reads in manifest.json's files, got {', '.join(unlisted)} "
                       f"not listed")
    return out


def judge(got, case, checks, load):
    """Each output of one case's run (``got``: the graph's outputs) against its golden file and branches
    (``load(relative path)``): [(output name, check result)]. A case none of whose tokens is this kit's (an
    expert-parallel rank's) has nothing to compare: []."""
    if not case["compared_tokens"]:
        return []
    results = []
    for out, (entry, criterion, _) in zip(got, checks):
        results.append((entry["name"], check(out, load(entry["npy"]), criterion, case["excluded_tokens"],
                                             load(entry["branches"]))))
    return results


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


class CannotRun(RuntimeError):
    """The kit cannot run on the device asked for: no such device, a MindIR that does not load or run there, a chip
    of another family than the kit's (exit 3)."""


def kit_id(kit):
    """The kit's id: the sha256 of its manifest.json (which holds the sha256 of every other file), the one
    ``ms-swiglu export`` prints as ``kit id``."""
    return sha256(os.path.join(kit, "manifest.json"))


# MindSpore's SoC family (MSContext.get_ascend_soc_version) of a SoC name aclrtGetSocName gives: the names its
# SetContextSocVersion (plugin/ascend/ascend_device_context.cc) maps outside the patterns (the training series'
# "Ascend910B" is no Atlas A2), then the families' name patterns, as kit.py's chip_family has them.
SOC_FAMILIES = {
    "Ascend910A": "ascend910", "Ascend910B": "ascend910", "Ascend910PremiumA": "ascend910",
    "Ascend910ProA": "ascend910", "Ascend910ProB": "ascend910", "Ascend310P": "ascend310p",
    "Ascend310B1": "ascend310b", "Ascend310B4": "ascend310b"}
SOC_PATTERNS = ((r"Ascend910B\d", "ascend910b"), (r"Ascend910_93", "ascend910_93"), (r"Ascend310P\d", "ascend310p"),
                (r"Ascend310B\d", "ascend310b"))
# the --chip of each family (ms_swiglu.backends.chips, which this script cannot import)
CHIP_KEYS = {"ascend910b": "atlas-a2", "ascend910_93": "atlas-a3", "ascend310p": "atlas-310p",
             "ascend910": "atlas-910a", "ascend310b": "atlas-310b"}


def soc_name(name):
    """A SoC name as aclrtGetSocName gives it: npu-smi's Name column lacks the "Ascend" ("910B3")."""
    return name if name.startswith("Ascend") else f"Ascend{name}"


def soc_family(soc):
    """MindSpore's family of a SoC name ("Ascend910B3" -> "ascend910b"); None for one of no known family."""
    soc = soc_name(soc)
    if soc in SOC_FAMILIES:
        return SOC_FAMILIES[soc]
    return next((family for pattern, family in SOC_PATTERNS if re.match(pattern, soc)), None)


def npu_smi_device(table):
    """(NPU id, Name) of the first device row of `npu-smi info` ("| <id>  <Name>  | <health> ..."), or None."""
    for line in table.splitlines():
        f = line.split()
        if len(f) >= 3 and f[0] == "|" and f[1].isdigit() and re.match(r"(Ascend)?[0-9]", f[2]):
            return f[1], f[2]
    return None


def soc_from_npu_smi(name, board=""):
    """The SoC name of npu-smi's device Name, by the CANN rule for --soc_version: "Ascend" + Name, except on Atlas
    A3, whose Name is "Ascend910" for every SoC: there `npu-smi info -t board`'s Chip Name + "_" + NPU Name."""
    if name != "Ascend910":
        return soc_name(name)
    fields = dict(line.split(":", 1) for line in board.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    chip, npu = fields.get("Chip Name"), fields.get("NPU Name")
    return f"{chip}_{npu}" if chip and npu else None


def _mindspore_soc():
    """MindSpore's answer: mindspore.hal.get_device_name, which returns aclrtGetSocName's (AscendDeviceContext::
    GetDeviceName); None where it has none."""
    try:
        import mindspore as ms  # noqa: PLC0415

        return ms.hal.get_device_name(0, "Ascend") or None  # (the id is not read on Ascend: the current device's)
    except Exception:  # noqa: BLE001 -- a MindSpore without it, or its plugin: the next way is tried
        return None


def _acl_soc():
    """The CANN runtime's SoC name (aclrtGetSocName of libascendcl.so, the library MindSpore on Ascend loads), or
    None. hicann/runtime docs/api_docs/aclrtGetSocName.md: "const char *aclrtGetSocName()", NULL on failure."""
    import ctypes  # noqa: PLC0415

    homes = [os.environ.get(v) for v in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")]
    for path in ["libascendcl.so"] + [os.path.join(h, "lib64", "libascendcl.so") for h in homes if h] + [
            "/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so"]:
        try:
            get = ctypes.CDLL(path).aclrtGetSocName
        except (OSError, AttributeError):
            continue
        get.restype, get.argtypes = ctypes.c_char_p, []
        name = get()
        return name.decode(errors="replace") if name else None
    return None


def _npu_smi(*args):
    try:
        return subprocess.run(["npu-smi", "info", *args], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def read_chip():
    """(SoC name or None, family or None, where they were read) of the Ascend device MindSpore runs on: the CANN
    runtime's aclrtGetSocName, through MindSpore (mindspore.hal.get_device_name) or libascendcl.so itself, else
    `npu-smi info` (its first device: an Atlas server holds one model), else only the family, MindSpore's own."""
    soc, where = _mindspore_soc(), "mindspore.hal.get_device_name"
    if soc is None:
        soc, where = _acl_soc(), "aclrtGetSocName"
    if soc is None:
        device, where = npu_smi_device(_npu_smi()), "npu-smi info"
        if device is not None:
            soc = soc_from_npu_smi(device[1], _npu_smi("-t", "board", "-i", device[0], "-c", "0")
                                   if device[1] == "Ascend910" else "")
    if soc is not None:
        return soc, soc_family(soc), where
    try:
        from mindspore._c_expression import MSContext  # noqa: PLC0415 -- (private; chips.current reads the same)

        family = MSContext.get_instance().get_ascend_soc_version() or None
    except (ImportError, AttributeError, RuntimeError):
        family = None
    return None, family, "MindSpore's SoC version" if family else "not read"


def chip_verdict(device, soc, family, kit_chip, where="the device"):
    """(the kit runs on this chip, one line saying so or, when it does not, why) for the device's SoC ``soc`` and
    ``family`` (None: not read) against manifest.json's ``chip`` ({"name", "key", "soc_family"}; None: a kit for
    no Ascend chip)."""
    kit = f"the kit's {kit_chip['name']} ({kit_chip['soc_family']})" if kit_chip else "a kit for no Ascend chip"
    if device != "Ascend":
        return True, f"device {device}: no Ascend chip (no chip check, no predicted time); {kit}"
    seen = f"{soc} ({family or 'no known family'})" if soc else (family or "")
    if kit_chip is None:
        return True, f"chip {seen or 'not read'}; {kit} (target cpu): not compared"
    if not seen:
        return True, f"chip not read (no aclrtGetSocName, npu-smi or MindSpore SoC version): not compared with {kit}"
    if family == kit_chip["soc_family"]:
        return True, f"chip {seen} from {where}, as {kit}"
    again = f": export again with --chip {CHIP_KEYS[family]}" if family in CHIP_KEYS else ""
    return False, (f"expected a chip of {kit_chip['name']} ({kit_chip['soc_family']}), the kit's, got {seen} from "
                   f"{where}{again}")


def open_device(device, device_id=None):
    """MindSpore on ``device`` (``device_id``: the NPU, Ascend only), GRAPH_MODE; CannotRun when it has no such
    device."""
    import mindspore as ms  # noqa: PLC0415

    if device == "Ascend":
        from mindspore import device_context  # noqa: PLC0415

        if not device_context.ascend.is_available():
            raise CannotRun("--device Ascend: expected MindSpore for Ascend with CANN and an NPU, got a MindSpore "
                            "whose Ascend backend does not load")
        count = device_context.ascend.device_count()
        if device_id is not None and not 0 <= device_id < count:
            raise CannotRun(f"--device-id: expected an NPU id in 0..{count - 1} ({count} NPUs visible), got "
                            f"{device_id}")
    if device_id is not None:
        ms.set_device(device, device_id)
    elif ms.get_context("device_target") != device:
        ms.set_device(device)
    ms.set_context(mode=ms.GRAPH_MODE)


def lite_input(x, dtype):
    """A golden input (float32 holding values of ``dtype``) as MindSpore Lite takes it in the model's dtype:
    float16 and float32 arrays; bfloat16 as its 16-bit patterns (uint16, rounded to nearest even): NumPy has no
    bfloat16, nor MindSpore Lite's Python API a bfloat16 DataType (mindspore_lite/tensor.py)."""
    x = np.ascontiguousarray(x, np.float32)
    if dtype == "bfloat16":
        bits = x.view(np.uint32)
        return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return x.astype({"float16": np.float16, "float32": np.float32}[dtype])


def time_calls(call, calls, sync=None):
    """Milliseconds of each of ``calls`` calls of ``call()`` after one untimed call (its inputs reach the device),
    each ended by ``sync()``, which waits for the device's queued work (None: a synchronous device)."""
    call()
    if sync:
        sync()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        if sync:
            sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def predicted(case, models, dtype, soc=None):
    """(fastest s, slowest s, words) the roofline of one golden case (manifest ``roofline.cases``) predicts on the
    model ``soc`` when ``models`` (``roofline.models``) has it, else over every model listed (the kit's chip family:
    the model was not read); (None, None, why) when no figure applies. Each model:
    max((weight + activation bytes) / HBM bandwidth, FLOPs / cube peak of the dtype) over the terms it has."""
    named = {soc: models[soc]} if soc in models else dict(models)
    if not named:
        return None, None, "no figures for this chip in the manifest"
    found = []
    for name, m in named.items():
        # int8 x int8 GEMMs (W8A8: the case's ``compute``) run at the cube's int8 peak
        peak = m.get("int8_tops") if case.get("compute") == "int8" else (m.get("cube_tflops") or {}).get(dtype)
        bw = m.get("hbm_gbps")
        terms = [t for t in ((case["weight_bytes"] + case["activation_bytes"]) / (bw * 1e9) if bw else None,
                             case["flops"] / (peak * 1e12) if peak else None) if t is not None]
        if terms:
            found.append((max(terms), name, peak, bw))
    if not found:
        return None, None, f"no sourced cube peak for {dtype} nor HBM bandwidth of {', '.join(named)}"
    lo, hi = min(found), max(found)
    missing = "HBM bandwidth not sourced: cube term only" if not any(f[3] for f in found) else "roofline"
    if len(found) == 1:
        _, name, peak, _ = lo
        what = "TOPS int8" if case.get("compute") == "int8" else f"TFLOPS {dtype}"
        return lo[0], lo[0], f"{name}, {missing}" + (f", {peak} {what}" if peak else "")
    return lo[0], hi[0], f"{lo[1]}..{hi[1]}, the kit's chip family (model not read), {missing}"


def _ms(seconds):
    return f"{seconds * 1e3:.4g} ms"


def time_line(case, times, roofline, dtype, soc, device):
    """The timing line of one case: median and p90 of the calls beside the time the manifest's roofline predicts
    (and measured/predicted, so a slow fallback shows)."""
    median, p90 = (float(v) for v in np.percentile(times, [50, 90]))
    line = f"time case {case['case']} {case['shape']}: median {median:.4g} ms, p90 {p90:.4g} ms over {len(times)} calls"
    entry = next((c for c in (roofline or {}).get("cases", ()) if c.get("case") == case["case"]), None)
    if device != "Ascend":
        return line + f"; no predicted time on {device}"
    if entry is None:
        return line + "; no predicted time (manifest.json has no roofline for this case)"
    lo, hi, words = predicted(entry, roofline.get("models") or {}, dtype, soc)
    if lo is None:
        return line + f"; no predicted time ({words})"
    if lo == hi:
        return line + f"; predicted {_ms(lo)} ({words}); measured/predicted {median / (lo * 1e3):.3g}"
    return (line + f"; predicted {_ms(lo)}..{_ms(hi)} ({words}); measured/predicted "
            f"{median / (hi * 1e3):.3g}..{median / (lo * 1e3):.3g}")


def _first_line(exc):
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


@contextlib.contextmanager
def _utf8_path(path):
    """``path``, or where its path is not UTF-8 (MindSpore's loader takes only UTF-8, after resolving links) a hard
    link to it (else a copy) in a new folder under the temporary folder, removed after the block: the kit verifies
    from whatever folder it was copied to."""
    try:
        os.fsencode(os.path.realpath(path)).decode("utf-8")
        yield path
        return
    except UnicodeDecodeError:
        pass
    folder = tempfile.mkdtemp(prefix="verify-kit-")
    try:
        local = os.path.join(folder, os.path.basename(path))
        try:
            os.link(path, local)
        except OSError:  # another file system
            shutil.copyfile(path, local)
        yield local
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _runner(kit, manifest, device, lite, device_id=None):
    """A function (input: float32 array of exact values, tokens or None) -> the graph's outputs (float64 arrays),
    with ``bind(x, tokens)``: a call of the graph alone on inputs made once, and ``sync``. CannotRun when the device
    or the model is not there."""
    dtype = manifest["dtype"]
    if lite:
        try:
            import mindspore_lite as mslite  # noqa: PLC0415
        except ImportError as exc:
            raise CannotRun(f"--lite: expected mindspore_lite installed, got {_first_line(exc)}") from None

        context = mslite.Context()
        context.target = ["ascend" if device == "Ascend" else "cpu"]
        if device == "Ascend" and device_id is not None:
            context.ascend.device_id = device_id
        model = mslite.Model()
        try:
            model.build_from_file(lite, mslite.ModelType.MINDIR, context)
        except (RuntimeError, ValueError, TypeError, OSError) as exc:
            raise CannotRun(f"--lite: expected a model mindspore_lite builds, got {lite}: {_first_line(exc)}") from None

        def feed(x):
            inputs = model.get_inputs()
            model.resize(inputs, [list(x.shape)])
            data = lite_input(x, dtype)
            if inputs[0].dtype is None:  # a type the Python API does not name (bfloat16): its bytes, same size
                inputs[0] = mslite.Tensor(data)
            else:
                inputs[0].set_data_from_numpy(data)
            return inputs

        def run_lite(x, tokens=None):  # noqa: ARG001 -- (no expert-parallel set runs through Lite)
            return [o.get_data_to_numpy().astype(np.float64) for o in model.predict(feed(x))]

        def bind_lite(x, tokens=None):  # noqa: ARG001
            inputs = feed(x)
            return lambda: model.predict(inputs)

        run_lite.bind, run_lite.sync = bind_lite, None  # predict returns with its outputs
        return run_lite
    import mindspore as ms  # noqa: PLC0415
    from mindspore import nn  # noqa: PLC0415

    open_device(device, device_id)
    try:
        with _utf8_path(os.path.join(kit, manifest["model_file"])) as path:
            cell = nn.GraphCell(ms.load(path))
    except (RuntimeError, ValueError, TypeError, OSError) as exc:
        raise CannotRun(f"expected a MindIR MindSpore loads on {device}, got {manifest['model_file']}: "
                        f"{_first_line(exc)}") from None

    def make(x, tokens):
        inputs = [ms.Tensor(x).astype(getattr(ms, dtype))]  # astype runs as a device op: the input is made there
        if tokens is not None:  # an expert-parallel rank's own tokens: how many rows of x are real
            inputs.append(ms.Tensor([tokens], ms.int32))
        return inputs

    def run(x, tokens=None):
        got = cell(*make(x, tokens))
        return [o.astype(ms.float32).asnumpy().astype(np.float64) for o in
                (got if isinstance(got, (tuple, list)) else [got])]

    def bind(x, tokens=None):
        inputs = make(x, tokens)
        return lambda: cell(*inputs)

    # Ascend queues kernels: synchronize() waits for them; the CPU's call returns when done (and synchronize()
    # logs an error there)
    run.bind, run.sync = bind, ms.runtime.synchronize if device == "Ascend" else None
    return run


def _whole_manifest(kit):
    """The kit's manifest, its files checked against their sha256; KitError if it is not whole or malformed."""
    try:
        with open(os.path.join(kit, "manifest.json")) as f:
            manifest = json.load(f)
        bad = _whole(kit, manifest)
        if not isinstance(manifest.get("model_file"), str) or manifest.get("dtype") not in UNIT_ROUNDOFF:
            raise KeyError("model_file and dtype")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KitError(f"expected manifest.json as the exporter wrote it, got {type(exc).__name__}: "
                       f"{_first_line(exc)}") from None
    if bad:
        raise KitError(f"{', '.join(bad)} differ from manifest.json's sha256")
    return manifest


def _checks(kit, manifest):
    """The checks :func:`plan` gives for the kit's manifest and MindIR; KitError if they do not agree."""
    try:
        return plan(manifest, read_facts(os.path.join(kit, manifest["model_file"])))
    except (KeyError, TypeError, AttributeError) as exc:
        raise KitError(f"expected manifest.json and the MindIR's facts as the exporter wrote them, got "
                       f"{type(exc).__name__}: {exc}") from None


def _describe(name, r, criterion):
    """One output's result as words."""
    if r["mean"] is None:
        return f"{name}: {r['why']}"
    gains = ", ".join(f"{g['gain']:+.2e} (z {g['z']:+.1f})" for g in r.get("gains", ()))
    return (f"{name}: mean e {r['mean']:.2e} (<= {criterion['mean_max']:.2e}), max e {r['max']:.2e} "
            f"(<= {criterion['max_max']:.2e}), branch gains {gains} (|z| <= {criterion['gain_z']})")


def verify(kit, device="Ascend", calls=5, lite=None, out=print, runner=None, device_id=None, err=None):
    """Run every golden case of the kit in ``kit``; the exit status (0: all pass; the module's docstring has the
    others). ``runner``: a function (input, tokens or None) -> the graph's outputs standing for the device (the
    tests' simulated devices); ``device_id``: the NPU; ``err``: where a refusal's one line goes (default ``out``)."""
    err = err or out
    out(f"kit {kit_id(kit)}")  # first: the id `ms-swiglu export` printed, for a person to compare
    try:
        manifest = _whole_manifest(kit)
        run = runner or _runner(kit, manifest, device, lite, device_id)  # a MindIR that does not load: exit 3
        soc = family = None
        if runner is None:
            soc, family, where = read_chip() if device == "Ascend" else (None, None, "")
            runs, line = chip_verdict(device, soc, family, manifest.get("chip"), where)
            if not runs:
                raise CannotRun(line)
            out(line)
        checks = _checks(kit, manifest)
    except KitError as exc:
        err(f"verify_on_device: the kit is not whole: {exc}")
        return 2
    except CannotRun as exc:
        err(f"verify_on_device: {exc}")
        return 3
    failed = compared = 0
    for case, outputs in checks:
        x = np.load(os.path.join(kit, case["input"]["npy"]))
        tokens = case.get("tokens_input")
        try:
            got = run(x, tokens)  # the first call compiles
            bind = getattr(run, "bind", None)
            call = bind(x, tokens) if bind else (lambda: run(x, tokens))  # noqa: B023 -- used in this iteration
            times = time_calls(call, calls, getattr(run, "sync", None))
        except (RuntimeError, ValueError, TypeError, MemoryError) as exc:
            err(f"verify_on_device: expected the graph to run on {device}, got case {case['case']}: "
                f"{type(exc).__name__}: {_first_line(exc)}")
            return 3
        results = judge(got, case, outputs, lambda name: np.load(os.path.join(kit, name)))
        if not results:
            out(f"case {case['case']} {case['shape']}: no token of this kit's (the other ranks check them)")
            continue
        compared += 1
        ok = all(r["ok"] for _, r in results)
        failed += not ok
        words = "; ".join(_describe(name, r, c) for (name, r), (_, c, _) in zip(results, outputs))
        out(f"case {case['case']} {case['shape']}: {'pass' if ok else 'FAIL'}: {words}")
        if times:
            out(time_line(case, times, manifest.get("roofline"), manifest["dtype"], soc, device if runner is None
                          else "a simulated device"))
    mode = "mindspore_lite (unverified mode)" if lite else f"mindspore.load + nn.GraphCell on {device}"
    out(f"{manifest['model_file']}: {compared - failed} of {compared} cases pass ({mode})")
    return 1 if failed or not compared else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kit", nargs="?", default=os.path.dirname(os.path.abspath(__file__)),
                   help="the kit folder (default: this script's)")
    p.add_argument("--device", default="Ascend", choices=("Ascend", "CPU"))
    p.add_argument("--device-id", type=int,
                   help="the NPU to use, with --device Ascend (default MindSpore's: DEVICE_ID or 0)")
    p.add_argument("--calls", type=int, default=5, help="timed calls per case after the compiling one")
    p.add_argument("--lite", help="a converter_lite output (.mindir) to run with mindspore_lite instead")
    args = p.parse_args(argv)

    def err(line):
        print(line, file=sys.stderr, flush=True)

    if not os.path.isfile(os.path.join(args.kit, "manifest.json")):
        err(f"verify_on_device: expected a kit folder with manifest.json, got {args.kit}")
        return 2
    if args.device_id is not None and args.device != "Ascend":
        # refused rather than ignored: a user never wonders which NPU, if any, the run took
        err(f"verify_on_device: --device-id: expected it only with --device Ascend (the NPU to use), got it with "
            f"--device {args.device}")
        return 2
    try:
        with open(os.path.join(args.kit, "manifest.json")) as f:
            ranks = json.load(f).get("ranks")
    except (OSError, ValueError, AttributeError):
        ranks = None  # (verify says what is wrong with it, after the kit's id)
    if ranks:  # an expert-parallel set: this process is one of its ranks
        if "MS_WORKER_NUM" not in os.environ and "RANK_SIZE" not in os.environ:
            err(f"verify_on_device: expected to run as one of {len(ranks)} ranks under msrun (manifest.json's "
                f"verify_command), got a single process")
            return 2
        if args.device_id is not None:
            err(f"verify_on_device: --device-id: expected none under msrun (each rank takes the NPU msrun gives it), "
                f"got {args.device_id}")
            return 2
        print(f"kit {kit_id(args.kit)}", flush=True)  # the set's id, which `ms-swiglu export` printed
        try:
            with open(os.path.join(args.kit, "manifest.json")) as f:
                bad = _whole(args.kit, json.load(f))  # every rank's files, its manifest.json too
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            bad = [f"manifest.json ({type(exc).__name__}: {exc})"]
        if bad:
            err(f"verify_on_device: the kit is not whole: {', '.join(bad)} differ from manifest.json's sha256")
            return 2
        import mindspore as ms  # noqa: PLC0415
        from mindspore.communication import get_group_size, get_rank, init  # noqa: PLC0415

        ms.set_device(args.device)
        init()
        if get_group_size() != len(ranks):
            err(f"verify_on_device: expected {len(ranks)} ranks (the set's kits), got {get_group_size()}")
            return 2
        kit = os.path.join(args.kit, ranks[get_rank()]["kit"])
        return verify(kit, args.device, max(args.calls, 0), args.lite,
                      out=lambda line: print(f"rank {get_rank()}: {line}", flush=True),
                      err=lambda line: err(f"rank {get_rank()}: {line}"))
    return verify(args.kit, args.device, max(args.calls, 0), args.lite, device_id=args.device_id, err=err)


if __name__ == "__main__":
    sys.exit(main())
