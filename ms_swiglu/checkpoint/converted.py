"""Files written by ``ms-swiglu convert``: the FFN layers of a checkpoint packed, optionally quantized (int8) and
sharded for tensor parallelism, one safetensors file per rank, with the checkpoint's ``config.json`` inside.
No MindSpore here.

One layer's tensors are named and split as the tensor schema says (``ms_swiglu.schema``). Quantized: each
projection in the weight format (``ms_swiglu.quant``), its float32 scales beside it as ``{name}_scale``.
"""
import contextlib
import dataclasses
import glob
import json
import os

import numpy as np

from ms_swiglu import paths
from ms_swiglu import quant as formats
from ms_swiglu.checkpoint import hf
from ms_swiglu.checkpoint.files import CheckpointError, SafetensorsFolder, encode, layout_safetensors
from ms_swiglu.families import parse_config
from ms_swiglu.layout import ParallelLayout
from ms_swiglu.schema import PART_SUFFIXES as _SUFFIXES, SCALE, Split, layer_tensors, stored_name

FORMAT = "ms_swiglu.packed"


def rank_paths(path, tp_size=1, ep_size=1):
    """The files of a conversion to ``path``: ``X.safetensors``, or one per rank, ``X-tp{r}-of-K`` with ``tp_size``
    K tensor-parallel ranks, ``X-ep{r}-of-K`` with ``ep_size`` K expert-parallel ones."""
    size, kind = (tp_size, "tp") if tp_size > 1 else (ep_size, "ep")
    if size == 1:
        return [path]
    stem, ext = os.path.splitext(path)
    return [f"{stem}-{kind}{r}-of-{size}{ext or '.safetensors'}" for r in range(size)]


def _rank_files(path, rank):
    """The rank files of any conversion to ``path`` that exist, for ``rank`` (a number or ``*``)."""
    stem = os.path.splitext(path)[0]
    return sorted(glob.glob(f"{stem}-tp{rank}-of-*.safetensors") + glob.glob(f"{stem}-ep{rank}-of-*.safetensors"))


def convert(checkpoint, output, *, layers=None, tp_size=1, ep_size=1, dtype=None, quant=None, force=False,
            progress=None):
    """Write the packed layers ``layers`` (a range; default all) of the HuggingFace checkpoint folder ``checkpoint``
    as ``output`` (``FILE.safetensors``; with ``tp_size`` K one file per rank, ``FILE-tp{r}-of-K.safetensors``,
    each with its rank's part of every tensor; with ``ep_size`` K ``FILE-ep{r}-of-K.safetensors``, each with its
    rank's routed experts whole and every other tensor whole), in
    ``dtype`` (default the checkpoint's; FP8 checkpoints: their config's dtype) with projections quantized to
    ``quant``; returns ``[(path, tensor count)]`` and the dtype written.

    Streaming: each file's header is written first (every shape follows from the config), then each tensor piece
    by piece, one MLP or one expert at a time (read, dequantized from FP8 in float32, quantized, split for every
    rank, written in place), so memory holds a few experts' float32 weights, whatever the model's size. Every
    rank's file is written in full beside its name, then all are put in place together
    (``ms_swiglu.outputs.OutputSet``): a failure leaves none, and each file names its set (``set``, ``tp_size``,
    ``rank``) so that a reader can tell a whole set from files a killed commit put in place. ``quant`` quantizes
    each whole projection (each expert's) before it is split, so that every rank's rows carry the scales of the
    unsplit layer. ``progress(done, total)`` is called after each layer."""
    from ms_swiglu import signals  # noqa: PLC0415
    from ms_swiglu.outputs import OutputSet  # noqa: PLC0415

    if os.path.isfile(checkpoint):
        raise CheckpointError(f"--checkpoint: expected a HuggingFace checkpoint folder, got the file {checkpoint}")
    config, config_json = hf.read_config_json(checkpoint)
    layers = range(config.num_hidden_layers) if layers is None else layers
    for layer in (layers.start, layers.stop - 1):
        config.check_layer(layer)
    config.check_tp(tp_size, layers, quant)
    config.check_ep(ep_size, layers)
    method, shards = _method(config, layers, quant), SafetensorsFolder(checkpoint)
    dtype = dtype or _stored_dtype(shards, config, layers.start)
    ranks = [ParallelLayout.of(rank, tp_size, ep_size) for rank in range(tp_size * ep_size)]
    entries = [{} for _ in ranks]
    for layer in layers:
        for spec in layer_tensors(config, layer):
            for rank, layout in enumerate(ranks):
                entries[rank].update(_entries(spec, layout, method, dtype))
    with OutputSet(rank_paths(output, tp_size, ep_size), force) as out:
        files = []
        try:
            for rank, path in enumerate(out.paths):
                meta = metadata(config_json, dtype, formats.name(method), tp_size, rank, layers, out.token, ep_size)
                files.append(_StreamedFile(path, out.temporary(path), entries[rank], meta))
            for i, layer in enumerate(layers):
                for spec, piece, e in _pieces(shards, config, layer, method):
                    for layout, file in zip(ranks, files):
                        mine = layout.experts(config.moe.num_experts) if e is not None else None
                        if mine is not None and e not in mine:
                            continue  # another expert-parallel rank's expert
                        for kind, a in layout.shard(spec, piece, method).items():
                            file.write(stored_name((spec,), kind), a, None if mine is None else e - mine.start)
                if progress:
                    progress(i + 1, len(layers))
                signals.pause_point("convert-layer")
        finally:
            for file in files:
                file.close()
        out.commit()
    return [(path, len(names)) for path, names in zip(out.paths, entries)], dtype


