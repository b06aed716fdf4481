"""The Ascend deployment kit written beside an exported MindIR (docs/ascend.md). The files are checked as text
against the documented keys (MindSpore Lite "Ascend Conversion Tool Description" and "converter_tool"; CANN ATC
parameter pages), and the scripts are run in the tests against stub tools (npu-smi tables of each chip family,
converter_lite, atc); no NPU, converter_lite or ATC has run them.

    verify_on_device.py  the one command on the device (export/verify_on_device.py, copied)
    converter_lite.cfg   [ascend_context] precision and format; [acl_build_options] ND input with -1 dims and
                         ge.dynamicDims gears (the documented form of dynamic dimensions on Ascend). converter_lite
                         reads the SoC from the device itself (acl_model_options.cc)
    convert_lite.sh      converter_lite --fmk=MINDIR --optimize=ascend_oriented: writes <name>_ascend.mindir, a
                         MindIR holding the graph compiled for Ascend (converter_lite has no OM output); checks that
                         the host's chip family is the one exported for
    export_air.sh        the deprecated second path ("AIR format is deprecated, and will be removed in a future
                         version ... use MindSpore Lite", mindspore.export, 2.10): on an Ascend host, the same export
                         again as AIR (MindSpore on Ascend) + ATC (.air -> .om, --framework=1, --soc_version from
                         npu-smi). AIR models take no dynamic shape profiles in ATC: a static shape
Both scripts go through GE: where GE has no adapter for an op of the graph (``ascend_support``), they stop and name
the ``portable`` export, unless MS_SWIGLU_UNPROVEN=1.
"""
import os
import shlex

from ms_swiglu import quant as formats

# Gear levels (batch, seq) for a dynamic [batch, seq, H] input: Ascend offline models compile one graph per
# gear (at most 100, each value 1..2048). Decode (seq 1) and prefill lengths, and every golden case's shape (added
# by converter_config: a converted model must take the kit's own inputs); edit ge.dynamicDims in
# converter_lite.cfg for other serving shapes.
GEARS = [(1, 1), (4, 1), (8, 1), (1, 16), (1, 128), (1, 512), (1, 2048), (4, 512)]
MAX_GEARS, MAX_GEAR_DIM = 100, 2048
# Keep the model's dtype: the converter's default precision_mode, enforce_fp16, would turn a bfloat16 or
# float32 model into float16.
PRECISION_MODE = "enforce_origin"
ATC_PRECISION_MODE = "must_keep_origin_dtype"  # ATC's default force_fp16 casts bfloat16 and float32 down
AIR_DEFAULT_SHAPE = (1, 128)  # (batch, seq) of the AIR when the MindIR is dynamic: ATC cannot keep -1 dims
# The host's SoC and chip family in bash, by the CANN rule for --soc_version: "Ascend" + the Name column of
# `npu-smi info` ("| <npu id>  <Name>  | <health> ..."; 910B3, 310P3, 910ProB, 310B1), except on Atlas A3, whose
# Name is "Ascend910" for every SoC: there `npu-smi info -t board` gives Chip Name + "_" + NPU Name.
HOST_SOC = r"""host_soc() {
  local name chip npu
  name=$(npu-smi info 2>/dev/null | awk '$1 == "|" && $2 ~ /^[0-9]+$/ && $3 ~ /^(Ascend)?[0-9]/ {print $3; exit}')
  case "$name" in
    "") ;;
    Ascend910)
      chip=$(npu-smi info -t board -i 0 -c 0 2>/dev/null | awk -F: '/Chip Name/ {gsub(/[ \t]/, "", $2); print $2; exit}')
      npu=$(npu-smi info -t board -i 0 -c 0 2>/dev/null | awk -F: '/NPU Name/ {gsub(/[ \t]/, "", $2); print $2; exit}')
      if [ -n "$chip" ] && [ -n "$npu" ]; then echo "${chip}_${npu}"; fi ;;
    *) echo "Ascend$name" ;;
  esac
}
chip_family() {
  case "$1" in
    Ascend910B[1-4]*) echo atlas-a2 ;;
    Ascend910_93*) echo atlas-a3 ;;
    Ascend310P*) echo atlas-310p ;;
    Ascend310B*) echo atlas-310b ;;
    Ascend910*) echo atlas-910a ;;
    *) echo unknown ;;
  esac
}
"""


def _shape(shape):
    return ",".join(str(d) for d in shape)


