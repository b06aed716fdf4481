"""``ms-swiglu``: run one MLP layer of a HuggingFace checkpoint, convert checkpoints to packed weights, export them.

Bad input exits with status 2 and one line on stderr naming what was expected and what was found; anything else
that fails is a bug or the environment (exit 1, one line, the traceback kept in a log file the line names). Every
output appears whole or not at all, and an existing one is kept unless --force (``ms_swiglu.outputs``).
"""
import contextlib
import datetime
import os
import signal
import sys
import tempfile
import traceback

import numpy as np

from ms_swiglu.backends import NAMES as BACKENDS
from ms_swiglu.backends.chips import BY_KEY as CHIPS, DEFAULT as DEFAULT_CHIP
from ms_swiglu.checkpoint.converted import convert
from ms_swiglu.checkpoint.source import open_checkpoint
from ms_swiglu.config import DTYPE_BYTES, DTYPE_NAMES, PRESETS
from ms_swiglu import signals
from ms_swiglu.errors import ArgumentParser, InputError
from ms_swiglu.layout import DISPATCHES, check_split
from ms_swiglu.outputs import check_folder, check_writable
from ms_swiglu.quant import names as quant_names
from ms_swiglu.processes import scratch_cwd
from ms_swiglu.progress import end_line, progress
from ms_swiglu.runner import check_fits, layer_bytes, read_input, run_layer

UsageError = InputError  # bad command-line input


def _count(name, value, minimum=1):
    if value < minimum:
        raise UsageError(f"{name}: expected an integer >= {minimum}, got {value}")
    return value


def _layer_range(spec):
    """``A-B`` or ``N`` as a range of layers."""
    if not spec.strip():
        raise UsageError(f"--layers: expected A-B or N, got {spec!r}")
    try:
        first, dash, last = spec.partition("-")
        layers = range(int(first), int(last if dash else first) + 1)
    except ValueError:
        raise UsageError(f"--layers: expected A-B or N, got {spec!r}") from None
    if not layers:
        raise UsageError(f"--layers: expected A <= B, got {spec!r}")
    return layers


def _layers(spec, config):
    """``A-B`` or ``N`` as a range of layers that the checkpoint has."""
    layers = _layer_range(spec)
    for layer in (layers.start, layers.stop - 1):
        config.check_layer(layer)
    return layers


def _only_with(args, rules):
    """Refuse an option given without the one it takes effect with (``rules``: (option, attribute, when it takes
    effect, whether ``args`` meet that, what they have instead)), then give the absent ones their defaults
    (``_DEFAULTS``): a user never wonders which option took effect."""
    for option, attribute, when, met, instead in rules:
        if getattr(args, attribute) is not None and not met:
            raise UsageError(f"{option}: expected only {when}, got it with {instead}")
        if getattr(args, attribute) is None:
            setattr(args, attribute, _DEFAULTS.get(attribute))


_DEFAULTS = {"tokens": 16, "seed": 0, "dispatch": "replicated"}


