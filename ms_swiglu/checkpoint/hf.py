"""HuggingFace checkpoints: ``config.json`` and the FFN weights of one layer, packed at load. No MindSpore here.

Families (the rules read from transformers' modelling code):
    llama, mistral, qwen2, qwen3   dense: every layer an MLP
    mixtral      every layer MoE: softmax top-k, renormalised; experts w1 (gate), w3 (up), w2 (down)
    qwen2_moe    softmax top-k, renormalised if norm_topk_prob; a shared expert scaled by sigmoid(shared_expert_gate);
                 layer i is MoE unless i in mlp_only_layers, if (i + 1) % decoder_sparse_step == 0
    qwen3_moe    as qwen2_moe without the shared expert
    deepseek_v3  sigmoid scores, e_score_correction_bias to choose, group-limited top-k (n_group, topk_group),
                 norm_topk_prob, routed_scaling_factor; n_shared_experts * moe_intermediate_size shared;
                 layer i is MoE if i >= first_k_dense_replace and i % moe_layer_freq == 0

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
from ms_swiglu.checkpoint.files import CheckpointError, SafetensorsFolder
from ms_swiglu.packing import check_tp, group_size, pack_gate_up
from ms_swiglu.routing import SigmoidGroups, Softmax

DENSE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """The MoE block of a family's sparse layers: the keyword arguments of :class:`~ms_swiglu.moe.PackedMoE`."""

    num_experts: int
    top_k: int
    intermediate_size: int  # of one expert
    router: object  # a config of ms_swiglu.routing
    shared_intermediate_size: int = 0
    shared_expert_gate: bool = False

    def block_kwargs(self):
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("num_experts", "top_k", "intermediate_size")}


@dataclasses.dataclass(frozen=True)
class Keys:
    """Where a family keeps one FFN's tensors, under ``model.layers.{layer}.{block}.``."""

    block: str = "mlp"
    expert: str = "experts.{e}.{part}_proj.weight"  # part: gate, up, down
    parts: tuple = ("gate", "up", "down")  # the names standing for gate, up, down in `expert`
    shared: str = ""  # the shared expert's prefix, e.g. "shared_expert."
    shared_gate: str = ""  # e.g. "shared_expert_gate.weight"
    bias: str = ""  # e.g. "gate.e_score_correction_bias"

    def prefix(self, layer):
        return f"model.layers.{layer}.{self.block}."


