"""``ms-swiglu export``: a MindIR of a packed MLP (or a stack of FFN blocks) and its kit for the device.

Targets:
    ascend    the builtin ``Swiglu`` (and MindSpore's MoE primitives), no Custom op; for the Ascend chips and dtypes
              of ``ms_swiglu.backends.ascend_support``, through MindSpore's own runtime (docs/ascend.md)
    portable  split + silu + mul only: runs wherever MindSpore / MindSpore Lite runs
    ge        ops with a GE adapter only, MoE sparse by GE's MoE ops (Atlas A2/A3; MoE layers at a static shape)
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

from ms_swiglu import backends
from ms_swiglu.backends import ascend_support, chips
from ms_swiglu.checkpoint import read_config
from ms_swiglu.config import preset as preset_shape
from ms_swiglu import quant as formats
from ms_swiglu import processes, signals
from ms_swiglu.outputs import FolderSet
from ms_swiglu.processes import python
from ms_swiglu.export.kit import AIR_DEFAULT_SHAPE, atc_command, converter_command, converter_config, write_scripts
from ms_swiglu.export import roofline
from ms_swiglu.export.acceptance import golden_files
from ms_swiglu.export.errors import ExportError, VerificationError
from ms_swiglu.export.golden import golden_cases
from ms_swiglu.export.graph_checks import check_graph
from ms_swiglu.export.mindir import rename_input, set_user_info
from ms_swiglu.export.verify_on_device import FACTS_KEY, sha256

# export target -> the backend whose graph it exports
TARGETS = {"ascend": "ascend", "portable": "composite", "cpu": "cpu", "ge": "ge"}
INPUT_NAME = "x"  # the MindIR's input, renamed: MindSpore's own names hold ":", converter_lite's separator
# the kit beside the model file; "golden/" is a folder
ARTIFACTS = ("manifest.json", "converter_lite.cfg", "convert_lite.sh", "export_air.sh", "verify_on_device.py",
             "golden/")
KIT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "verify_on_device.py")


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
    quant: str = None  # a weight format to quantize a float checkpoint to (``ms_swiglu.quant``; a quantized one has its own)

    def name(self, model):
        what = f"ffn{self.layers[0]}-{self.layers[1]}" if self.stack else f"mlp{self.layers[0]}"
        shape = f"-{self.static_shape[0]}x{self.static_shape[1]}" if self.static_shape else ""
        weights = f"-w{self.quant}" if self.quant else ""
        return f"{model}-{what}-{self.target}-{self.dtype}{weights}{shape}"


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
                            for i in layers], branch_outputs=True)
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
            net = FFNStack([FFNBlock(hidden, inter, dtype=dtype, backend=backend, mlp=mlp()) for _ in layers],
                           branch_outputs=True)
        else:
            net = mlp()
    net.set_train(False)
    return net, hidden, inter, model


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
    from ms_swiglu.mlp import held_forms  # noqa: PLC0415

    with empty_weights():  # every weight is set from net's below
        gold = _build(dataclasses.replace(req, dtype="float32"), "composite")[0]
    stored, forms = dict(net.parameters_and_names()), held_forms(net)
    for name, p in gold.parameters_and_names():
        if name not in stored:
            raise VerificationError(f"export: expected parameter {name} in the exported network, got none")
        w = stored[name]
        # stored formats' containers as they are (int8, packed int4 bytes), float weights widened
        a = w.asnumpy() if w.dtype in (ms.int8, ms.uint8, ms.qint4x2) else w.astype(ms.float32).asnumpy()
        if name in forms:  # back to the format's own storage from the form its op holds it in
            a = forms[name].unstore(a)
        if a.shape != tuple(p.shape):
            raise VerificationError(f"export: expected {name} of shape {tuple(p.shape)}, got {a.shape}")
        p.set_data(ms.Tensor(a, dtype=p.dtype))
    gold.set_train(False)
    return gold


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
    if backends.get(TARGETS[req.target]).facts.static_moe and not req.static_shape and _moe_note(req):
        raise ExportError(f"--target {req.target}: expected --static-shape B,S for a MoE layer (MoeInitRouting's "
                          f"active_num, the token count, is an attribute GE fixes when it compiles), got dynamic "
                          f"batch and sequence")
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
    golden cases (``export.golden``; default: from ``req``'s float32 golden network); ``comm``: the manifest's
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
    golden, twin_cases, outputs, facts = golden_files(req, work, net, cases, twin, feed)
    _ms_export(net, specs, os.path.join(work, model_file), fmt)
    signals.pause_point("export-written")
    found = []
    if fmt == "MINDIR":
        found = check_graph(os.path.join(work, model_file), net, req.target, TARGETS[req.target], chip, req.dtype,
                            allowed)
        rename_input(os.path.join(work, model_file), feed.names)  # names converter_lite's syntax takes
        set_user_info(os.path.join(work, model_file), FACTS_KEY, json.dumps(facts))
        if comm:
            comm = comm(os.path.join(work, model_file))
    shutil.copyfile(KIT_SCRIPT, os.path.join(work, "verify_on_device.py"))
    deployable = bool(backend.facts.deployable)
    paths = _runtime_paths(found)
    air_name = dataclasses.replace(req, static_shape=req.static_shape or AIR_DEFAULT_SHAPE, air=True).name(model)
    if comm:  # converter_lite and ATC compile one device's graph: a rank's collectives need all ranks
        converter = None
        write_scripts(work, name, req, converter, air_name, deployable, chip, refusal=(
            f"{name}.mindir is one rank of an expert-parallel set: it runs with the other ranks through "
            f"MindSpore under msrun (the set's manifest.json, verify_command), not through converter_lite or ATC"))
    else:
        with open(os.path.join(work, "converter_lite.cfg"), "w") as f:
            f.write(converter_config(INPUT_NAME, shape, req.dtype, chip, [g["shape"] for g in golden]))
        converter = converter_command(name, INPUT_NAME, shape)
        write_scripts(work, name, req, converter, air_name, deployable, chip, paths["ge"]["missing"])

    out_shape = feed.specs(req.dtype)[0][0]
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
        "outputs": [{"name": o["name"], "shape": out_shape, "dtype": req.dtype, "acceptance": o["acceptance"],
                     "branches": o["branches"]} for o in outputs],
        "zero_tokens": feed.zero_tokens,
        "op_types": found,
        "golden": golden,
        "roofline": roofline.manifest_entry(net, golden, chip, req.dtype),  # verify_on_device's predicted time
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


def _runtime_paths(found):
    """Which runtime path has evidence of taking the graph (docs/ascend.md), op by op: the support table's kernels,
    and the GE adapters of the installed wheel (``ascend_support.paths``)."""
    return ascend_support.paths(found)


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

