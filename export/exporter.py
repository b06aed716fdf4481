"""``ms-swiglu export``: a MindIR of a packed MLP (or a stack of FFN blocks) and its kit for the device.

Targets:
    ascend    the builtin ``Swiglu`` (and MindSpore's MoE primitives), no Custom op; for the Ascend chips and dtypes
              of ``ms_swiglu.backends.ascend_support``, through MindSpore's own runtime (docs/ascend.md)
    portable  split + silu + mul only: runs wherever MindSpore / MindSpore Lite runs
    cpu       the package's aot kernel: a Custom op bound to this host's .so, not deployable

Every graph is straight-line (no token is handled before it, by the Cells). Every export is checked before it is
moved into place: the MindIR is read back and its op types checked (ascend: an allow-list and the support table,
never Custom); golden outputs are computed in float32 from exactly the weights and inputs the device gets; a
computation in the dtype is held against them by the acceptance criterion (``verify_on_device``): the reloaded
MindIR where it runs here (portable, cpu), else the CPU twin of the network. The model file, the kit and the
manifest are one ``ms_swiglu.outputs.FolderSet``: built in a hidden folder inside the output folder and put in place
together, the manifest last; an existing export is replaced only with ``force``; files of no export there are
never touched.
"""
import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile

import numpy as np

from ms_swiglu import backends
from ms_swiglu.backends import ascend_support, chips
from ms_swiglu.checkpoint import read_config, to_bf16_bits
from ms_swiglu.config import preset as preset_shape
from ms_swiglu.errors import InputError
from ms_swiglu import quant as formats
from ms_swiglu import processes, signals
from ms_swiglu.outputs import FolderSet
from ms_swiglu.processes import python
from ms_swiglu.export.kit import AIR_DEFAULT_SHAPE, atc_command, converter_command, converter_config, write_scripts
from ms_swiglu.export.chain import chain
from ms_swiglu.export.mindir import int8_parameters, op_types, rename_input
from ms_swiglu.export.verify_on_device import UNIT_ROUNDOFF, acceptance, check, sha256

# export target -> the backend whose graph it exports
TARGETS = {"ascend": "ascend", "portable": "composite", "cpu": "cpu"}
INPUT_NAME = "x"  # the MindIR's input, renamed: MindSpore's own names hold ":", converter_lite's separator
# the kit beside the model file; "golden/" is a folder
ARTIFACTS = ("manifest.json", "converter_lite.cfg", "convert_lite.sh", "export_air.sh", "verify_on_device.py",
             "golden/")
KIT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "verify_on_device.py")


class ExportError(InputError):
    """An export that cannot be made as asked (bad input); nothing is left behind."""


class VerificationError(RuntimeError):
    """An export that does not verify (a bug, not bad input); nothing is left behind."""


@dataclasses.dataclass
class ExportRequest:
    """What to export. Exactly one of ``checkpoint`` / ``preset``; ``layers`` is (first, last), inclusive."""

    output_dir: str
    target: str = "ascend"
    checkpoint: str = None
    preset: str = None
    seed: int = 0
    layers: tuple = (0, 0)
    stack: bool = False  # True: RMSNorm -> MLP -> residual blocks for every layer in `layers`
    dtype: str = None  # None: the checkpoint's (float32 for presets)
    static_shape: tuple = None  # (batch, seq) or None for dynamic batch and sequence
    force: bool = False
    air: bool = False  # AIR instead of MindIR (Ascend hosts only; deprecated in MindSpore 2.10)
    chip: str = chips.DEFAULT.key  # the Ascend chip family the kit is for (ms_swiglu.backends.chips)
    quant: str = None  # "int8" / "int8-g128": weight-only int8 projections (a quantized file is without it)

    def name(self, model):
        what = f"ffn{self.layers[0]}-{self.layers[1]}" if self.stack else f"mlp{self.layers[0]}"
        shape = f"-{self.static_shape[0]}x{self.static_shape[1]}" if self.static_shape else ""
        weights = f"-w{self.quant}" if self.quant else ""
        return f"{model}-{what}-{self.target}-{self.dtype}{weights}{shape}"


