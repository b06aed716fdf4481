"""Files written by ``ms-swiglu convert``: the FFN layers of a checkpoint packed, optionally quantized (int8) and
sharded for tensor parallelism, one safetensors file per rank, with the checkpoint's ``config.json`` inside.
No MindSpore here.

One layer's tensors, by kind (the arrays of ``hf.load_dense_layer`` / ``hf.load_moe_layer``), stored as
``model.layers.{layer}.{block}.`` + ``gate_up_proj.weight`` / ``down_proj.weight`` (dense) or ``gate.weight``,
``experts.gate_up_proj.weight``, ``experts.down_proj.weight`` and the family's shared expert and bias (MoE).
Quantized: each projection int8, its float32 scales beside it as ``{name}_scale`` (kind ``{kind}_scale``): per
row, or (int8-g128) per 128 inputs of a row.
Sharded: gate/up rows (and their scales) by ``packing.shard_packed``, down columns by ``packing.shard_down``, down's
per-row scales (whole rows) and the rest replicated; down's per-group scales by the groups of the rank's columns.
"""
import glob
import json
import os

import numpy as np

from ms_swiglu import paths
from ms_swiglu.checkpoint.files import CheckpointError, SafetensorsFolder
from ms_swiglu.checkpoint import hf
from ms_swiglu.checkpoint.hf import load_dense_layer, load_moe_layer, parse_config
from ms_swiglu.packing import QUANT, group_size, quantize_int8, scale_shape, shard_down, shard_packed

FORMAT = "ms_swiglu.packed"
ROWS, COLUMNS = ("gate_up", "shared_gate_up"), ("down", "shared_down")  # how the projections shard
SCALE = "_scale"


def is_converted(path):
    """Whether ``path`` names converted files (``X.safetensors``, or its rank files) rather than a checkpoint
    folder."""
    return path.endswith(".safetensors") or os.path.isfile(path)


def read_config(path):
    """The :class:`~ms_swiglu.checkpoint.hf.ModelConfig` of a checkpoint folder, or of the files ``ms-swiglu
    convert`` wrote (they hold their checkpoint's config.json)."""
    return ConvertedFile.any_rank(path).config if is_converted(path) else hf.read_config(path)


def rank_paths(path, tp_size):
    """The files of a conversion to ``path`` with ``tp_size`` ranks: ``X.safetensors``, or ``X-tp{r}-of-K``."""
    if tp_size == 1:
        return [path]
    stem, ext = os.path.splitext(path)
    return [f"{stem}-tp{r}-of-{tp_size}{ext or '.safetensors'}" for r in range(tp_size)]


def tensor_names(config, layer):
    """``{kind: tensor name}`` of one layer's tensors in a converted file."""
    if not config.is_moe_layer(layer):
        p = f"model.layers.{layer}.mlp."
        return {"gate_up": p + "gate_up_proj.weight", "down": p + "down_proj.weight"}
    keys, p = config.keys, config.keys.prefix(layer)
    names = {"router": p + "gate.weight", "gate_up": p + "experts.gate_up_proj.weight",
             "down": p + "experts.down_proj.weight"}
    if keys.bias:
        names["bias"] = p + keys.bias
    if keys.shared:
        names.update(shared_gate_up=p + keys.shared + "gate_up_proj.weight",
                     shared_down=p + keys.shared + "down_proj.weight")
    if keys.shared_gate:
        names["shared_gate"] = p + keys.shared_gate
    return names


def tensor_name(names, kind):
    """The name of a layer's tensor of ``kind`` in a converted file (``names``: :func:`tensor_names`); a scale is
    named after its weight (``{name}_scale``)."""
    return names[kind] if kind in names else names[kind.removesuffix(SCALE)] + SCALE


def read_hf_layer(config, folder, layer, tp_size=1, rank=0):
    """(``{kind: array}`` of one layer of a HuggingFace checkpoint, all ranks or rank ``rank``'s part; its dtype
    name)."""
    read = load_moe_layer if config.is_moe_layer(layer) else load_dense_layer
    return read(folder, layer, config, tp_size, rank)


def quantize_layer(tensors, quant):
    """The layer with every projection quantized (``quant``: one of ``packing.QUANT``), its scales beside it
    (``{kind}_scale``)."""
    if quant not in QUANT:
        raise CheckpointError(f"quantize: expected one of {', '.join(QUANT)}, got {quant!r}")
    out = dict(tensors)
    for kind in ROWS + COLUMNS:
        if kind in tensors:
            out[kind], out[kind + SCALE] = quantize_int8(tensors[kind], group_size(quant))
    return out


