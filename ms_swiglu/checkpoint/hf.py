"""HuggingFace checkpoints: ``config.json`` (read by the family of its ``model_type``, ``ms_swiglu.families``) and
the FFN weights of one layer, read as the tensor schema (``ms_swiglu.schema``) says and packed at load. No
MindSpore here.

Shapes of one layer (H = hidden_size, I = the MLP's or an expert's intermediate size, E = experts,
I_s = the shared expert's, p = tp_size; rank r reads only its blocks):
    dense:  gate_up [2I/p, H]  down [H, I/p]
    moe:    router [E, H]  (bias [E])  gate_up [E, 2I/p, H]  down [E, H, I/p]
            (shared_gate_up [2I_s/p, H]  shared_down [H, I_s/p]  (shared_gate [1, H]))
"""
import dataclasses
import json
import os

import numpy as np

from ms_swiglu import paths
from ms_swiglu import quant as formats
from ms_swiglu.checkpoint import fp8
from ms_swiglu.checkpoint.fp8 import BlockFP8
from ms_swiglu.checkpoint.quantized import Encoding, encoding as quantized_encoding
from ms_swiglu.checkpoint.files import CheckpointError, SafetensorsFolder
from ms_swiglu.families import FAMILIES, ModelConfig, MoEConfig, parse_config  # noqa: F401 -- public names
from ms_swiglu.layout import WHOLE, ParallelLayout
from ms_swiglu.packing import pack_gate_up
from ms_swiglu.schema import Split, layer_tensors

DENSE_FAMILIES = tuple(t for t, f in FAMILIES.items() if not f.has_moe)
MOE_FAMILIES = tuple(t for t, f in FAMILIES.items() if f.has_moe)


def read_config(folder):
    """The :class:`ModelConfig` of a checkpoint folder."""
    return read_config_json(folder)[0]


def read_config_json(folder):
    """(the :class:`ModelConfig` of a checkpoint folder, config.json's contents as read)."""
    if not os.path.isdir(folder):
        raise CheckpointError(f"checkpoint: expected a folder, got {folder!r} ({paths.kind(folder) or 'not found'})")
    path = paths.input_file(os.path.join(folder, "config.json"), "checkpoint")
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint: expected {path}, found none") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: expected JSON, got a parse error ({exc})") from None
    config = parse_config(raw, path)  # (a config.json that is no object is refused here)
    return dataclasses.replace(config, encoding=quantized_encoding(raw, path, folder) or fp8.encoding(raw, path)), raw


def compute_dtype(config, stored):
    """The dtype weights stored as ``stored`` compute in by default: their own, or for FP8 the config's dtype
    (bfloat16 where it names none, as DeepSeek's release does). (A quantized checkpoint's reader gives the config's
    dtype as its stored one.)"""
    return (config.dtype or "bfloat16") if stored == fp8.FP8 else stored


def read_float(shards, name, shape, part=None, encoding=None):
    """A tensor of a HuggingFace checkpoint folder (``shards``: its SafetensorsFolder), the block ``part`` of it,
    as float32 values, and its stored dtype name: F32, F16, BF16, or F8_E4M3 with its block scales (``encoding``:
    the config's :class:`~ms_swiglu.checkpoint.fp8.BlockFP8`; only the scales of the blocks ``part`` touches are
    read). Integer tensors where float ones belong are another tool's quantization without a description this
    package reads (``ms_swiglu.checkpoint.quantized`` reads the published ones)."""
    a, dtype = shards.read(name, shape, part)
    if dtype in ("int8", "uint8", "int32", "int64"):
        raise CheckpointError(f"{name}: expected float weights (F32, F16, BF16 or F8_E4M3) in a HuggingFace "
                              f"checkpoint, got {dtype} (a quantized checkpoint without a quantization_config or "
                              f"quant_model_description.json this package reads)")
    if dtype == fp8.FP8:
        if encoding is None:
            raise CheckpointError(f"{name}: expected float weights, or F8_E4M3 ones with quantization_config "
                                  f"quant_method fp8 in config.json, got F8_E4M3 without it")
        scale_name = name + fp8.SCALE_SUFFIX
        if scale_name not in shards.weight_map:
            raise CheckpointError(f"{name}: expected its block scales {scale_name} beside the F8_E4M3 weight, found "
                                  f"none")
        scale, _ = shards.read(scale_name, encoding.scale_shape(shape), encoding.scale_part(shape, part))
        a = encoding.dequantize(a, scale.astype(np.float32), shape, part, name)
    bad = a.size - int(np.count_nonzero(np.isfinite(a)))
    if bad:  # no released checkpoint holds one: the file is corrupt, and every output would be NaN
        raise CheckpointError(f"{name}: expected finite weights, got {bad} of {a.size} NaN or infinite "
                              f"(a corrupt checkpoint file)")
    return a, dtype