def _stored_dtype(shards, config, layer):
    """The dtype a layer's MLP (or experts) computes in, from the header alone (nothing is read)."""
    if hf.stored_format(config, layer).quantized:
        return config.encoding.dtype
    spec = next(t for t in layer_tensors(config, layer) if t.quantized)
    return hf.compute_dtype(config, shards.dtype_name(spec.hf[0].format(e=0)))


def _method(config, layers, quant):
    """The format a conversion writes: a quantized checkpoint's own (every layer of it in one; ``quant`` none), or
    ``quant`` for a float one."""
    stored = {hf.stored_format(config, layer).name: layer for layer in layers}
    if len(stored) > 1:
        (a, la), (b, lb) = list(stored.items())[:2]
        raise CheckpointError(f"--layers: expected layers stored in one format, got {a} (layer {la}) and {b} (layer "
                              f"{lb}); convert them apart")
    method = formats.get(next(iter(stored)))
    if method.quantized and quant is not None and formats.get(quant).name != method.name:
        raise CheckpointError(f"--quantize: expected none for a checkpoint stored in {method.name} "
                              f"({config.encoding.source}), got {formats.name(quant)}")
    return method if method.quantized else formats.get(quant)


def _entries(spec, layout, method, dtype):
    """``{stored name: (shape, dtype name)}`` of a tensor (and its format's other parts) in a rank's file."""
    shape = list(spec.hf_shape)
    if spec.split is not Split.REPLICATED:  # gate_up [2I/p, H], down [H, I/p]
        block = layout.block(spec.size)
        shape = [2 * (block.stop - block.start), shape[1]] if spec.split is Split.ROWS else [
            shape[0], block.stop - block.start]
        shape = [len(layout.experts(spec.experts))] * bool(spec.experts) + shape
    if not (spec.quantized and method.quantized):
        return {spec.stored: (tuple(shape), "float32" if spec.float32 else dtype)}
    return {spec.stored + part.suffix: (tuple(part.shape(shape[:-2], *shape[-2:])), part.dtype)
            for part in method.parts}


def _pieces(shards, config, layer, method):
    """(spec, ``{kind: array}`` of one piece, expert index or None) of a whole layer (``hf.pieces``), each
    projection encoded in the format where it quantizes them."""
    for spec, piece, e, _, stored in hf.pieces(shards, config, layer):
        if method.quantized and spec.quantized and not stored.quantized:
            piece = {spec.kind + suffix: a for suffix, a in method.encode(piece[spec.kind]).items()}
        yield dataclasses.replace(spec, experts=0), piece, e  # one expert: split like an MLP


class _StreamedFile:
    """A safetensors file written piece by piece to ``temporary`` (for ``path``): the header first, each tensor (or
    one expert of a stacked one) at its place. A full disk is named as such (``outputs.disk_full``)."""

    def __init__(self, path, temporary, entries, metadata):
        head, self.offsets = layout_safetensors(entries, metadata)
        self.path, self.entries, self.file = path, entries, None
        with self._named():
            self.file = open(temporary, "wb")
            self.file.write(head)

    @contextlib.contextmanager
    def _named(self):
        from ms_swiglu.outputs import disk_full  # noqa: PLC0415

        try:
            yield
        except OSError as exc:
            raise disk_full(exc, self.path) from None

    def write(self, name, a, expert=None):
        shape, dtype = self.entries[name]
        if tuple(a.shape) != tuple(shape[1:] if expert is not None else shape):
            raise RuntimeError(f"ms_swiglu: {name}: a piece of shape {a.shape} for {shape}")  # a bug of the plan
        data = encode(a, dtype)
        with self._named():
            self.file.seek(self.offsets[name] + (0 if expert is None else expert * len(data)))
            self.file.write(data)

    def close(self):
        if self.file is not None:
            with self._named():
                self.file.close()


