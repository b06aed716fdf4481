"""HuggingFace checkpoints: ``config.json`` and (sharded) safetensors, read lazily, MLP weights packed at load.

Only the tensors of the requested layer are read (one ``safe_open`` per shard, one read per tensor), so one
layer of a 70B checkpoint costs one layer of memory. bfloat16 tensors come back as exact float32 arrays
(NumPy has no bfloat16); ``dtype`` says what the checkpoint holds. No MindSpore import here.

Shapes (H = hidden_size, I = intermediate_size, E = num_local_experts):
    dense:   gate_up [2I, H]  down [H, I]
    mixtral: router [E, H]   gate_up [E, 2I, H]  down [E, H, I]
"""
import dataclasses
import json
import os
import struct

import numpy as np
from safetensors import SafetensorError, safe_open

from ms_swiglu.packing import check_tp, pack_gate_up

DENSE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
MOE_FAMILIES = ("mixtral",)
_NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


class CheckpointError(ValueError):
    """A checkpoint folder that is missing, malformed, or disagrees with its config.json."""


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


class SafetensorsFolder:
    """Tensor name -> shard file of a checkpoint folder (single file or ``model.safetensors.index.json``)."""

    def __init__(self, folder):
        self.folder, self._shards = folder, {}
        index = os.path.join(folder, "model.safetensors.index.json")
        single = os.path.join(folder, "model.safetensors")
        if os.path.exists(index):
            try:
                with open(index) as f:
                    self.weight_map = dict(json.load(f)["weight_map"])
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{index}: expected JSON with a weight_map, got {exc!r}") from None
        elif os.path.exists(single):
            self.weight_map = {name: "model.safetensors" for name in self._open(single)[1]}
        else:
            raise CheckpointError(f"checkpoint: expected {single} or {index} in {folder}, found neither")

    def _open(self, path):
        """((data offset, header), names) of one shard, opened once; safe_open checks that the header covers
        the file exactly, which catches truncation."""
        if path not in self._shards:
            self._shards[path] = self._validate(path)
        return self._shards[path]

    @staticmethod
    def _validate(path):
        try:
            with safe_open(path, framework="numpy") as f:
                names = list(f.keys())
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint: expected shard {path}, found none") from None
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{path}: expected a valid safetensors file, got: {exc}") from None
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        return (8 + size, header), names

    def read(self, name, shape, part=None):
        """One tensor (or the block ``part``, a tuple of slices) as a NumPy array (bfloat16 -> exact float32)
        and its dtype name; the full shape is checked against ``shape``. Only the block is copied out of the
        memory-mapped file, so a tensor-parallel rank never holds the whole tensor."""
        if name not in self.weight_map:
            raise CheckpointError(f"checkpoint: expected tensor {name}, found none in {self.folder}")
        path = os.path.join(self.folder, self.weight_map[name])
        (base, header), names = self._open(path)
        if name not in names:
            raise CheckpointError(f"{path}: expected tensor {name} (named in the index), found none")
        meta = header[name]
        if tuple(meta["shape"]) != tuple(shape):
            raise CheckpointError(f"{name}: expected shape {tuple(shape)} from config.json, "
                                  f"got {tuple(meta['shape'])}")
        return _read_tensor(path, base, name, meta, part)


def _read_tensor(path, base, name, meta, part=None):
    if meta["dtype"] not in _NP:
        raise CheckpointError(f"{name}: expected dtype F32, F16 or BF16, got {meta['dtype']}")
    start, end = meta["data_offsets"]
    dtype = np.dtype(_NP[meta["dtype"]]).newbyteorder("<")
    if end == start:
        data = np.zeros(meta["shape"], dtype)
    else:
        mapped = np.memmap(path, dtype=dtype, mode="r", offset=base + start, shape=tuple(meta["shape"]))
        data = np.array(mapped[part] if part is not None else mapped)  # copies the block only
        del mapped
    if meta["dtype"] == "BF16":
        data = from_bf16_bits(data)
    return data.astype(data.dtype.newbyteorder("="), copy=False), _DTYPE_NAMES[meta["dtype"]]


def read_safetensors(path):
    """Every tensor of one safetensors file: ``({name: array}, dtype name)`` (bfloat16 -> exact float32)."""
    (base, header), names = SafetensorsFolder._validate(path)
    tensors, dtypes = {}, set()
    for name in names:
        tensors[name], dtype = _read_tensor(path, base, name, header[name])
        dtypes.add(dtype)
    return tensors, (dtypes.pop() if len(dtypes) == 1 else None)


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


def to_bf16_bits(a):
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(a), ((u >> 16) | 0x40).astype(np.uint16), rounded)


def from_bf16_bits(bits):
    """bfloat16 bit patterns (uint16) -> their exact float32 values."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors, dtype, metadata=None):
    """Write ``{name: array}`` as one safetensors file in ``dtype`` (a name), atomically (temp file + rename)."""
    code = {v: k for k, v in _DTYPE_NAMES.items()}[dtype]
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.asarray(tensors[name])
        raw = to_bf16_bits(a) if dtype == "bfloat16" else np.ascontiguousarray(a, _NP[code])
        data = raw.astype(raw.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(head)) + head)
            for data in blobs:
                f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