def shard_layer(tensors, tp_size, rank):
    """Rank ``rank``'s part of a layer (all ranks' arrays, as :func:`read_hf_layer` / :func:`quantize_layer` give)."""
    out = {}
    for kind, a in tensors.items():
        weight = kind.removesuffix(SCALE)
        grouped = weight != kind and a.ndim == tensors[weight].ndim  # scales [..., rows, groups]
        if kind in ROWS or (weight in ROWS and grouped):
            out[kind] = shard_packed(a, tp_size, rank)  # [..., 2I/p, H] (scales [..., 2I/p, H/128])
        elif weight in ROWS:
            out[kind] = shard_packed(a[..., None], tp_size, rank)[..., 0]  # [..., 2I/p]: each row its scale
        elif kind in COLUMNS:
            out[kind] = shard_down(a, tp_size, rank)  # [..., H, I/p]
        elif weight in COLUMNS and grouped:
            inter, groups = tensors[weight].shape[-1], a.shape[-1]
            if (inter // tp_size) % (inter // groups):
                raise CheckpointError(f"{weight}: expected I/p a multiple of the group {inter // groups} for "
                                      f"--tp-size {tp_size}, got I/p = {inter // tp_size}")
            out[kind] = shard_down(a, tp_size, rank)  # [..., H, I/(128 p)]: the groups of the rank's columns
        else:
            out[kind] = a  # down's per-row scales [..., H] (whole rows), router, bias, shared gate: replicated
    return out


def float32_kinds(tensors):
    """The kinds kept in float32 whatever the file's dtype: scales and the router's bias."""
    return {k for k in tensors if k.endswith(SCALE) or k == "bias"}


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
    ranks = [{} for _ in range(tp_size)]
    with OutputSet(rank_paths(output, tp_size), force) as out:
        float32 = set()
        for i, layer in enumerate(layers):
            tensors, ckpt_dtype = read_hf_layer(config, checkpoint, layer)
            tensors = quantize_layer(tensors, quant) if quant else tensors
            dtype, names = dtype or ckpt_dtype, tensor_names(config, layer)
            float32 |= {tensor_name(names, k) for k in float32_kinds(tensors)}
            for rank, rank_tensors in enumerate(ranks):
                rank_tensors.update({tensor_name(names, k): a for k, a in shard_layer(tensors, tp_size, rank).items()})
            if progress:
                progress(i + 1, len(layers))
            signals.pause_point("convert-layer")
        for rank, (path, tensors) in enumerate(zip(out.paths, ranks)):
            meta = metadata(config_json, dtype, quant, tp_size, rank, layers, out.token)
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
        if not self.layers or (self.quant is not None and self.quant not in QUANT):
            raise CheckpointError(f"{self.path}: expected layers 'A-B' with A <= B and quant one of "
                                  f"{', '.join(QUANT)} or empty, got layers {meta['layers']!r}, "
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

    def check_quant(self, quant):
        """ValueError unless ``quant`` (a quantization asked at load) is the file's or None, where it has one."""
        if self.quant and quant not in (None, self.quant):
            raise CheckpointError(f"quant: expected {self.quant} (the file's) or none, got {quant!r}")

    def check_layer(self, layer):
        self.config.check_layer(layer)
        if layer not in self.layers:
            raise CheckpointError(f"layer: expected one of the converted layers {self.layers.start}-"
                                  f"{self.layers.stop - 1} of {self.path}, got {layer}")

    def layer(self, layer):
        """(``{kind: array}`` of one layer on this rank, the checkpoint's dtype name)."""
        self.check_layer(layer)
        out, names = {}, tensor_names(self.config, layer)
        for kind, name in names.items():
            for k, n in ((kind, name), (kind + SCALE, name + SCALE)):
                if n in self._folder.weight_map:
                    out[k] = self._folder.read(n, self._folder.shape(n))[0]
        for kind in ROWS + COLUMNS:
            if kind in out:
                self._check_stored(names[kind], out[kind], out.get(kind + SCALE))
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
        expected = scale_shape(self.quant, w.shape[:-1], w.shape[-1])
        if w.dtype != np.int8 or scale is None or scale.dtype != np.float32 or scale.shape != expected:
            raise CheckpointError(f"{self.path}: {name}: expected int8 weights with float32 scales {list(expected)} "
                                  f"({self.quant}, as the metadata says), got {what}")
        bad = int((~(np.isfinite(scale) & (scale > 0))).sum())
        if bad:
            raise CheckpointError(f"{self.path}: {name}{SCALE}: expected finite positive scales, got {bad} of "
                                  f"{scale.size} that are not")