def metadata(config_json, dtype, quant, tp_size, rank, layers, token, ep_size=1):
    """A converted file's ``__metadata__`` (strings): what it holds and which set it belongs to."""
    return {"format": FORMAT, "layout": "gate_up rows [gate; up]", "model_type": config_json["model_type"],
            "dtype": dtype, "quant": quant or "", "tp_size": tp_size, "ep_size": ep_size, "rank": rank,
            "layers": f"{layers.start}-{layers.stop - 1}", "set": token, "config": json.dumps(config_json)}


def _sizes(tp_size, ep_size):
    """How a conversion's split is named on the command line."""
    return f"--tp-size {tp_size}" + (f" --ep-size {ep_size}" if ep_size > 1 else "")


class ConvertedFile:
    """One rank's converted file: its config, dtype, quantization and layers.

    ``path``: the name given to ``convert --output`` (``X.safetensors``); with ``tp_size`` (or ``ep_size``) > 1 rank
    ``rank``'s file ``X-tp{r}-of-K.safetensors`` (``X-ep{r}-of-K``) is read, and it must come from a conversion
    with that ``--tp-size`` (``--ep-size``).
    """

    def __init__(self, path, tp_size=1, rank=0, ep_size=1):
        self.path = rank_paths(path, tp_size, ep_size)[rank]
        if tp_size == ep_size == 1 and not os.path.exists(path):
            found = _rank_files(path, "*")
            if found:
                raise CheckpointError(f"checkpoint: expected {path}, found only the rank files of a parallel "
                                      f"conversion ({os.path.basename(found[0])}, ...): run takes them with their "
                                      f"--tp-size or --ep-size; export takes a conversion without --tp-size (and "
                                      f"expert-parallel ones with their --ep-size)")
        if not os.path.isfile(paths.input_file(self.path, "checkpoint")):
            there = [p for p in [path] + _rank_files(path, "*") if os.path.isfile(p)]
            more = ", ..." if len(there) > 1 else ""
            found = f"found only {os.path.basename(there[0])}{more}" if there else "found none"
            raise CheckpointError(f"checkpoint: expected a converted file {self.path} ({_sizes(tp_size, ep_size)}), "
                                  f"{found}")
        self._folder = SafetensorsFolder(self.path)
        meta = self._folder.metadata(self.path)
        if meta.get("format") != FORMAT or "config" not in meta:
            raise CheckpointError(f"{self.path}: expected a file written by ms-swiglu convert (format {FORMAT}), "
                                  f"got format {meta.get('format')!r}")
        try:
            stored_tp, config_json = int(meta["tp_size"]), json.loads(meta["config"])
            stored_ep = int(meta.get("ep_size", 1))  # files written before expert parallelism: 1
            first, _, last = meta["layers"].partition("-")
            self.layers = range(int(first), int(last) + 1)
            self.dtype, self.quant = meta["dtype"], meta["quant"] or None
            self.set_id, stored_rank = meta["set"], int(meta["rank"])
        except (KeyError, ValueError) as exc:  # (json's JSONDecodeError is a ValueError)
            raise CheckpointError(f"{self.path}: expected the metadata ms-swiglu convert writes (tp_size, rank, set, "
                                  f"layers 'A-B', config JSON, dtype, quant), got a missing or malformed entry "
                                  f"({type(exc).__name__}: {exc})") from None
        self.tp_size, self.ep_size = stored_tp, stored_ep
        if (stored_tp, stored_ep) != (tp_size, ep_size):
            raise CheckpointError(f"{self.path}: expected a conversion with {_sizes(tp_size, ep_size)}, got one "
                                  f"with {_sizes(stored_tp, stored_ep)}")
        if stored_rank != rank:
            raise CheckpointError(f"{self.path}: expected rank {rank}'s file, got rank {stored_rank}'s")
        if not self.layers or (self.quant is not None and not formats.known(self.quant)):
            raise CheckpointError(f"{self.path}: expected layers 'A-B' with A <= B and quant one of "
                                  f"{', '.join(formats.names())} or empty, got layers {meta['layers']!r}, "
                                  f"quant {meta['quant']!r}")
        self.config = parse_config(config_json, self.path)

    @classmethod
    def whole_set(cls, path, tp_size, ep_size=1):
        """Rank 0's file of the conversion to ``path`` with ``tp_size`` (``ep_size``) ranks, once every rank's file
        is found, holds its own rank and comes from the same conversion (its ``set``), so that no rank starts on a
        partial or mixed set."""
        files = [cls(path, tp_size, rank, ep_size) for rank in range(tp_size * ep_size)]
        for f in files[1:]:
            if f.set_id != files[0].set_id:
                raise CheckpointError(f"{f.path}: expected a file of the conversion that wrote {files[0].path} (set "
                                      f"{files[0].set_id}), got one of set {f.set_id}")
        return files[0]

    @classmethod
    def any_rank(cls, path):
        """Rank 0's file of the conversion to ``path``, whatever its ``--tp-size`` or ``--ep-size`` (for its
        config)."""
        if os.path.exists(path):
            return cls(path)
        found = _rank_files(path, 0)
        if not found:
            raise CheckpointError(f"checkpoint: expected a converted file {path} (or its rank files), found none")
        size = int(found[0].rsplit("-of-", 1)[1].split(".")[0])
        return cls(path, size, 0) if found[0].endswith(f"-tp0-of-{size}.safetensors") else cls(path, 1, 0, size)

    def check_quant(self, asked):
        """ValueError unless ``asked`` (a quantization asked at load) is the file's or None, where it has one."""
        if self.quant and formats.name(asked) not in (None, self.quant):
            raise CheckpointError(f"quant: expected {self.quant} (the file's) or none, got {formats.name(asked)!r}")

    def check_layer(self, layer):
        self.config.check_layer(layer)
        if layer not in self.layers:
            raise CheckpointError(f"layer: expected one of the converted layers {self.layers.start}-"
                                  f"{self.layers.stop - 1} of {self.path}, got {layer}")

    def layer(self, layer):
        """(``{kind: array}`` of one layer on this rank, the checkpoint's dtype name)."""
        self.check_layer(layer)
        out = {}
        method = formats.get(self.quant)
        for spec in layer_tensors(self.config, layer):
            suffixes = [p.suffix for p in method.parts] if spec.quantized and method.quantized else [""]
            for suffix in suffixes + [s for s in _SUFFIXES if s not in suffixes]:  # (others: refused below)
                if spec.stored + suffix in self._folder.weight_map:
                    name = spec.stored + suffix
                    out[spec.kind + suffix] = self._folder.read(name, self._folder.shape(name))[0]
            if spec.quantized and spec.kind in out:
                self._check_stored(spec, out, method)
        return out, self.dtype

    def _check_stored(self, spec, tensors, method):
        """A projection as the metadata says: its format's parts in their dtypes and shapes, its scales finite and
        positive; float weights with nothing beside them."""
        w = tensors[spec.kind]
        found = {s: tensors[spec.kind + s] for s in _SUFFIXES if spec.kind + s in tensors}
        what = f"{w.dtype} weights {list(w.shape)} with " + (", ".join(
            f"{s[1:]} {a.dtype} {list(a.shape)}" for s, a in found.items()) if found else "nothing beside them")
        if not self.quant:
            if w.dtype in (np.int8, np.uint8) or found:
                raise CheckpointError(f"{self.path}: {spec.stored}: expected float weights without scales (the "
                                      f"metadata names no quantization), got {what}")
            return
        k = spec.size // self.tp_size if spec.split is Split.COLUMNS else spec.hf_shape[1]  # the rank's inputs
        lead, m = w.shape[:-2], w.shape[-2]
        parts = {p.suffix: p for p in method.parts}
        if set(found) != set(parts) - {""} or any(
                a.dtype != np.dtype(parts[s].dtype) or a.shape != parts[s].shape(lead, m, k)
                for s, a in {"": w, **found}.items()):
            weights, *others = [f"{p.suffix[1:] or 'weights'} {p.dtype} {list(p.shape(lead, m, k))}"
                                for p in method.parts]
            expected = f"{weights} with {', '.join(others)}"
            raise CheckpointError(f"{self.path}: {spec.stored}: expected {expected} ({self.quant}, as the metadata "
                                  f"says), got {what}")
        scale = found[SCALE]
        bad = int((~(np.isfinite(scale) & (scale > 0))).sum())
        if bad:
            raise CheckpointError(f"{self.path}: {spec.stored}{SCALE}: expected finite positive scales, got {bad} of "
                                  f"{scale.size} that are not")
