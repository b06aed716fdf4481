"""Files written by ``ms-swiglu convert``: the FFN layers of a checkpoint packed, optionally quantized (int8) and
sharded for tensor parallelism, one safetensors file per rank, with the checkpoint's ``config.json`` inside.
No MindSpore here.

One layer's tensors are named and split as the tensor schema says (``ms_swiglu.schema``). Quantized: each
projection in the weight format (``ms_swiglu.quant``), its float32 scales beside it as ``{name}_scale``.
"""
import glob
import json
import os

import numpy as np

from ms_swiglu import paths
from ms_swiglu import quant as formats
from ms_swiglu.checkpoint.files import CheckpointError, SafetensorsFolder
from ms_swiglu.checkpoint import hf
from ms_swiglu.families import parse_config
from ms_swiglu.layout import ParallelLayout
from ms_swiglu.schema import SCALE, layer_tensors, stored_name

FORMAT = "ms_swiglu.packed"


def rank_paths(path, tp_size):
    """The files of a conversion to ``path`` with ``tp_size`` ranks: ``X.safetensors``, or ``X-tp{r}-of-K``."""
    if tp_size == 1:
        return [path]
    stem, ext = os.path.splitext(path)
    return [f"{stem}-tp{r}-of-{tp_size}{ext or '.safetensors'}" for r in range(tp_size)]


def quantize_layer(config, layer, tensors, method):
    """A layer's ``{kind: array}`` with every tensor the schema marks quantized in the weight format ``method``,
    its scales beside it (``{kind}_scale``)."""
    kinds = {t.kind for t in layer_tensors(config, layer) if t.quantized}
    return formats.quantize_tensors(tensors, method, kinds.__contains__)


def convert(checkpoint, output, *, layers=None, tp_size=1, dtype=None, quant=None, force=False, progress=None):
    """Write the packed layers ``layers`` (a range; default all) of the HuggingFace checkpoint folder ``checkpoint``
    as ``output`` (``FILE.safetensors``; with ``tp_size`` K one file per rank, ``FILE-tp{r}-of-K.safetensors``), in
    ``dtype`` (default the checkpoint's) with projections quantized to ``quant``; returns ``[(path, tensor count)]``
    and the dtype written.

    Every rank's file is written in full beside its name, then all are put in place together
    (``ms_swiglu.outputs.OutputSet``): a failure leaves none, and each file names its set (``set``, ``tp_size``,
    ``rank``) so that a reader can tell a whole set from files a killed commit put in place. ``quant`` quantizes
    each whole projection before it is sharded, so that every rank's rows carry the scales of the unsharded layer.
    ``progress(done, total)`` is called after each layer."""
    from ms_swiglu import signals  # noqa: PLC0415
    from ms_swiglu.checkpoint.files import dump_safetensors  # noqa: PLC0415
    from ms_swiglu.outputs import OutputSet  # noqa: PLC0415

    if os.path.isfile(checkpoint):
        raise CheckpointError(f"--checkpoint: expected a HuggingFace checkpoint folder, got the file {checkpoint}")
    config, config_json = hf.read_config_json(checkpoint)
    layers = range(config.num_hidden_layers) if layers is None else layers
    for layer in (layers.start, layers.stop - 1):
        config.check_layer(layer)
    config.check_tp(tp_size, layers, quant)
    method, shards = formats.get(quant), SafetensorsFolder(checkpoint)
    ranks = [{} for _ in range(tp_size)]
    with OutputSet(rank_paths(output, tp_size), force) as out:
        float32 = set()
        for i, layer in enumerate(layers):
            tensors, ckpt_dtype = hf.read_layer(shards, config, layer)
            tensors = quantize_layer(config, layer, tensors, method) if method.quantized else tensors
            dtype, specs = dtype or ckpt_dtype, layer_tensors(config, layer)
            float32 |= {stored_name(specs, k) for k in tensors if k.endswith(SCALE)}
            float32 |= {t.stored for t in specs if t.float32}
            for rank, rank_tensors in enumerate(ranks):
                part = ParallelLayout(tp_size, rank).shard_layer(specs, tensors, method)
                rank_tensors.update({stored_name(specs, k): a for k, a in part.items()})
            if progress:
                progress(i + 1, len(layers))
            signals.pause_point("convert-layer")
        for rank, (path, tensors) in enumerate(zip(out.paths, ranks)):
            meta = metadata(config_json, dtype, formats.name(method), tp_size, rank, layers, out.token)
            out.write(path, lambda tmp, t=tensors, m=meta: dump_safetensors(tmp, t, dtype, m, float32=float32))
        out.commit()
    return [(path, len(tensors)) for path, tensors in zip(out.paths, ranks)], dtype


def metadata(config_json, dtype, quant, tp_size, rank, layers, token):
    """A converted file's ``__metadata__`` (strings): what it holds and which set it belongs to."""
    return {"format": FORMAT, "layout": "gate_up rows [gate; up]", "model_type": config_json["model_type"],
            "dtype": dtype, "quant": quant or "", "tp_size": tp_size, "rank": rank,
            "layers": f"{layers.start}-{layers.stop - 1}", "set": token, "config": json.dumps(config_json)}