def _pack_parts(gate, up, method, where):
    """``{suffix: array}`` of packed [gate; up] from gate's and up's parts: the parts with rows stacked, the others
    (a static activation scale) the same for both, or refused."""
    out = {}
    for part in method.parts:
        g, u = gate[part.suffix], up[part.suffix]
        if part.rows:
            out[part.suffix] = np.concatenate([g, u], axis=0)
        elif not np.array_equal(g, u):
            raise CheckpointError(f"{where}: expected gate and up with one {part.suffix[1:]} (they share their input "
                                  f"and one GEMM), got {g.tolist()} and {u.tolist()}")
        else:
            out[part.suffix] = g
    return out


def read_mlp(shards, gate_up, down, layout, encoding, e=None):
    """(``{suffix: array}`` of gate_up, of down, stored dtype name, weight format) of one SwiGLU MLP (expert ``e``
    of stacked ones): the rank's part of each; float weights as ``{"": array}`` in the format ``none``, a quantized
    checkpoint's in its format's parts (``ms_swiglu.checkpoint.quantized``)."""
    names = [name.format(e=e) for name in gate_up.hf + down.hf]
    prefixes = [n.removesuffix(".weight") for n in names]
    parts = (layout.hf_part(gate_up),) * 2 + (layout.hf_part(down),)
    shapes = (gate_up.hf_shape,) * 2 + (down.hf_shape,)
    if isinstance(encoding, Encoding):
        stored = [encoding.stored(p) for p in prefixes]
        if any(stored):
            methods = [encoding.method_of(p) if s else None for p, s in zip(prefixes, stored)]
            if not all(stored) or len({m.name for m in methods}) != 1:
                got = ", ".join(m.name if m else "float" for m in methods)
                raise CheckpointError(f"{os.path.commonprefix(prefixes)}: expected gate, up and down in one "
                                      f"format ({encoding.source}), got {got}")
            method = methods[0]
            for shape in shapes:
                method.check_inputs(shape[1], f"input size of {names[0]}")
            gate, up, w_down = (encoding.read(shards, p, shape, part)
                                for p, shape, part in zip(prefixes, shapes, parts))
            return _pack_parts(gate, up, method, prefixes[0]), w_down, encoding.dtype, method
        encoding = None  # ignored projections: float
    (gate, dtype), (up, up_dtype), (w_down, down_dtype) = (
        read_float(shards, n, shape, part, encoding) for n, shape, part in zip(names, shapes, parts))
    if not dtype == up_dtype == down_dtype:
        prefix = os.path.commonprefix(names)
        prefix = prefix[:prefix.rfind(".") + 1] if e is None else prefix[:prefix.find("experts.")]
        raise CheckpointError(f"{prefix}: expected gate, up and down in one dtype, got {dtype}, {up_dtype}, "
                              f"{down_dtype} ({', '.join(n[len(prefix):] for n in names)})")
    return {"": pack_gate_up(gate, up)}, {"": w_down}, dtype, formats.NONE


def pieces(shards, config, layer, layout=WHOLE):
    """(spec, ``{kind + suffix: array}``, expert index or None, stored dtype name, weight format) of one layer,
    piece by piece: each replicated tensor, then each MLP's gate_up and down (each of the rank's experts'), the
    rank's part of each read as such, gate/up packed. The one path by which the package reads a layer (loading
    stacks the pieces, ``convert`` writes them)."""
    specs = layer_tensors(config, layer)
    for i, spec in enumerate(specs):
        if spec.split is Split.REPLICATED:
            encoding = config.encoding if isinstance(config.encoding, BlockFP8) else None
            a, dtype = read_float(shards, spec.hf[0], spec.hf_shape, encoding=encoding)
            yield spec, {spec.kind: a}, None, dtype, formats.NONE
        elif spec.split is Split.ROWS:  # an MLP: its gate_up spec, then its down spec
            down = specs[i + 1]
            for e in layout.experts(spec.experts) if spec.experts else [None]:
                gate_up, w_down, dtype, method = read_mlp(shards, spec, down, layout, config.encoding, e)
                yield spec, {spec.kind + k: a for k, a in gate_up.items()}, e, dtype, method
                yield down, {down.kind + k: a for k, a in w_down.items()}, e, dtype, method