def _raw(tensor, dtype):
    """Little-endian bytes of a Tensor in its own dtype (bfloat16 as its 16-bit patterns)."""
    import mindspore as ms  # noqa: PLC0415

    values = tensor.astype(ms.float32).asnumpy()
    raw = to_bf16_bits(values) if dtype == "bfloat16" else values.astype(np.dtype(dtype).newbyteorder("<"))
    return values, raw.tobytes()


def _build(req, backend):
    """(network, hidden_size, intermediate_size, model name) for the request, on `backend`."""
    from ms_swiglu.checkpoint.load import load_block, load_ffn  # noqa: PLC0415
    from ms_swiglu.ffn import FFNBlock, FFNStack  # noqa: PLC0415
    from ms_swiglu.mlp import PackedSwiGLUMLP, to_quantized  # noqa: PLC0415

    import mindspore as ms  # noqa: PLC0415

    layers = range(req.layers[0], req.layers[1] + 1)
    if not layers:
        raise ExportError(f"--layers: expected A <= B, got {req.layers[0]}-{req.layers[1]}")
    if req.checkpoint:
        config = read_config(req.checkpoint)
        for layer in (layers.start, layers.stop - 1):
            config.check_layer(layer)
        hidden, inter, model = config.hidden_size, config.intermediate_size, config.model_type
        if req.stack:
            net = FFNStack([load_ffn(req.checkpoint, i, dtype=req.dtype, backend=backend, quant=req.quant)
                            for i in layers])
        else:
            net = load_block(req.checkpoint, layers.start, dtype=req.dtype, backend=backend, quant=req.quant)
    else:
        hidden, inter = preset_shape(req.preset)
        model = req.preset
        ms.set_seed(req.seed)
        dtype = req.dtype or "float32"

        def mlp():
            packed = PackedSwiGLUMLP(hidden, inter, dtype=dtype, backend="composite" if req.quant else backend)
            return to_quantized(packed, req.quant, backend) if req.quant else packed

        if req.stack:
            net = FFNStack([FFNBlock(hidden, inter, dtype=dtype, backend=backend, mlp=mlp()) for _ in layers])
        else:
            net = mlp()
    net.set_train(False)
    return net, hidden, inter, model


def _golden_shapes(req):
    if req.static_shape:
        return [tuple(req.static_shape) + (None,)] * 2  # a static graph takes one shape: two seeds
    return [(1, 1, None), (2, 8, None)]  # 1 token (decode) and 16 tokens (prefill)


# Control flow in a MindIR: a branch (Switch, SwitchLayer), a sub-graph bound or called (Partial, Call), a loop
CONTROL_FLOW = frozenset({"Switch", "SwitchLayer", "Partial", "Call", "While"})


def _check_ops(found, target, extra=frozenset()):
    """The exported graph is straight-line, holds the op types that mark its backend, none that mark another
    backend, and only the backend's allowed op types (and ``extra``: an expert-parallel rank's) when it has such
    a list."""
    flow = sorted(CONTROL_FLOW & set(found))
    if flow:
        raise VerificationError(f"export --target {target}: expected a straight-line graph, got control flow "
                                f"{', '.join(flow)} in op types {found}")
    backend = backends.get(TARGETS[target])
    owners = {}  # op type -> the backends it marks
    for name in backends.REGISTRY:
        for op in backends.get(name).facts.graph_ops:
            owners.setdefault(op, set()).add(name)
    facts = backend.facts
    missing = sorted(facts.graph_ops - set(found))
    foreign = sorted(op for op in found if op in owners and op not in facts.graph_ops)
    allowed = None if facts.allowed_ops is None else facts.allowed_ops | extra
    extra = sorted(set(found) - allowed) if allowed is not None else []
    where = f"export --target {target}"
    if foreign:
        marked = ", ".join(sorted(set().union(*(owners[op] for op in foreign))))
        raise ExportError(f"{where}: expected no {', '.join(foreign)} op (it marks the {marked} backend), got op "
                          f"types {found}")
    if missing:
        raise ExportError(f"{where}: expected the {', '.join(missing)} op of the {backend.name} backend, got op types "
                          f"{found}")
    if extra:
        raise ExportError(f"{where}: expected only ops of {sorted(allowed)}, got {extra}")