def gears(golden_shapes=()):
    """The (batch, seq) gears of a dynamic input: :data:`GEARS` and the (batch, seq) of every golden input
    ([B, S, H]; a shape of another rank, such as an expert-parallel rank's [T, H], adds none), in order, once."""
    out = list(GEARS)
    for shape in golden_shapes:
        gear = tuple(shape[:2])
        if len(shape) == 3 and gear not in out:
            if not all(1 <= d <= MAX_GEAR_DIM for d in gear):
                raise ValueError(f"converter_lite.cfg: expected gear dims in 1..{MAX_GEAR_DIM}, got golden shape "
                                 f"{list(shape)}")
            out.append(gear)
    if len(out) > MAX_GEARS:
        raise ValueError(f"converter_lite.cfg: expected at most {MAX_GEARS} gears, got {len(out)}")
    return out


def converter_config(input_name, shape, dtype, chip, golden_shapes=()):
    """Text of converter_lite.cfg for a [batch, seq, H] input (``shape`` with -1 for dynamic dims), for ``chip``;
    ``golden_shapes``: the kit's golden input shapes, each of which gets its gear (:func:`gears`).

    A static shape goes on the command line (``--inputShape``), as the converter documents for static inputs. The
    SoC is the device's own (converter_lite asks aclrtGetSocName); convert_om.sh checks its family.
    """
    lines = [f"# converter_lite config written by ms-swiglu export; model dtype {dtype}, input {input_name}",
             f"# for {chip.name} ({chip.soc_family}; npu-smi names {chip.npu_smi_names})",
             "[ascend_context]",
             "input_format=ND",
             f"precision_mode={PRECISION_MODE}"]
    if -1 in shape:
        dims = ";".join(f"{b},{s}" for b, s in gears(golden_shapes))
        lines += ["", "[acl_build_options]", 'input_format="ND"', f'input_shape="{input_name}:{_shape(shape)}"',
                  f'ge.dynamicDims="{dims}"']
    return "\n".join(lines) + "\n"


def converter_command(name, input_name, shape):
    """The converter_lite command line (MindIR -> Ascend-optimised MindIR)."""
    cmd = ["converter_lite", "--fmk=MINDIR", f"--modelFile={name}.mindir", f"--outputFile={name}_ascend",
           "--optimize=ascend_oriented", "--configFile=converter_lite.cfg"]
    if -1 not in shape:
        cmd.append(f"--inputShape={input_name}:{_shape(shape)}")
    return " ".join(shlex.quote(c) for c in cmd)


def atc_command(name):
    """ATC for the AIR of the same network. For MindSpore (--framework=1) ATC ignores --input_shape and
    --input_format and refuses --dynamic_dims: the AIR's own static shape is what it compiles."""
    cmd = ["atc", "--mode=0", "--framework=1", f"--model={name}.air", f"--output={name}",
           "--soc_version=${SOC_VERSION}", f"--precision_mode={ATC_PRECISION_MODE}"]
    return " ".join(c if c.startswith("--soc_version") else shlex.quote(c) for c in cmd)


def _source_args(req):
    """The export's own arguments, for the same export as AIR: the checkpoint is the script's argument (no path of
    the exporting host)."""
    args = ["--checkpoint", "$CHECKPOINT"] if req.checkpoint else ["--preset", req.preset, "--seed", str(req.seed)]
    if req.stack:
        args += ["--layers", f"{req.layers[0]}-{req.layers[1]}"]
    elif req.checkpoint:
        args += ["--layer", str(req.layers[0])]
    args += ["--dtype", req.dtype, "--static-shape", ",".join(map(str, req.static_shape or AIR_DEFAULT_SHAPE))]
    if req.quant in formats.names():  # (a checkpoint quantized as published loads in its own format unasked)
        args += ["--quantize", req.quant]
    return " ".join(a if a == "$CHECKPOINT" else shlex.quote(a) for a in args).replace("$CHECKPOINT", '"$CHECKPOINT"')


_HEAD = """#!/usr/bin/env bash
# Generated by ms-swiglu export for {name} (target {target}); see docs/ascend.md.
set -euo pipefail
cd "$(dirname "$0")"
"""

_SOC = """SOC_VERSION="${{SOC_VERSION:-$(host_soc)}}"
if [ -z "$SOC_VERSION" ]; then
  echo "{script}: could not read the chip from npu-smi info; set SOC_VERSION (e.g. Ascend910B3)" >&2
  exit 2
fi
"""