def stored_format(config, layer):
    """The weight format a layer's projections are stored in (``none``: float, FP8 included), from the config."""
    enc = config.encoding
    if not isinstance(enc, Encoding):
        return formats.NONE
    spec = next(t for t in layer_tensors(config, layer) if t.quantized)
    prefix = spec.hf[0].format(e=0).removesuffix(".weight")
    return enc.method_of(prefix) if enc.stored(prefix) else formats.NONE


def read_layer(shards, config, layer, layout=WHOLE):
    """(``{kind: array}`` of one layer, the rank's part of each tensor read as such, packed and stacked; the dtype
    its MLP or routed experts compute in: their stored dtype, or for FP8 weights the config's dtype (bfloat16 where
    it names none)). ``shards``: the checkpoint's :class:`SafetensorsFolder`."""
    return read_layer_as_stored(shards, config, layer, layout)[:2]


def read_layer_as_stored(shards, config, layer, layout=WHOLE):
    """:func:`read_layer` and the weight format its projections are stored in (``none`` for float ones; every
    projection of a layer in one, or it is refused)."""
    config.check_layer(layer)
    out, dtype, first, method = {}, None, {}, None
    for spec, piece, e, stored, fmt in pieces(shards, config, layer, layout):
        if spec.split is not Split.REPLICATED:
            if method is not None and fmt.name != method.name:
                raise CheckpointError(f"layer {layer}: expected every projection in one format, got {method.name} "
                                      f"and {fmt.name} ({spec.hf[0].format(e=e)})")
            method = fmt
        if e is None:
            out.update(piece)
            if spec.split is not Split.REPLICATED:
                dtype = dtype or stored
            continue
        mine = layout.experts(spec.experts)
        if spec.kind not in first:
            first[spec.kind] = stored
            dtype = dtype or stored
            out.update({k: np.empty((len(mine), *a.shape), a.dtype) for k, a in piece.items()})
        elif stored != first[spec.kind]:
            raise CheckpointError(f"layer {layer}: expected every expert in one dtype, got {first[spec.kind]} for "
                                  f"expert {mine.start} and {stored} for expert {e} ({spec.hf[0].format(e=e)})")
        for k, a in piece.items():
            out[k][e - mine.start] = a
    return out, compute_dtype(config, dtype), method


def load_dense_layer(folder, layer, config=None, tp_size=1, rank=0):
    """``{"gate_up": [2I/p, H] = [gate_r; up_r], "down": [H, I/p]}`` of one dense layer on rank `rank` of
    `tp_size` (the whole layer for tp_size 1), and the checkpoint's dtype name."""
    config = config or read_config(folder)
    config.check_layer(layer)
    if config.is_moe_layer(layer):
        raise CheckpointError(f"layer {layer}: expected a dense layer, got a mixture-of-experts layer of "
                              f"{config.model_type!r}; use load_moe_layer")
    return read_layer(SafetensorsFolder(folder), config, layer, ParallelLayout(tp_size, rank))


def load_moe_layer(folder, layer, config=None, tp_size=1, rank=0):
    """One MoE layer on rank `rank` of `tp_size`, packed and stacked: ``{"router": [E, H], "gate_up":
    [E, 2I/p, H], "down": [E, H, I/p]}`` plus, where the family has them, ``"bias"`` [E], ``"shared_gate_up"``
    [2I_s/p, H], ``"shared_down"`` [H, I_s/p] and ``"shared_gate"`` [1, H]; and the experts' dtype name. Every
    expert (the shared one too) is split like a dense MLP."""
    config = config or read_config(folder)
    config.check_layer(layer)
    if not config.is_moe_layer(layer):
        raise CheckpointError(f"layer {layer}: expected a mixture-of-experts layer, got a dense layer of "
                              f"{config.model_type!r}; use load_dense_layer")
    return read_layer(SafetensorsFolder(folder), config, layer, ParallelLayout(tp_size, rank))