# what carries int8 weights in an ascend graph: the dense projections, the grouped experts
QUANT_OPS = ("WeightQuantBatchMatmul", "GroupedMatmulV4")


def _check_int8(net, mindir, found, target):
    """A quantized network's MindIR holds its int8 weights as int8 (not dequantized at export), and its ascend
    graph multiplies them with the weight-quant matmuls."""
    import mindspore as ms  # noqa: PLC0415

    want = {name: list(p.shape) for name, p in net.parameters_and_names() if p.dtype == ms.int8}
    got = int8_parameters(mindir)
    if sorted(want.values()) != sorted(got.values()):
        raise VerificationError(f"export: expected int8 weights of shapes {sorted(want.values())} in the MindIR, "
                                f"got {sorted(got.values())}")
    if want and target == "ascend" and not set(QUANT_OPS) & set(found):
        raise VerificationError(f"export --target ascend: expected {' or '.join(QUANT_OPS)} for the int8 weights, "
                                f"got op types {found}")


def _verify_kit(work, model_file, device):
    """Run the kit's verify_on_device.py on ``device`` (MindSpore's device target) in a new interpreter (the
    MindIR loaded with mindspore.load + nn.GraphCell); its per-case lines."""
    with _ms_path(os.path.join(work, model_file)) as path:
        if path != os.path.join(work, model_file):  # MindSpore's loader refuses the folder's name: a copy
            shutil.copyfile(os.path.join(work, model_file), path)
            kit = os.path.dirname(path)
            for name in os.listdir(work):
                if name != model_file:
                    os.symlink(os.path.join(work, name), os.path.join(kit, name))
        else:
            kit = work
        proc = processes.run(python("ms_swiglu.export.verify_on_device", kit, "--device", device, "--calls", "1"),
                             timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("case ", "verify_on_device"))]
    if proc.returncode != 0:
        tail = (lines or proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise VerificationError(f"export: expected the reloaded MindIR to pass the acceptance criterion, got exit "
                                f"{proc.returncode}: {tail}")
    return lines


def golden_net(req, net):
    """The network in float32 on the composite backend holding exactly ``net``'s stored weights (widened; int8
    weights and their float32 scales as they are): the golden outputs' computation, no intermediate rounding."""
    import mindspore as ms  # noqa: PLC0415

    from ms_swiglu.initial import empty_weights  # noqa: PLC0415

    with empty_weights():  # every weight is set from net's below
        gold = _build(dataclasses.replace(req, dtype="float32"), "composite")[0]
    stored = dict(net.parameters_and_names())
    from ms_swiglu.moe import StackedExperts  # noqa: PLC0415

    # stacked experts go back to [E, out, in] from the layout their backend holds them in
    unstore = {f"{prefix}.{name}": cell.unstore for prefix, cell in net.cells_and_names()
               if isinstance(cell, StackedExperts) for name in ("gate_up_proj", "down_proj")}
    for name, p in gold.parameters_and_names():
        if name not in stored:
            raise VerificationError(f"export: expected parameter {name} in the exported network, got none")
        w = stored[name]
        a = w.asnumpy() if w.dtype == ms.int8 else w.astype(ms.float32).asnumpy()
        if name in unstore:
            a = unstore[name](a)
        if a.shape != tuple(p.shape):
            raise VerificationError(f"export: expected {name} of shape {tuple(p.shape)}, got {a.shape}")
        p.set_data(ms.Tensor(a, dtype=p.dtype))
    gold.set_train(False)
    return gold


def _ambiguous_tokens(gold, twin, x32, xd, dtype):
    """Tokens of a top-level MoE block whose experts a correct device may choose otherwise: the last chosen and the
    first passed-over router score within 8 roundings of a tie (the logits rounded to the dtype by softmax routers,
    summed over H in float32 by DeepSeek's), or a top-k that differs between the golden network and the
    computation in the dtype. A device that takes the other expert is off by a whole expert's output there."""
    from ms_swiglu.moe import PackedMoE  # noqa: PLC0415
    from ms_swiglu.routers import SigmoidGroupTopK  # noqa: PLC0415

    if not isinstance(gold, PackedMoE):
        return []
    h, k, router = x32.shape[-1], gold.top_k, gold.router
    x = x32.asnumpy().reshape(-1, h).astype(np.float64)
    scores = x @ router.weight.asnumpy().astype(np.float64).T  # [T, E]
    if isinstance(router, SigmoidGroupTopK):
        scores = 1 / (1 + np.exp(-scores)) + router.e_score_correction_bias.asnumpy()
        u = 2.0 ** -24 * np.sqrt(h)
    else:
        u = UNIT_ROUNDOFF[dtype] + 2.0 ** -24 * np.sqrt(h)
    ranked = -np.sort(-scores, -1)
    near = np.zeros(len(x), bool)
    if k < scores.shape[-1]:
        near = ranked[:, k - 1] - ranked[:, k] <= 8 * u * (np.abs(ranked[:, k - 1]) + np.abs(ranked[:, k]))
    a = np.sort(gold.router(x32.reshape(-1, h))[1].asnumpy(), -1)
    b = np.sort(twin.router(xd.reshape(-1, h))[1].asnumpy(), -1)
    return [int(t) for t in np.nonzero(near | (a != b).any(-1))[0]]


def check_host(req):
    """ExportError for a request that cannot be exported on this host; returns (device, chip)."""
    import mindspore as ms  # noqa: PLC0415

    if req.target not in TARGETS:
        raise ExportError(f"--target: expected one of {', '.join(TARGETS)}, got {req.target!r}")
    device = ms.get_context("device_target")
    if req.air and device != "Ascend":
        raise ExportError(f"--air: expected MindSpore running on an Ascend device (AIR export needs it), "
                          f"got device target {device}")
    if req.air and req.target == "cpu":
        raise ExportError("--air: expected --target ascend or portable, got cpu (bound to this host's .so)")
    if req.chip not in chips.BY_KEY:
        raise ExportError(f"--chip: expected one of {', '.join(chips.BY_KEY)}, got {req.chip!r}")
    chip = chips.BY_KEY[req.chip]
    if req.target == "ascend" and not chip.swiglu:
        raise ExportError(f"--target ascend: expected a chip CANN documents the builtin Swiglu for "
                          f"({', '.join(ascend_support.SUPPORT['Swiglu'].dtypes)}), got {chip.name}; export --target "
                          f"portable for it")
    return device, chip


def export(req):
    """Run the export described by ``req``; returns the manifest (a dict)."""
    import mindspore as ms  # noqa: PLC0415

    device, chip = check_host(req)
    ms.set_context(mode=ms.GRAPH_MODE)
    net, hidden, inter, model = _build(req, TARGETS[req.target])
    settle_request(req, net, chip)
    model_file = f"{req.name(model)}.{'air' if req.air else 'mindir'}"
    with FolderSet(req.output_dir, [model_file, *ARTIFACTS], req.force, label="--output-dir", noun="export",
                   manifest="manifest.json") as out:
        manifest = write_kit(req, out.stage, net, hidden, inter, model, device, chip)
        out.commit()
    return manifest


def settle_request(req, net, chip):
    """The dtype and weight format the built network has (None in ``req``: the checkpoint's), checked for the
    chip."""
    from ms_swiglu.mlp import param_dtype  # noqa: PLC0415

    req.dtype = str(param_dtype(net)).lower()  # None above: the checkpoint's dtype
    quant = sorted({c.quant for _, c in net.cells_and_names() if getattr(c, "quant", None)})
    req.quant = quant[0] if quant else None  # a quantized converted file: int8 without --quantize
    if req.target != "cpu":
        try:
            chips.check_dtype(req.dtype, chip)
        except ValueError as exc:
            raise ExportError(f"--chip {chip.key}: {exc}") from None


class Feed:
    """How one golden case reaches the exported graph: its inputs, and which of the single-process golden
    outputs it must give (this feed: all of them, the tokens whole; ``export.parallel`` has the sharded one)."""

    names = (INPUT_NAME,)
    zero_tokens = "not in the graph: the Cells return [..., 0, H] without calling it"

    def __init__(self, shape):
        self.shape = shape  # [B, S, H], -1 dynamic

    def specs(self, dtype):
        """The graph's input specs: [(shape, dtype name)]."""
        return [(self.shape, dtype)]

    def inputs(self, x):
        """(the graph's inputs as arrays, the first one the tokens [..., H]) for the global tokens ``x``."""
        return (x,)

    def rows(self, y, tokens):
        """(this graph's expected output from the single-process output ``y``, the token rows to exclude from the
        check given the global ones ``tokens``)."""
        return y, list(tokens)

    def case(self, inputs):  # noqa: ARG002
        """What a golden case records beside its input file."""
        return {}


def twin_backend(req, device):
    """The backend of the computation in the dtype that stands for a graph that does not run on ``device`` (e.g.
    Swiglu has no CPU kernel): the cpu backend's int8 kernels, else composite."""
    return "cpu" if req.quant and device == "CPU" else "composite"


def write_kit(req, work, net, hidden, inter, model, device, chip, *, feed=None, twin=None, cases=None, comm=None,
              allowed=frozenset()):
    """The MindIR of ``net`` and its kit, written into the folder ``work``; returns the manifest. ``feed``: how
    the golden cases reach the graph (:class:`Feed`); ``twin``: the dtype computation checked; ``cases``: the
    golden cases (:func:`golden_cases`; default: from ``req``'s float32 golden network); ``comm``: the manifest's
    ``communication`` entry of a graph with collectives (its MindIR's groups named as it says:
    ``export.parallel``); ``allowed``: op types beyond the backend's that the graph may hold (an expert-parallel
    rank's)."""
    import mindspore as ms  # noqa: PLC0415

    name = req.name(model)
    fmt = "AIR" if req.air else "MINDIR"
    model_file = f"{name}.{fmt.lower()}"
    backend = backends.get(TARGETS[req.target])
    runs_here = backend.runs_on(device)
    shape = list(req.static_shape or (-1, -1)) + [hidden]
    feed = feed or Feed(shape)
    # the dtype computation held against the golden outputs: the network itself where it runs on this device,
    # else its twin
    twin = twin or (net if runs_here else _build(req, twin_backend(req, device))[0])
    cases = cases or golden_cases(req, hidden, golden_net(req, net), twin)
    specs = [ms.Tensor(shape=[None if d < 0 else d for d in s], dtype=getattr(ms, dt)) for s, dt in
             feed.specs(req.dtype)]
    net.set_inputs(*specs)
    _ms_export(net, specs, os.path.join(work, model_file), fmt)
    signals.pause_point("export-written")
    found = op_types(os.path.join(work, model_file)) if fmt == "MINDIR" else []
    if fmt == "MINDIR":
        _check_ops(found, req.target, allowed)
        _check_int8(net, os.path.join(work, model_file), found, req.target)
        rename_input(os.path.join(work, model_file), feed.names)  # names converter_lite's syntax takes
        if comm:
            comm = comm(os.path.join(work, model_file))
    if req.target == "ascend":
        why = ascend_support.refusal(found, chip.key, req.dtype)
        if why:
            raise ExportError(f"--target ascend --chip {chip.key}: {why}; export --target portable for it")
    criterion = acceptance(req.dtype, **chain(net))
    golden, twin_cases = _write_golden(req, work, cases, twin, criterion, feed)
    shutil.copyfile(KIT_SCRIPT, os.path.join(work, "verify_on_device.py"))
    deployable = bool(backend.facts.deployable)
    paths = _runtime_paths(req.target, found)
    air_name = dataclasses.replace(req, static_shape=req.static_shape or AIR_DEFAULT_SHAPE, air=True).name(model)
    if comm:  # converter_lite and ATC compile one device's graph: a rank's collectives need all ranks
        converter = None
        write_scripts(work, name, req, converter, air_name, deployable, chip, refusal=(
            f"{name}.mindir is one rank of an expert-parallel set: it runs with the other ranks through "
            f"MindSpore under msrun (the set's manifest.json, verify_command), not through converter_lite or ATC"))
    else:
        with open(os.path.join(work, "converter_lite.cfg"), "w") as f:
            f.write(converter_config(INPUT_NAME, shape, req.dtype, chip))
        converter = converter_command(name, INPUT_NAME, shape)
        write_scripts(work, name, req, converter, air_name, deployable, chip, paths["ge"]["missing"])

    manifest = {
        "name": name, "format": fmt, "model_file": model_file, "target": req.target, "deployable": deployable,
        "runtime_paths": paths,
        "chip": {"name": chip.name, "key": chip.key, "soc_family": chip.soc_family} if req.target != "cpu" else None,
        "source": {"checkpoint": os.path.basename(os.path.normpath(req.checkpoint)) if req.checkpoint else None,
                   "preset": req.preset, "seed": None if req.checkpoint else req.seed, "model": model,
                   "layers": list(req.layers), "network": "FFNStack (RMSNorm -> packed MLP or MoE -> residual)"
                   if req.stack else type(net).__name__},
        "hidden_size": hidden, "intermediate_size": inter, "dtype": req.dtype, "moe": _moe_note(req),
        "weights": {"quant": req.quant, "format": formats.get(req.quant).summary} if req.quant else {"quant": None},
        "inputs": [{"name": n, "shape": s, "dtype": dt, "dynamic": [i for i, d in enumerate(s) if d < 0]}
                   for n, (s, dt) in zip(feed.names, feed.specs(req.dtype))],
        "outputs": [{"shape": feed.specs(req.dtype)[0][0], "dtype": req.dtype}],
        "zero_tokens": feed.zero_tokens,
        "op_types": found,
        "golden": golden,
        "acceptance": criterion,
        "checked": {"graph": True, "golden": "cpu twin" if not runs_here else
                    "reloaded MindIR on the CPU" if device == "CPU" else f"reloaded MindIR on {device}",
                    "device": device == "Ascend" and runs_here},
        "verification": {"op_types": "ok", "straight_line": True,
                         "allowed_ops": sorted(backend.facts.allowed_ops | allowed) if backend.facts.allowed_ops
                         else None,
                         "cpu_twin": twin_cases},
        "converter_command": converter,
        "atc_command": None if comm else atc_command(air_name),
        "files": {},
    }
    manifest["inputs"][0]["tokens"] = {"min": 1, "max": None}
    if comm:
        manifest["communication"] = comm
    write_manifest(work, manifest)
    if runs_here and fmt == "MINDIR" and not comm:  # (a graph with collectives: verified by its ranks together)
        manifest["verification"]["reloaded"] = _verify_kit(work, model_file, device)
        write_manifest(work, manifest)
    return manifest


def write_manifest(work, manifest):
    """manifest.json with the sha256 of every other file of the kit."""
    manifest["files"] = {}
    for root, _, files in os.walk(work):
        for fname in sorted(files):
            path = os.path.join(root, fname)
            if os.path.relpath(path, work) != "manifest.json":
                manifest["files"][os.path.relpath(path, work)] = sha256(path)
    with open(os.path.join(work, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


def golden_cases(req, hidden, gold, twin):
    """[(tokens [B, S, H]: float32 values of the dtype, the float32 golden output, the ambiguous tokens)] for the
    request's golden shapes: the outputs of the float32 golden network ``gold`` from exactly the values the device
    gets; ambiguous: tokens whose experts ``twin`` (in the dtype) may choose otherwise (:func:`_ambiguous_tokens`)."""
    import mindspore as ms  # noqa: PLC0415

    cases = []
    for case, (b, s, _) in enumerate(_golden_shapes(req)):
        rng = np.random.default_rng(req.seed * 1000 + case)
        x = ms.Tensor(rng.standard_normal((b, s, hidden)).astype(np.float32)).astype(getattr(ms, req.dtype))
        x_values, _ = _raw(x, req.dtype)
        y = gold(ms.Tensor(x_values)).asnumpy()
        cases.append((x_values, y, _ambiguous_tokens(gold, twin, ms.Tensor(x_values), x, req.dtype)))
    return cases


def _write_golden(req, work, cases, twin, criterion, feed):
    """The golden ``cases`` (:func:`golden_cases`) into ``work``/golden as ``feed`` (:class:`Feed`) gives them to
    the graph: inputs in the dtype (.bin) and as exact float32 values (.npy), outputs of the float32 golden network
    (.npy, .bin float32). Returns (the manifest's golden entries, the dtype twin's result per case by the
    criterion); a twin that fails it is a bug (VerificationError)."""
    import mindspore as ms  # noqa: PLC0415

    golden_dir = os.path.join(work, "golden")
    os.mkdir(golden_dir)
    entries, results = [], []
    for case, (x_values, y, ambiguous) in enumerate(cases):
        y, excluded = feed.rows(y, ambiguous)
        inputs = feed.inputs(x_values)
        twin_inputs = [ms.Tensor(inputs[0]).astype(getattr(ms, req.dtype)), *map(ms.Tensor, inputs[1:])]
        result = check(twin(*twin_inputs).astype(ms.float32).asnumpy(), y, criterion, excluded)
        results.append(dict(result, case=case))
        if not result["ok"]:
            raise VerificationError(f"export: expected the {req.dtype} computation to pass the acceptance criterion "
                                    f"against the float32 golden outputs, got {result}")
        x_values, x_raw = _raw(ms.Tensor(inputs[0]), req.dtype)
        tokens = int(np.prod(x_values.shape[:-1]))
        entry = {"case": case, "tokens": tokens, "shape": list(x_values.shape), "excluded_tokens": excluded,
                 **feed.case(inputs)}
        for role, values, raw, dtype in (("input", x_values, x_raw, req.dtype), ("output", y, y.tobytes(), "float32")):
            stem = os.path.join(golden_dir, f"{role}_{case}_t{tokens}")
            np.save(stem + ".npy", values)
            with open(stem + ".bin", "wb") as f:
                f.write(raw)
            entry[role] = {"npy": os.path.relpath(stem + ".npy", work), "bin": os.path.relpath(stem + ".bin", work),
                           "bin_dtype": dtype, "npy_dtype": "float32"}
        entries.append(entry)
    return entries, results


def _runtime_paths(target, found):
    """Which runtime path has evidence of taking the graph (docs/ascend.md): the support table's for ``ascend``;
    the common ops of ``portable`` have both an aclnn kernel and a GE adapter; ``cpu`` deploys nowhere."""
    if target == "ascend":
        return ascend_support.paths(found)
    ok = target == "portable"
    return {path: {"evidence": ok, "missing": [] if ok else ["Custom"]} for path in ascend_support.PATHS}


def _moe_note(req):
    """The MoE block of the exported layers (None for dense ones): its config and which layers are sparse."""
    if not req.checkpoint:
        return None
    config = read_config(req.checkpoint)
    sparse = [i for i in range(req.layers[0], req.layers[1] + 1) if config.is_moe_layer(i)]
    if not sparse:
        return None
    router = dict(dataclasses.asdict(config.moe.router), scoring=config.moe.router.scoring)
    return dict(dataclasses.asdict(config.moe), router=router, sparse_layers=sparse)


_MS_FILE_NAME = re.compile(r"^[0-9a-zA-Z@\_\-\.\:\/\\]+$")  # what mindspore.export accepts as a path


@contextlib.contextmanager
def _ms_path(path):
    """A path for the file ``path`` that MindSpore's export and load take: ``path`` itself, or one in a new folder
    under $TMPDIR (or /tmp), removed after the block; MindSpore refuses a space or non-ASCII letters in a file
    name, and a path that is not UTF-8 in its loader."""
    if _MS_FILE_NAME.match(os.path.realpath(path)):
        yield path
        return
    bases = [b for b in (tempfile.gettempdir(), "/tmp") if _MS_FILE_NAME.match(os.path.realpath(b) + "/x")]
    if not bases:
        raise ExportError(f"--output-dir: expected a path MindSpore's export accepts ({_MS_FILE_NAME.pattern}), or "
                          f"TMPDIR of such a path, got {path!r} and TMPDIR {tempfile.gettempdir()!r}")
    stage = tempfile.mkdtemp(prefix="ms-swiglu-export-", dir=bases[0])
    try:
        yield os.path.join(stage, os.path.basename(path))
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _ms_export(net, samples, path, fmt):
    """``mindspore.export`` of ``net`` (inputs ``samples``) to the file ``path`` (its name ends in the format's
    extension)."""
    import mindspore as ms  # noqa: PLC0415

    with _ms_path(path) as target:
        ms.export(net, *samples, file_name=os.path.splitext(target)[0], file_format=fmt)
        if target != path:
            shutil.move(target, path)