def cmd_run(args):
    ranks, ep = args.tp_size * args.ep_size > 1, f"--ep-size {args.ep_size}"
    _only_with(args, [("--dispatch", "dispatch", "with --ep-size K > 1", args.ep_size > 1, ep),
                      ("--master-port", "master_port", "with --tp-size or --ep-size K > 1", ranks, "one process"),
                      ("--log-dir", "log_dir", "with --tp-size or --ep-size K > 1", ranks, "one process"),
                      ("--tokens", "tokens", "without --input (it sets the tokens)", args.input is None, "--input"),
                      ("--seed", "seed", "without --input (it seeds random tokens)", args.input is None, "--input")])
    _count("--tokens", args.tokens)
    _count("--repeat", args.repeat)
    _count("--tp-size", args.tp_size)
    _count("--ep-size", args.ep_size)
    _one_split(args)
    if args.master_port is not None and not 1 <= args.master_port <= 65535:
        raise UsageError(f"--master-port: expected a port in 1..65535, got {args.master_port}")
    ckpt = open_checkpoint(args.checkpoint)
    config = ckpt.config
    config.check_layer(args.layer)
    # converted files: every rank's file of one conversion with this --tp-size (--ep-size), holding the layer
    ckpt.check([args.layer], args.tp_size, args.quantize, args.ep_size)
    x = read_input(args.input, config.hidden_size) if args.input is not None else None
    check_fits("--input" if x is not None else "--tokens",
               layer_bytes(config, args.layer, x.size // config.hidden_size if x is not None else args.tokens))
    out = check_writable(args.output, args.force) if args.output is not None else None
    if x is None:
        x = np.random.default_rng(args.seed).standard_normal((args.tokens, config.hidden_size)).astype(np.float32)
    if args.tp_size * args.ep_size > 1:
        from ms_swiglu.launch.msrun import launch  # noqa: PLC0415

        return launch(args, x, out)
    with scratch_cwd():  # MindSpore and AKG write compile files into the working directory
        run_layer(ckpt, args.layer, x, dtype=args.dtype,
                  backend=args.backend, repeat=args.repeat, output=out, force=args.force, quant=args.quantize)
    return 0


def _one_split(args):
    check_split(args.tp_size, args.ep_size, ("--tp-size", "--ep-size"))


def cmd_convert(args):
    _count("--tp-size", args.tp_size)
    _count("--ep-size", args.ep_size)
    _one_split(args)
    layers = None if args.layers is None else _layer_range(args.layers)
    written, dtype = convert(args.checkpoint, args.output, layers=layers, tp_size=args.tp_size, ep_size=args.ep_size,
                             dtype=args.dtype,
                             quant=args.quantize, force=args.force,
                             progress=lambda done, total: progress("convert", done, total, "layers"))
    what = f"{dtype}, projections {args.quantize}" if args.quantize else dtype
    for path, count in written:
        print(f"wrote {path} ({count} tensors, {what})")
    return 0


def _static_shape(spec):
    try:
        batch, seq = (int(v) for v in spec.split(","))
    except ValueError:
        raise UsageError(f"--static-shape: expected B,S (two positive integers), got {spec!r}") from None
    if batch < 1 or seq < 1:
        raise UsageError(f"--static-shape: expected B,S (two positive integers), got {spec!r}")
    return batch, seq


def cmd_export(args):
    from ms_swiglu.export.exporter import ExportRequest, export  # noqa: PLC0415
    from ms_swiglu.export.verify_on_device import kit_id  # noqa: PLC0415 -- sha256 of manifest.json

    ep = f"--ep-size {args.ep_size}"
    _only_with(args, [("--dispatch", "dispatch", "with --ep-size K > 1", args.ep_size > 1, ep),
                      ("--master-port", "master_port", "with --ep-size K > 1", args.ep_size > 1, ep)])
    _count("--ep-size", args.ep_size)
    if args.ep_size > 1 and args.layers is not None:
        raise UsageError(f"--ep-size: expected --layer N (one MoE layer), got --layers {args.layers}")
    if args.ep_size > 1 and args.target == "ge":
        raise UsageError("--ep-size: expected --target ascend or portable, got ge (its MoE graph holds every expert: "
                         "MoeInitRouting takes no other rank's slots)")
    if args.checkpoint:
        ckpt = open_checkpoint(args.checkpoint)
        config = ckpt.config
        if args.layer is None and args.layers is None:
            raise UsageError("export: expected --layer N or --layers A-B with --checkpoint, got neither")
        if args.layers is not None:
            layers = _layers(args.layers, config)
        else:
            config.check_layer(args.layer)
            layers = range(args.layer, args.layer + 1)
        ckpt.check(layers, 1, args.quantize, args.ep_size)
    else:
        if args.layer is not None:
            raise UsageError("export: expected --layers A-B (a stack of blocks) with --preset, got --layer")
        layers = _layer_range("0" if args.layers is None else args.layers)
    if not args.output_dir:
        raise UsageError("--output-dir: expected a folder name, got an empty string")
    check_folder(args.output_dir, "--output-dir")
    hidden, inter = (config.hidden_size, config.intermediate_size) if args.checkpoint else PRESETS[args.preset]
    params = sum(config.layer_parameters(i) for i in layers) if args.checkpoint else 3 * hidden * inter * len(layers)
    # the network's weights and their copy in the MindIR (float32 where the dtype is not given)
    check_fits("--layers" if args.layers else "--layer", 2 * DTYPE_BYTES.get(args.dtype, 4) * params)
    static = _static_shape(args.static_shape) if args.static_shape else None
    if static:
        check_fits("--static-shape", 4 * static[0] * static[1] * (2 * hidden + 3 * inter) * 2)  # two golden cases
    req = ExportRequest(output_dir=args.output_dir, target=args.target, checkpoint=args.checkpoint,
                        preset=args.preset, seed=args.seed, layers=(layers.start, layers.stop - 1),
                        stack=args.layers is not None, dtype=args.dtype, force=args.force, air=args.air,
                        chip=args.chip, static_shape=static, quant=args.quantize)
    if args.ep_size > 1:
        return _export_ep(req, args)
    manifest = export(req)
    out = os.path.abspath(args.output_dir)
    checked = manifest["checked"]
    golden = f"golden outputs against the {checked['golden']}"
    print(f"wrote {os.path.join(out, manifest['model_file'])} (target {manifest['target']}, {manifest['dtype']}, "
          f"input {manifest['inputs'][0]['shape']})")
    print(f"op types: {', '.join(manifest['op_types'])}")
    paths = ", ".join(f"{path} {'yes' if p['evidence'] else 'no (' + ', '.join(p['missing']) + ')'}"
                      for path, p in manifest["runtime_paths"].items())
    print(f"runtime paths with evidence for every op: {paths}")
    print(f"checked: graph (op types, straight-line), {golden}, device: {'yes' if checked['device'] else 'no'} "
          f"(on the device: python verify_on_device.py in {out})")
    print(f"kit id: {kit_id(out)} (verify_on_device.py prints it first)")
    return 0


def _export_ep(req, args):
    from ms_swiglu.export.parallel import export_ep  # noqa: PLC0415
    from ms_swiglu.export.verify_on_device import kit_id  # noqa: PLC0415

    manifest = export_ep(req, args.ep_size, args.dispatch, args.master_port)
    out = os.path.abspath(args.output_dir)
    for r in manifest["ranks"]:
        print(f"wrote {os.path.join(out, r['kit'], r['model_file'])} (rank {r['rank']} of {manifest['ep_size']}, "
              f"{manifest['dispatch']} tokens, target {manifest['target']}, {manifest['dtype']})")
    print(f"op types (rank 0): {', '.join(manifest['ranks'][0]['op_types'])}")
    comm = manifest["communication"]
    print(f"communication group: {comm['group']} ({comm['checked']})")
    print(f"checked: graphs (op types, straight-line), each rank's golden outputs against the "
          f"{manifest['ranks'][0]['checked']['golden']}; on the device, in {out}: {manifest['verify_command']}")
    print(f"kit id: {kit_id(out)} (verify_on_device.py prints it first)")
    return 0


# The options that shape one export; --device-check makes its own kits (export.device_check.KITS), so each is
# refused with it rather than ignored.
_SINGLE_EXPORT = (("--checkpoint", "checkpoint"), ("--output-dir", "output_dir"), ("--layer", "layer"),
                  ("--layers", "layers"), ("--target", "target"), ("--dtype", "dtype"), ("--quantize", "quantize"),
                  ("--static-shape", "static_shape"), ("--air", "air"), ("--ep-size", "ep_size"),
                  ("--dispatch", "dispatch"), ("--master-port", "master_port"))


def _export_command(args):
    """``export``: one export (--checkpoint or --preset, and --output-dir), or the device check's set."""
    if args.device_check is not None:
        return cmd_device_check(args)
    if args.checkpoint is None and args.preset is None:
        raise UsageError("export: expected --checkpoint, --preset or --device-check DIR, got none of them")
    if args.output_dir is None:
        raise UsageError("--output-dir: expected a folder with --checkpoint or --preset, got none")
    args.target = "ascend" if args.target is None else args.target
    args.ep_size = 1 if args.ep_size is None else args.ep_size
    return cmd_export(args)


def cmd_device_check(args):
    from ms_swiglu.export import device_check  # noqa: PLC0415

    for option, attribute in _SINGLE_EXPORT:
        value = getattr(args, attribute)
        if value is not None and value is not False:
            given = option if value is True else f"{option} {value}"
            raise UsageError(f"{option}: expected only --preset, --seed, --chip and --force beside --device-check "
                             f"(its kits are fixed), got {given}")
    if not args.device_check:
        raise UsageError("--device-check: expected a folder name, got an empty string")
    _count("--seed", args.seed, minimum=0)  # it seeds NumPy's generator of the checkpoint's weights
    folder = check_folder(args.device_check, "--device-check")
    bf16 = [key for key, chip in CHIPS.items() if chip.bfloat16]  # the kits are bfloat16, and a GE MoE layer
    if args.chip not in bf16:
        raise UsageError(f"--chip: expected {' or '.join(bf16)} with --device-check (its kits are bfloat16), got "
                         f"{args.chip}")
    preset = args.preset or device_check.DEFAULT_PRESET
    shape = device_check.model_shape(preset)
    check_fits("--preset", device_check.peak_bytes(shape))
    manifest = device_check.write_set(folder, preset, args.seed, args.chip, args.force,
                                      progress=lambda done, total: progress("device check", done, total, "kits"))
    for kit in manifest["kits"]:
        print(f"wrote {os.path.join(folder, kit['folder'], kit['model_file'])} (kit id {kit['id']})")
    print(f"wrote {', '.join(os.path.join(folder, name) for name in device_check.OTHER)}")
    print(f"on the device: copy {folder} to the NPU host (MindSpore 2.10 for Ascend, NumPy) and run `python "
          f"{device_check.SCRIPT} [--device-id N]` in it; it prints one line per kit and what to send back")
    return 0


def build_parser():
    parser = ArgumentParser(prog="ms-swiglu", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    run = sub.add_parser("run", help="run the packed MLP of one checkpoint layer in GRAPH_MODE")
    run.add_argument("--checkpoint", required=True,
                     help="HuggingFace checkpoint folder, or FILE.safetensors written by convert")
    run.add_argument("--quantize", choices=quant_names(),
                     help="weight-only quantization at load (a converted file keeps its own)")
    run.add_argument("--layer", type=int, required=True)
    run.add_argument("--input", help="float .npy of shape [..., hidden_size]")
    run.add_argument("--output", help="write the output here as float32 .npy")
    run.add_argument("--tokens", type=int, help="seeded random tokens when there is no --input (default 16)")
    run.add_argument("--seed", type=int, help="the random tokens' seed (default 0)")
    run.add_argument("--dtype", choices=DTYPE_NAMES, help="compute dtype (default: the checkpoint's)")
    run.add_argument("--backend", choices=BACKENDS, default="auto")
    run.add_argument("--repeat", type=int, default=3, help="timed calls after the compiling one")
    run.add_argument("--force", action="store_true", help="replace an existing --output")
    run.add_argument("--tp-size", type=int, default=1, help="tensor-parallel ranks, launched with msrun")
    run.add_argument("--ep-size", type=int, default=1,
                     help="expert-parallel ranks (each holds E/K routed experts whole), launched with msrun")
    run.add_argument("--dispatch", choices=DISPATCHES,
                     help="with --ep-size: every rank the same tokens (replicated, the default), or rank r the r-th "
                          "of K row blocks of the input (sharded)")
    run.add_argument("--master-port", type=int, help="msrun's port (default: a free one)")
    run.add_argument("--log-dir", help="msrun's log folder (default: a new temporary folder)")
    run.set_defaults(func=cmd_run)

    conv = sub.add_parser("convert", help="write packed (and tensor-parallel sharded) weights as safetensors")
    conv.add_argument("--checkpoint", required=True)
    conv.add_argument("--output", required=True, help="FILE.safetensors; with --tp-size K: FILE-tp{r}-of-K; with "
                                                      "--ep-size K: FILE-ep{r}-of-K")
    conv.add_argument("--layers", help="A-B (default: all)")
    conv.add_argument("--tp-size", type=int, default=1)
    conv.add_argument("--ep-size", type=int, default=1, help="one file per expert-parallel rank, with its E/K "
                                                             "routed experts")
    conv.add_argument("--dtype", choices=DTYPE_NAMES, help="default: the checkpoint's")
    conv.add_argument("--quantize", choices=quant_names(),
                      help="int8: the projections weight-only int8 with a float32 scale per output row; "
                           "int8-g128: a scale per 128 inputs of each row")
    conv.add_argument("--force", action="store_true")
    conv.set_defaults(func=cmd_convert)

    exp = sub.add_parser("export", help="write a verified MindIR and an Ascend deployment kit")
    src = exp.add_mutually_exclusive_group()  # one of them or --device-check (_export_command)
    src.add_argument("--checkpoint", help="HuggingFace checkpoint folder, or FILE.safetensors written by convert")
    exp.add_argument("--quantize", choices=quant_names(),
                     help="weight-only quantization at load (a converted file keeps its own)")
    src.add_argument("--preset", choices=sorted(PRESETS), help="seeded random weights of a known shape (with "
                                                               "--device-check: its dense layer's shape)")
    exp.add_argument("--layer", type=int, help="the MLP of this layer (with --checkpoint)")
    exp.add_argument("--layers", help="A-B: a stack of FFN blocks (RMSNorm -> MLP -> residual)")
    exp.add_argument("--seed", type=int, default=0)
    exp.add_argument("--output-dir", help="the export folder (with --checkpoint or --preset)")
    exp.add_argument("--device-check", metavar="DIR",
                     help="instead of one export: the kits of the device check (dense bfloat16, int8-g128 and "
                          "float32, a DeepSeek-V3-style MoE layer on the ascend and ge targets) and "
                          "run_device_check.py, written to DIR")
    exp.add_argument("--target", choices=("ascend", "portable", "cpu", "ge"), help="default ascend")
    exp.add_argument("--dtype", choices=DTYPE_NAMES, help="default: the checkpoint's (float32 for presets)")
    exp.add_argument("--static-shape", help="B,S: a fixed [B, S, H] input (default: dynamic batch and sequence)")
    exp.add_argument("--force", action="store_true", help="replace an earlier export in --output-dir")
    exp.add_argument("--air", action="store_true",
                     help="AIR for ATC instead of MindIR (Ascend hosts only; AIR is deprecated in MindSpore 2.10)")
    exp.add_argument("--ep-size", type=int,
                     help="one MindIR and kit per expert-parallel rank (exported under msrun), for --layer N "
                          "(default 1)")
    exp.add_argument("--dispatch", choices=DISPATCHES,
                     help="with --ep-size: every rank the same tokens (replicated, the default), or each its own")
    exp.add_argument("--master-port", type=int, help="with --ep-size: msrun's port (default: a free one)")
    exp.add_argument("--chip", choices=list(CHIPS), default=DEFAULT_CHIP.key,
                     help="the Ascend chip family the kit is for (default atlas-a2); --target ascend takes the chips "
                          "CANN documents its ops for (docs/ascend.md)")
    exp.set_defaults(func=_export_command)

    sub.add_parser("bench", add_help=False, help="MLP variants against the machine's ceilings (see --help)")
    return parser


def _log_bug(exc):
    """The traceback of an unexpected error, in a new file under $TMPDIR/ms-swiglu-logs; its path."""
    folder = os.path.join(tempfile.gettempdir(), "ms-swiglu-logs")
    os.makedirs(folder, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = os.path.join(folder, f"error-{stamp}-{os.getpid()}.log")
    with open(path, "w", errors="backslashreplace") as f:  # arguments may hold bytes that are not UTF-8
        f.write(f"ms-swiglu {' '.join(sys.argv[1:])}\n\n")
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=f)
    return path


def _first_line(exc):
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def _say(line):
    """One line on stderr; a closed terminal (SIGHUP) may refuse it."""
    end_line()
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)


def main(argv=None):
    """Exit status 0; 2 for bad input (one line); 1 for a failed worker, the environment (a full disk) or a bug
    (one line naming the traceback's log file); 128 + N for signal N (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
    argv = sys.argv[1:] if argv is None else argv
    for stream in (sys.stdout, sys.stderr):  # paths with bytes that are not UTF-8 print escaped
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")
    os.environ.setdefault("MS_OM_PATH", os.path.join(tempfile.gettempdir(), "ms-swiglu-om"))  # compile-failure dumps
    try:  # a signal raises once (ms_swiglu.signals): here, or while an error below is being reported
        status = _reported(argv) if signals.received() is None else 0  # one taken while starting: no work
        signals.settle()
    except KeyboardInterrupt as exc:  # signals.Interrupted for SIGINT, SIGTERM, SIGHUP
        status = getattr(exc, "status", 128 + signal.SIGINT)
    taken = signals.received()
    status = status if taken is None else 128 + taken  # a signal wins over a failure it caused meanwhile
    if status > 128:
        _say(f"ms-swiglu: interrupted ({signal.Signals(status - 128).name})")
    return status


def _reported(argv):
    """Run the command; its exit status, with an error reported as one line."""
    from ms_swiglu.launch.msrun import LaunchError  # noqa: PLC0415 -- no MindSpore import there

    try:
        if argv[:1] == ["bench"]:  # its own parser: ms_swiglu.tools.bench_mlp
            from ms_swiglu.tools.bench_mlp import main as bench_main  # noqa: PLC0415

            return bench_main(argv[1:])
        args = build_parser().parse_args(argv)
        return args.func(args)
    except InputError as exc:
        _say(f"ms-swiglu: error: {_first_line(exc)}")
        return 2
    except LaunchError as exc:
        _say(f"ms-swiglu: error: {_first_line(exc)}")
        return 1
    except OSError as exc:  # the environment: a full disk, a vanished file
        _say(f"ms-swiglu: error: {exc}")
        return 1
    except Exception as exc:  # noqa: BLE001 -- a bug: shown as one, with its traceback kept
        _say(f"ms-swiglu: internal error: {type(exc).__name__}: {_first_line(exc)} (traceback: {_log_bug(exc)})")
        return 1


if __name__ == "__main__":
    sys.exit(main())
