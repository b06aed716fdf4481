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
from ms_swiglu.checkpoint import fp8
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
    return dataclasses.replace(parse_config(raw, path), encoding=fp8.encoding(raw, path)), raw


def compute_dtype(config, stored):
    """The dtype weights stored as ``stored`` compute in by default: their own, or for FP8 the config's dtype
    (bfloat16 where it names none, as DeepSeek's release does)."""
    return (config.dtype or "bfloat16") if stored == fp8.FP8 else stored


def read_float(shards, name, shape, part=None, encoding=None):
    """A tensor of a HuggingFace checkpoint folder (``shards``: its SafetensorsFolder), the block ``part`` of it,
    as float32 values, and its stored dtype name: F32, F16, BF16, or F8_E4M3 with its block scales (``encoding``:
    the config's :class:`~ms_swiglu.checkpoint.fp8.BlockFP8`; only the scales of the blocks ``part`` touches are
    read). Int8 tensors there are another tool's quantization, whose scales this package does not read."""
    a, dtype = shards.read(name, shape, part)
    if dtype == "int8":
        raise CheckpointError(f"{name}: expected float weights (F32, F16, BF16 or F8_E4M3) in a HuggingFace "
                              f"checkpoint, got I8 (a pre-quantized checkpoint; convert --quantize int8 quantizes "
                              f"the float one)")
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


def read_mlp(shards, gate_up, down, layout, encoding, e=None):
    """(gate_up, down, dtype name) of one SwiGLU MLP (expert ``e`` of stacked ones): the rank's part of each."""
    names = [name.format(e=e) for name in gate_up.hf + down.hf]
    (gate, dtype), (up, up_dtype) = (read_float(shards, n, gate_up.hf_shape, layout.hf_part(gate_up), encoding)
                                     for n in names[:2])
    w_down, down_dtype = read_float(shards, names[2], down.hf_shape, layout.hf_part(down), encoding)
    if not dtype == up_dtype == down_dtype:
        prefix = os.path.commonprefix(names)
        prefix = prefix[:prefix.rfind(".") + 1] if e is None else prefix[:prefix.find("experts.")]
        raise CheckpointError(f"{prefix}: expected gate, up and down in one dtype, got {dtype}, {up_dtype}, "
                              f"{down_dtype} ({', '.join(n[len(prefix):] for n in names)})")
    return pack_gate_up(gate, up), w_down, dtype


def _read_experts(shards, gate_up, down, layout, encoding, layer):
    """The rank's experts stacked ([E, 2I/p, H], [E, H, I/p]) in the experts' own dtype (not the router's)."""
    mine = layout.experts(gate_up.experts)
    for i, e in enumerate(mine):
        g, d, stored = read_mlp(shards, gate_up, down, layout, encoding, e)
        if i == 0:
            dtype = stored
            w_gate_up, w_down = np.empty((len(mine), *g.shape), g.dtype), np.empty((len(mine), *d.shape), d.dtype)
        elif stored != dtype:
            raise CheckpointError(f"layer {layer}: expected every expert in one dtype, got {dtype} for expert "
                                  f"{mine.start} and {stored} for expert {e} ({gate_up.hf[0].format(e=e)})")
        w_gate_up[i], w_down[i] = g, d
    return w_gate_up, w_down, dtype


def read_layer(shards, config, layer, layout=WHOLE):
    """(``{kind: array}`` of one layer, the rank's part of each tensor read as such, packed and stacked; the dtype
    its MLP or routed experts compute in: their stored dtype, or for FP8 weights the config's dtype (bfloat16 where
    it names none)). ``shards``: the checkpoint's :class:`SafetensorsFolder`."""
    config.check_layer(layer)
    specs, out, dtype = layer_tensors(config, layer), {}, None
    for i, spec in enumerate(specs):
        if spec.split is Split.REPLICATED:
            out[spec.kind] = read_float(shards, spec.hf[0], spec.hf_shape, encoding=config.encoding)[0]
        elif spec.split is Split.ROWS:  # an MLP: its gate_up spec, then its down spec
            down = specs[i + 1]
            read = _read_experts(shards, spec, down, layout, config.encoding, layer) if spec.experts else read_mlp(
                shards, spec, down, layout, config.encoding)
            out[spec.kind], out[down.kind], stored = read
            dtype = dtype or stored
    return out, compute_dtype(config, dtype)


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
