"""Safetensors files, read lazily and written atomically. No MindSpore import here.

Only the tensors (or the blocks of tensors) asked for are read: one ``safe_open`` per shard, one memory-mapped read
per tensor, so one layer of a 70B checkpoint costs one layer of memory. bfloat16 tensors come back as exact
float32 arrays (NumPy has no bfloat16); the dtype name says what the file holds.
"""
import json
import os
import struct

import numpy as np
from safetensors import SafetensorError, safe_open

from ms_swiglu import paths
from ms_swiglu.checkpoint.fp8 import FP8, decode_e4m3
from ms_swiglu.errors import CheckpointError
from ms_swiglu.outputs import OutputSet

_NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I8": np.int8, "F8_E4M3": np.uint8, "U8": np.uint8,
       "I32": np.int32, "I64": np.int64}
_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "I8": "int8", "F8_E4M3": FP8, "U8": "uint8",
                "I32": "int32", "I64": "int64"}


class SafetensorsFolder:
    """Tensor name -> shard file of a checkpoint folder (single file or ``model.safetensors.index.json``)."""

    def __init__(self, folder):
        self.folder, self._shards = folder, {}
        index = os.path.join(folder, "model.safetensors.index.json")
        single = os.path.join(folder, "model.safetensors")
        if os.path.exists(index):
            paths.input_file(index, "checkpoint")
            try:
                with open(index) as f:
                    self.weight_map = dict(json.load(f)["weight_map"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise CheckpointError(f"{index}: expected JSON with a weight_map, got {exc!r}") from None
            for shard in set(self.weight_map.values()):  # shard files of this folder, as save_pretrained names them
                if not isinstance(shard, str) or os.path.basename(shard) != shard or shard in ("", ".", ".."):
                    raise CheckpointError(f"{index}: expected shard file names inside {folder}, got {shard!r}")
        elif os.path.exists(single):
            self.weight_map = {name: "model.safetensors" for name in self._open(single)[1]}
        elif os.path.isfile(folder):  # one safetensors file, read as a folder's are
            self.folder, name = os.path.split(folder)
            self.weight_map = {n: name for n in self._open(folder)[1]}
        else:
            raise CheckpointError(f"checkpoint: expected {single} or {index} in {folder}, found neither")

    def metadata(self, path):
        """The ``__metadata__`` of one of its files (``{}`` when it has none)."""
        return dict(self._open(path)[0][1].get("__metadata__", {}))

    def shape(self, name):
        """The stored shape of tensor ``name``."""
        return tuple(self._meta(name)["shape"])

    def dtype_name(self, name):
        """The dtype name of tensor ``name`` as stored (from the header: nothing is read); a dtype this package
        does not read is refused by name."""
        return _DTYPE_NAMES[_known_dtype(name, self._meta(name))]

    def _meta(self, name):
        if name not in self.weight_map:
            raise CheckpointError(f"checkpoint: expected tensor {name}, found none in {self.folder}")
        return self._open(os.path.join(self.folder, self.weight_map[name]))[0][1][name]

    def _open(self, path):
        """((data offset, header), names) of one shard, opened once; safe_open checks that the header covers
        the file exactly, which catches truncation."""
        if path not in self._shards:
            self._shards[path] = self._validate(path)
        return self._shards[path]

    @staticmethod
    def _validate(path):
        paths.input_file(path, "checkpoint")
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


def _known_dtype(name, meta):
    """The safetensors dtype code of a tensor's header entry, if it is one this package reads."""
    if meta["dtype"] not in _NP:
        raise CheckpointError(f"{name}: expected dtype F32, F16, BF16, I8, U8, I32, I64 or F8_E4M3, got "
                              f"{meta['dtype']}")
    return meta["dtype"]


def _read_tensor(path, base, name, meta, part=None):
    _known_dtype(name, meta)
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
    elif meta["dtype"] == "F8_E4M3":
        data = decode_e4m3(data)
    return data.astype(data.dtype.newbyteorder("="), copy=False), _DTYPE_NAMES[meta["dtype"]]


def read_safetensors(path):
    """Every tensor of one safetensors file: ``({name: array}, dtype name)`` (bfloat16 -> exact float32)."""
    (base, header), names = SafetensorsFolder._validate(path)
    tensors, dtypes = {}, set()
    for name in names:
        tensors[name], dtype = _read_tensor(path, base, name, header[name])
        dtypes.add(dtype)
    return tensors, (dtypes.pop() if len(dtypes) == 1 else None)


def to_bf16_bits(a):
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(a), ((u >> 16) | 0x40).astype(np.uint16), rounded)


def from_bf16_bits(bits):
    """bfloat16 bit patterns (uint16) -> their exact float32 values."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


_CODES = {v: k for k, v in _DTYPE_NAMES.items()}


def encode(a, dtype):
    """The little-endian bytes of ``a`` stored as ``dtype`` (a name: float32, float16, bfloat16, int8)."""
    raw = to_bf16_bits(a) if dtype == "bfloat16" else np.ascontiguousarray(a, _NP[_CODES[dtype]])
    return raw.astype(raw.dtype.newbyteorder("<"), copy=False).tobytes()


def layout_safetensors(entries, metadata=None):
    """(header bytes, ``{name: data offset in the file}``) of a safetensors file holding ``entries``
    (``{name: (shape, dtype name)}``), tensors in name order."""
    header, offsets, offset = {}, {}, 0
    for name in sorted(entries):
        shape, dtype = entries[name]
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(_NP[_CODES[dtype]]).itemsize
        header[name] = {"dtype": _CODES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offsets[name] = offset
        offset += size
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    head = struct.pack("<Q", len(head)) + head
    return head, {name: len(head) + o for name, o in offsets.items()}


def dump_safetensors(path, tensors, dtype, metadata=None, float32=()):
    """Write ``{name: array}`` to ``path`` as a safetensors file in ``dtype`` (a name), those named in
    ``float32`` in float32 and int8 arrays as int8 (a plain write: :func:`write_safetensors` is the
    whole-or-nothing one)."""
    kinds = {name: "int8" if np.asarray(a).dtype == np.int8 else "float32" if name in float32 else dtype
             for name, a in tensors.items()}
    head, _ = layout_safetensors({name: (np.shape(a), kinds[name]) for name, a in tensors.items()}, metadata)
    with open(path, "wb") as f:
        f.write(head)
        for name in sorted(tensors):
            f.write(encode(tensors[name], kinds[name]))


def write_safetensors(path, tensors, dtype, metadata=None, float32=(), force=True):
    """:func:`dump_safetensors` as one whole file (``ms_swiglu.outputs``): it appears complete or not at all, and
    replaces an existing file only with ``force``."""
    with OutputSet([path], force) as out:
        out.write(out.paths[0], lambda tmp: dump_safetensors(tmp, tensors, dtype, metadata, float32))
        out.commit()