KEYS = {
    "mixtral": Keys(block="block_sparse_moe", expert="experts.{e}.{part}.weight", parts=("w1", "w3", "w2")),
    "qwen2_moe": Keys(shared="shared_expert.", shared_gate="shared_expert_gate.weight"),
    "qwen3_moe": Keys(),
    "deepseek_v3": Keys(shared="shared_experts.", bias="gate.e_score_correction_bias"),
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The fields of ``config.json`` this package uses. ``intermediate_size`` is the dense MLP's (Mixtral's: an
    expert's); ``moe`` describes the sparse layers, ``sparse_layers`` lists them."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    rms_norm_eps: float = 1e-6
    moe: MoEConfig = None
    sparse_layers: frozenset = frozenset()

    @property
    def is_moe(self):
        return bool(self.sparse_layers)

    @property
    def num_local_experts(self):
        return self.moe.num_experts if self.moe else 0

    @property
    def num_experts_per_tok(self):
        return self.moe.top_k if self.moe else 0

    @property
    def keys(self):
        return KEYS.get(self.model_type, Keys())

    def is_moe_layer(self, layer):
        return layer in self.sparse_layers

    def layer_parameters(self, layer):
        """How many weights one layer's MLP or MoE block holds (router and shared expert included)."""
        h = self.hidden_size
        if not self.is_moe_layer(layer):
            return 3 * h * self.intermediate_size
        m = self.moe
        return m.num_experts * (3 * h * m.intermediate_size + h) + 3 * h * m.shared_intermediate_size + (
            h if m.shared_expert_gate else 0)

    def check_tp(self, tp_size, layers=None, quant=None):
        """ValueError unless tp_size divides every intermediate size the layers (default: all) split, and (int8
        with group-wise scales, ``quant``) the projections' input sizes on a rank hold whole groups."""
        layers = range(self.num_hidden_layers) if layers is None else layers
        sizes = {self.intermediate_size for i in layers if not self.is_moe_layer(i)}
        if any(self.is_moe_layer(i) for i in layers):
            sizes |= {self.moe.intermediate_size} | ({self.moe.shared_intermediate_size} - {0})
        for size in sorted(sizes):
            check_tp(size, tp_size)
        g = group_size(quant)
        if g and any(k % g for k in (self.hidden_size, *(size // tp_size for size in sizes))):
            raise CheckpointError(f"quant {quant}: expected hidden_size and every intermediate size / tp_size "
                                  f"multiples of {g}, got hidden_size {self.hidden_size}, intermediate size / "
                                  f"{tp_size}: {', '.join(str(size // tp_size) for size in sorted(sizes))}")

    def check_layer(self, layer):
        if not 0 <= layer < self.num_hidden_layers:
            raise CheckpointError(f"layer: expected 0..{self.num_hidden_layers - 1} "
                                  f"(num_hidden_layers={self.num_hidden_layers}), got {layer}")


class _Raw:
    """config.json's fields, each checked as it is read."""

    def __init__(self, path, raw):
        self.path, self.raw = path, raw

    def _get(self, name, default, ok, what):
        value = self.raw.get(name, default)
        if not ok(value):
            raise CheckpointError(f"{self.path}: expected {name} {what}, got {value!r}")
        return value

    def int(self, name, default=None, minimum=1):
        return self._get(name, default, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum,
                         "a positive integer" if minimum == 1 else f"an integer >= {minimum}")

    def float(self, name, default=None):
        return float(self._get(name, default, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                               and v > 0 and np.isfinite(v), "a positive number"))

    def bool(self, name, default):
        return self._get(name, default, lambda v: isinstance(v, bool), "true or false")

    def ints(self, name):
        return self._get(name, [], lambda v: v is None or (isinstance(v, list) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in v)), "a list of layer indices") or []

    def str(self, name, allowed):
        return self._get(name, allowed[0], lambda v: v in allowed, f"one of {', '.join(map(repr, allowed))}")


def _moe(model_type, c, layers):
    """(MoEConfig, sparse layers) of an MoE family (the defaults are transformers' config classes')."""
    if model_type == "mixtral":
        moe = MoEConfig(c.int("num_local_experts"), c.int("num_experts_per_tok"), c.int("intermediate_size"),
                        Softmax(renormalize=True))
        return moe, frozenset(layers)
    if model_type in ("qwen2_moe", "qwen3_moe"):
        shared = c.int("shared_expert_intermediate_size", 5632, minimum=0) if model_type == "qwen2_moe" else 0
        moe = MoEConfig(c.int("num_experts"), c.int("num_experts_per_tok"), c.int("moe_intermediate_size"),
                        Softmax(renormalize=c.bool("norm_topk_prob", False)), shared_intermediate_size=shared,
                        shared_expert_gate=bool(shared))
        dense, step = set(c.ints("mlp_only_layers")), c.int("decoder_sparse_step", 1)
        return moe, frozenset(i for i in layers if i not in dense and (i + 1) % step == 0)
    c.str("scoring_func", ["sigmoid"])  # DeepSeek-V3's noaux_tc routing; V2's softmax/greedy are not it
    c.str("topk_method", ["noaux_tc"])
    inter = c.int("moe_intermediate_size")
    router = SigmoidGroups(renormalize=c.bool("norm_topk_prob", True), n_group=c.int("n_group", 8),
                           topk_group=c.int("topk_group", 4),
                           routed_scaling_factor=c.float("routed_scaling_factor", 2.5))
    moe = MoEConfig(c.int("n_routed_experts"), c.int("num_experts_per_tok"), inter, router,
                    shared_intermediate_size=c.int("n_shared_experts", 1, minimum=0) * inter)
    first, freq = c.int("first_k_dense_replace", 3, minimum=0), c.int("moe_layer_freq", 1)
    return moe, frozenset(i for i in layers if i >= first and i % freq == 0)


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
    return parse_config(raw, path), raw


def parse_config(raw, path):
    """The :class:`ModelConfig` of config.json's contents ``raw`` (``path`` names where they come from)."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    model_type = raw.get("model_type")
    if model_type not in DENSE_FAMILIES + MOE_FAMILIES:
        raise CheckpointError(f"{path}: expected model_type one of {', '.join(DENSE_FAMILIES + MOE_FAMILIES)}, "
                              f"got {model_type!r}")
    c = _Raw(path, raw)
    c.str("hidden_act", ["silu", "swish"])  # the SwiGLU MLP's (transformers' default); gelu is another MLP
    values = {name: c.int(name) for name in ("hidden_size", "intermediate_size", "num_hidden_layers")}
    moe, sparse = _moe(model_type, c, range(values["num_hidden_layers"])) if model_type in MOE_FAMILIES else (
        None, frozenset())
    return ModelConfig(model_type=model_type, rms_norm_eps=c.float("rms_norm_eps", 1e-6), moe=moe,
                       sparse_layers=sparse, **values)


def _tp_parts(inter, tp_size, rank):
    """(row slice of gate/up, column slice of down) of rank `rank`: the block starts at rank * I / p."""
    check_tp(inter, tp_size, rank)
    block = slice(rank * (inter // tp_size), (rank + 1) * (inter // tp_size))
    return (block, slice(None)), (slice(None), block)


def read_float(shards, name, shape, part=None):
    """A tensor of a HuggingFace checkpoint folder (``shards``: its SafetensorsFolder) and its dtype name: float
    (F32, F16, BF16) only. Int8 tensors there are another tool's quantization, whose scales this package does not
    read; ``convert --quantize int8`` quantizes the float checkpoint."""
    a, dtype = shards.read(name, shape, part)
    if dtype == "int8":
        raise CheckpointError(f"{name}: expected float weights (F32, F16 or BF16) in a HuggingFace checkpoint, got "
                              f"I8 (a pre-quantized checkpoint; convert --quantize int8 quantizes the float one)")
    return a, dtype


def _read_mlp(shards, prefix, names, hidden, inter, tp_size, rank):
    """(gate_up [2I/p, H], down [H, I/p], dtype) of the SwiGLU MLP whose gate/up/down are ``prefix + names[i]``."""
    rows, cols = _tp_parts(inter, tp_size, rank)
    gate, dtype = read_float(shards, prefix + names[0], (inter, hidden), rows)
    up, up_dtype = read_float(shards, prefix + names[1], (inter, hidden), rows)
    down, down_dtype = read_float(shards, prefix + names[2], (hidden, inter), cols)
    if not dtype == up_dtype == down_dtype:
        raise CheckpointError(f"{prefix}: expected gate, up and down in one dtype, got {dtype}, {up_dtype}, "
                              f"{down_dtype} ({', '.join(names)})")
    return pack_gate_up(gate, up), down, dtype


def load_dense_layer(folder, layer, config=None, tp_size=1, rank=0):
    """``{"gate_up": [2I/p, H] = [gate_r; up_r], "down": [H, I/p]}`` of one dense layer on rank `rank` of
    `tp_size` (the whole layer for tp_size 1), and the checkpoint's dtype name."""
    config = config or read_config(folder)
    config.check_layer(layer)
    if config.is_moe_layer(layer):
        raise CheckpointError(f"layer {layer}: expected a dense layer, got a mixture-of-experts layer of "
                              f"{config.model_type!r}; use load_moe_layer")
    names = [f"{part}_proj.weight" for part in ("gate", "up", "down")]
    gate_up, down, dtype = _read_mlp(SafetensorsFolder(folder), f"model.layers.{layer}.mlp.", names,
                                     config.hidden_size, config.intermediate_size, tp_size, rank)
    return {"gate_up": gate_up, "down": down}, dtype


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
    shards, keys, moe, hidden = SafetensorsFolder(folder), config.keys, config.moe, config.hidden_size
    p = keys.prefix(layer)
    check_tp(moe.intermediate_size, tp_size, rank)
    out = {"router": read_float(shards, p + "gate.weight", (moe.num_experts, hidden))[0]}
    for e in range(moe.num_experts):  # stacked in the experts' own dtype (not the router's)
        names = [keys.expert.format(e=e, part=part) for part in keys.parts]
        gate_up, down, stored = _read_mlp(shards, p, names, hidden, moe.intermediate_size, tp_size, rank)
        if e == 0:
            dtype = stored
            out["gate_up"] = np.empty((moe.num_experts, *gate_up.shape), gate_up.dtype)
            out["down"] = np.empty((moe.num_experts, *down.shape), down.dtype)
        elif stored != dtype:
            raise CheckpointError(f"layer {layer}: expected every expert in one dtype, got {dtype} for expert 0 "
                                  f"and {stored} for expert {e} ({p + names[0]})")
        out["gate_up"][e], out["down"][e] = gate_up, down
    if keys.bias:
        out["bias"] = read_float(shards, p + keys.bias, (moe.num_experts,))[0]
    if moe.shared_intermediate_size:
        names = [f"{keys.shared}{part}_proj.weight" for part in ("gate", "up", "down")]
        out["shared_gate_up"], out["shared_down"], _ = _read_mlp(shards, p, names, hidden,
                                                                 moe.shared_intermediate_size, tp_size, rank)
        if moe.shared_expert_gate:
            out["shared_gate"] = read_float(shards, p + keys.shared_gate, (1, hidden))[0]
    return out, dtype