_FAMILY = """HOST_SOC="$(host_soc)"
if [ -z "$HOST_SOC" ]; then
  echo "convert_lite.sh: could not read the chip from npu-smi info; converting for {chip_name} unchecked" >&2
elif [ "$(chip_family "$HOST_SOC")" != "{chip_key}" ]; then
  echo "convert_lite.sh: {name} was exported for {chip_name} ({chip_key}), this host is $HOST_SOC \
($(chip_family "$HOST_SOC")): export again with --chip $(chip_family "$HOST_SOC")" >&2
  exit 2
fi
"""

_UNPROVEN = """if [ "${{MS_SWIGLU_UNPROVEN:-0}}" != 1 ]; then
  echo "{script}: GE (which {tool} compiles with) has no adapter in MindSpore 2.10 for {ops} of this graph: \
run it with MindSpore itself (python verify_on_device.py), or export --target portable for this path; \
MS_SWIGLU_UNPROVEN=1 tries anyway" >&2
  exit 2
fi
"""


def write_scripts(folder, name, req, converter, air_name, deployable, chip, ge_missing=(), refusal=None):
    """convert_lite.sh and export_air.sh into `folder` (executable), for ``chip``; ``ge_missing``: the graph's ops
    that GE has no adapter for (the scripts stop on them); ``refusal``: why neither path takes the graph (both
    scripts then say it and exit 2)."""
    head = _HEAD.format(name=name, target=req.target)
    if not deployable and refusal is None:
        refusal = (f"{name}.mindir holds a Custom aot op bound to a host .so (--target cpu): it cannot be deployed "
                   f"to Ascend; export with --target ascend or portable")
    if refusal is not None:
        convert, air = (head + f'echo "{s}: {refusal}" >&2\nexit 2\n' for s in ("convert_lite.sh", "export_air.sh"))
    else:
        ops = ", ".join(ge_missing)
        unproven = {s: _UNPROVEN.format(script=s, tool=t, ops=ops) if ge_missing else ""
                    for s, t in (("convert_lite.sh", "converter_lite"), ("export_air.sh", "ATC"))}
        family = _FAMILY.format(name=name, chip_name=chip.name, chip_key=chip.key)
        convert = head + HOST_SOC + unproven["convert_lite.sh"] + f"""# Needs MindSpore Lite 2.10 for Ascend (cloud inference) on CANN 7.5 or newer.
if ! command -v converter_lite >/dev/null 2>&1; then
  echo "convert_lite.sh: converter_lite not found: install MindSpore Lite for Ascend (cloud inference) and put \
tools/converter/converter on PATH" >&2
  exit 2
fi
{family}echo "converting {name}.mindir on ${{HOST_SOC:-an unchecked chip}} ({chip.name})"
{converter}
"""
        checkpoint = ""
        if req.checkpoint:
            checkpoint = f"""CHECKPOINT="${{1:-}}"
if [ -z "$CHECKPOINT" ]; then
  echo "usage: export_air.sh CHECKPOINT (the checkpoint {os.path.basename(os.path.normpath(req.checkpoint))} \
that was exported, on this host)" >&2
  exit 2
fi
"""
        air = head + HOST_SOC + unproven["export_air.sh"] + f"""# The second path, deprecated: MindSpore 2.10 warns "AIR format is deprecated, and will be removed in a future
# version, please use other format or use MindSpore Lite to do offline inference" (convert_lite.sh is that).
# ATC takes MindSpore models only as .air (--framework=1), and AIR can be exported only by MindSpore running on
# an Ascend device: this repeats the export (target {req.target}, {req.dtype}, {req.quant or "float weights"},
# chip {chip.key}) there, then compiles it with ATC (the CANN toolkit's). An AIR takes no dynamic shape profiles in
# ATC: the AIR is exported at a static (batch, seq).
echo "export_air.sh: AIR is deprecated in MindSpore 2.10; convert_lite.sh (MindSpore Lite) is the first path" >&2
{checkpoint}for tool in ms-swiglu atc; do
  command -v "$tool" >/dev/null 2>&1 || {{ echo "export_air.sh: $tool not found (run on an Ascend host)" >&2; exit 2; }}
done
{_SOC.format(script="export_air.sh")}ms-swiglu export {_source_args(req)} --target {req.target} --chip {chip.key} --air \
  --output-dir air --force
cd air
{atc_command(air_name)}
"""
    for fname, text in (("convert_lite.sh", convert), ("export_air.sh", air)):
        path = os.path.join(folder, fname)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