class ConvertedFile:
    """One rank's converted file: its config, dtype, quantization and layers.

    ``path``: the name given to ``convert --output`` (``X.safetensors``); with ``tp_size`` > 1 rank ``rank``'s file
    ``X-tp{r}-of-K.safetensors`` is read, and it must come from a conversion with that ``--tp-size``.
    """

    def __init__(self, path, tp_size=1, rank=0):
        self.path = rank_paths(path, tp_size)[rank]
        if tp_size == 1 and not os.path.exists(path):
            found = sorted(glob.glob(f"{os.path.splitext(path)[0]}-tp*-of-*.safetensors"))
            if found:
                raise CheckpointError(f"checkpoint: expected {path}, found only the rank files of a tensor-parallel "
                                      f"conversion ({os.path.basename(found[0])}, ...): run takes them with their "
                                      f"--tp-size; export takes a conversion without --tp-size")
        if not os.path.isfile(paths.input_file(self.path, "checkpoint")):
            raise CheckpointError(f"checkpoint: expected a converted file {self.path}, found none")
        self._folder = SafetensorsFolder(self.path)
        meta = self._folder.metadata(self.path)
        if meta.get("format") != FORMAT or "config" not in meta:
            raise CheckpointError(f"{self.path}: expected a file written by ms-swiglu convert (format {FORMAT}), "
                                  f"got format {meta.get('format')!r}")
        try:
            stored_tp, config_json = int(meta["tp_size"]), json.loads(meta["config"])
            first, _, last = meta["layers"].partition("-")
            self.layers = range(int(first), int(last) + 1)
            self.dtype, self.quant = meta["dtype"], meta["quant"] or None
            self.set_id, stored_rank = meta["set"], int(meta["rank"])
        except (KeyError, ValueError) as exc:  # (json's JSONDecodeError is a ValueError)
            raise CheckpointError(f"{self.path}: expected the metadata ms-swiglu convert writes (tp_size, rank, set, "
                                  f"layers 'A-B', config JSON, dtype, quant), got a missing or malformed entry "
                                  f"({type(exc).__name__}: {exc})") from None
        if stored_tp != tp_size:
            raise CheckpointError(f"{self.path}: expected a conversion with --tp-size {tp_size}, got one with "
                                  f"--tp-size {stored_tp}")
        if stored_rank != rank:
            raise CheckpointError(f"{self.path}: expected rank {rank}'s file, got rank {stored_rank}'s")
        if not self.layers or (self.quant is not None and self.quant not in formats.names()):
            raise CheckpointError(f"{self.path}: expected layers 'A-B' with A <= B and quant one of "
                                  f"{', '.join(formats.names())} or empty, got layers {meta['layers']!r}, "
                                  f"quant {meta['quant']!r}")
        self.config = parse_config(config_json, self.path)

    @classmethod
    def whole_set(cls, path, tp_size):
        """Rank 0's file of the conversion to ``path`` with ``tp_size`` ranks, once every rank's file is found, holds
        its own rank and comes from the same conversion (its ``set``), so that no rank starts on a partial or mixed
        set."""
        files = [cls(path, tp_size, rank) for rank in range(tp_size)]
        for f in files[1:]:
            if f.set_id != files[0].set_id:
                raise CheckpointError(f"{f.path}: expected a file of the conversion that wrote {files[0].path} (set "
                                      f"{files[0].set_id}), got one of set {f.set_id}")
        return files[0]

    @classmethod
    def any_rank(cls, path):
        """Rank 0's file of the conversion to ``path``, whatever its ``--tp-size`` (for its config)."""
        if os.path.exists(path):
            return cls(path)
        found = sorted(glob.glob(f"{os.path.splitext(path)[0]}-tp0-of-*.safetensors"))
        if not found:
            raise CheckpointError(f"checkpoint: expected a converted file {path} (or its rank files), found none")
        return cls(path, int(found[0].rsplit("-of-", 1)[1].split(".")[0]), 0)

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
        for spec in layer_tensors(self.config, layer):
            for k, n in ((spec.kind, spec.stored), (spec.kind + SCALE, spec.stored + SCALE)):
                if n in self._folder.weight_map:
                    out[k] = self._folder.read(n, self._folder.shape(n))[0]
            if spec.quantized and spec.kind in out:
                self._check_stored(spec.stored, out[spec.kind], out.get(spec.kind + SCALE))
        return out, self.dtype

    def _check_stored(self, name, w, scale):
        """A projection as the metadata says: int8 with finite positive float32 scales of the format's shape, or
        float without scales."""
        what = f"{w.dtype} weights " + ("without scales" if scale is None else f"with {scale.dtype} scales "
                                                                                 f"{list(scale.shape)}")
        if not self.quant:
            if w.dtype == np.int8 or scale is not None:
                raise CheckpointError(f"{self.path}: {name}: expected float weights without scales (the metadata "
                                      f"names no quantization), got {what}")
            return
        expected = formats.get(self.quant).scale_shape(w.shape[:-1], w.shape[-1])
        if w.dtype != np.int8 or scale is None or scale.dtype != np.float32 or scale.shape != expected:
            raise CheckpointError(f"{self.path}: {name}: expected int8 weights with float32 scales {list(expected)} "
                                  f"({self.quant}, as the metadata says), got {what}")
        bad = int((~(np.isfinite(scale) & (scale > 0))).sum())
        if bad:
            raise CheckpointError(f"{self.path}: {name}{SCALE}: expected finite positive scales, got {bad} of "
                                  f"{scale.size} that are not")
