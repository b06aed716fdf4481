"""HuggingFace checkpoints: ``config.json`` and the MLP weights of one layer, packed at load. No MindSpore here.

Shapes (H = hidden_size, I = intermediate_size, E = num_local_experts, p = tp_size):
    dense:   gate_up [2I/p, H]  down [H, I/p]
    mixtral: router [E, H]   gate_up [E, 2I/p, H]  down [E, H, I/p]
"""
import dataclasses
import json
import os

import numpy as np

from ms_swiglu.checkpoint.files import CheckpointError, SafetensorsFolder
from ms_swiglu.packing import check_tp, pack_gate_up

DENSE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
MOE_FAMILIES = ("mixtral",)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The fields of ``config.json`` this package uses."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    rms_norm_eps: float = 1e-6

    @property
    def is_moe(self):
        return self.model_type in MOE_FAMILIES

    def check_layer(self, layer):
        if not 0 <= layer < self.num_hidden_layers:
            raise CheckpointError(f"layer: expected 0..{self.num_hidden_layers - 1} "
                                  f"(num_hidden_layers={self.num_hidden_layers}), got {layer}")


def read_config(folder):
    """The :class:`ModelConfig` of a checkpoint folder."""
    if not os.path.isdir(folder):
        raise CheckpointError(f"checkpoint: expected a folder, got {folder!r} (not found)")
    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint: expected {path}, found none") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: expected JSON, got a parse error ({exc})") from None
    model_type = raw.get("model_type")
    if model_type not in DENSE_FAMILIES + MOE_FAMILIES:
        raise CheckpointError(f"{path}: expected model_type one of {', '.join(DENSE_FAMILIES + MOE_FAMILIES)}, "
                              f"got {model_type!r}")
    fields = ["hidden_size", "intermediate_size", "num_hidden_layers"]
    if model_type in MOE_FAMILIES:
        fields += ["num_local_experts", "num_experts_per_tok"]
    values = {}
    for name in fields:
        value = raw.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise CheckpointError(f"{path}: expected {name} a positive integer, got {value!r}")
        values[name] = value
    return ModelConfig(model_type=model_type, rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), **values)


def _mlp_prefix(layer):
    return f"model.layers.{layer}.mlp."


def _tp_parts(inter, tp_size, rank):
    """(row slice of gate/up, column slice of down) of rank `rank`: the block starts at rank * I / p."""
    check_tp(inter, tp_size, rank)
    block = slice(rank * (inter // tp_size), (rank + 1) * (inter // tp_size))
    return (block, slice(None)), (slice(None), block)


def load_dense_layer(folder, layer, config=None, tp_size=1, rank=0):
    """``{"gate_up": [2I/p, H] = [gate_r; up_r], "down": [H, I/p]}`` of one dense layer on rank `rank` of
    `tp_size` (the whole layer for tp_size 1), and the checkpoint's dtype name."""
    config = config or read_config(folder)
    config.check_layer(layer)
    if config.is_moe:
        raise CheckpointError(f"layer {layer}: expected a dense model ({', '.join(DENSE_FAMILIES)}), "
                              f"got model_type {config.model_type!r}; use load_moe_layer")
    shards, p = SafetensorsFolder(folder), _mlp_prefix(layer)
    hidden, inter = config.hidden_size, config.intermediate_size
    rows, cols = _tp_parts(inter, tp_size, rank)
    gate, dtype = shards.read(p + "gate_proj.weight", (inter, hidden), rows)
    up, _ = shards.read(p + "up_proj.weight", (inter, hidden), rows)
    down, _ = shards.read(p + "down_proj.weight", (hidden, inter), cols)
    return {"gate_up": pack_gate_up(gate, up), "down": down}, dtype


def load_moe_layer(folder, layer, config=None, tp_size=1, rank=0):
    """``{"router": [E, H], "gate_up": [E, 2I/p, H], "down": [E, H, I/p]}`` of one Mixtral layer (w1 gate,
    w3 up) on rank `rank` of `tp_size`: each expert's intermediate dimension is split like a dense MLP's."""
    config = config or read_config(folder)
    config.check_layer(layer)
    if not config.is_moe:
        raise CheckpointError(f"layer {layer}: expected a mixture-of-experts model ({', '.join(MOE_FAMILIES)}), "
                              f"got model_type {config.model_type!r}; use load_dense_layer")
    shards, p = SafetensorsFolder(folder), f"model.layers.{layer}.block_sparse_moe."
    hidden, inter, experts = config.hidden_size, config.intermediate_size, config.num_local_experts
    rows, cols = _tp_parts(inter, tp_size, rank)
    router, dtype = shards.read(p + "gate.weight", (experts, hidden))
    local = inter // tp_size
    gate_up = np.empty((experts, 2 * local, hidden), router.dtype)
    down = np.empty((experts, hidden, local), router.dtype)
    for e in range(experts):
        w1, _ = shards.read(f"{p}experts.{e}.w1.weight", (inter, hidden), rows)
        w3, _ = shards.read(f"{p}experts.{e}.w3.weight", (inter, hidden), rows)
        gate_up[e] = pack_gate_up(w1, w3)
        down[e], _ = shards.read(f"{p}experts.{e}.w2.weight", (hidden, inter), cols)
    return {"router": router, "gate_up": gate_up, "down": down}, dtype


