"""One object for a checkpoint, whichever form it has: a HuggingFace folder or the files ``ms-swiglu convert``
wrote. :func:`open_checkpoint` reads its config once; :meth:`Checkpoint.layer` gives a rank's part of a layer, in
the weight format asked (or the one it is stored in). No MindSpore here."""
import os

import numpy as np

from ms_swiglu import quant as formats
from ms_swiglu.checkpoint import hf
from ms_swiglu.checkpoint.converted import ConvertedFile
from ms_swiglu.checkpoint.files import CheckpointError, SafetensorsFolder
from ms_swiglu.layout import WHOLE, ParallelLayout
from ms_swiglu.quant.base import Part
from ms_swiglu.schema import layer_tensors


def _at_load(config, layer, tensors, quant):
    """(a layer's float ``{kind: array}`` with every tensor the schema marks quantized in the format ``quant``,
    its scales beside it; the format's method)."""
    method = formats.get(quant)
    if method.quantized:
        kinds = {t.kind for t in layer_tensors(config, layer) if t.quantized}
        tensors = formats.quantize_tensors(tensors, method, kinds.__contains__)
    return tensors, method


class HFCheckpoint:
    """A HuggingFace checkpoint folder (float weights; quantized at load when asked)."""

    converted = False
    quant = None  # the weight format it is stored in: float (FP8 is decoded on read)

    def __init__(self, folder):
        self.path, self.where = folder, os.path.abspath(folder)  # (read later, maybe from another folder)
        self.config, self.config_json = hf.read_config_json(folder)
        self._shards = None

    @property
    def shards(self):
        """Its :class:`~ms_swiglu.checkpoint.files.SafetensorsFolder` (opened on first use)."""
        if self._shards is None:
            self._shards = SafetensorsFolder(self.where)
        return self._shards

    def check(self, layers, tp_size=1, quant=None, ep_size=1):
        """InputError unless the layers exist, tp_size (ep_size) splits them, and (``quant``) their sizes take the
        format."""
        for layer in layers:
            self.config.check_layer(layer)
        stored = self._stored(layers[0], quant)
        self.config.check_tp(tp_size, layers, stored if stored.quantized else quant)
        self.config.check_ep(ep_size, layers)

    def _stored(self, layer, quant):
        """The format the checkpoint stores ``layer``'s projections in (``none``: float); InputError where ``quant``
        asks for another."""
        stored = hf.stored_format(self.config, layer)
        if stored.quantized and quant is not None and formats.get(quant).name != stored.name:
            raise CheckpointError(f"--quantize: expected none or {stored.name} (the checkpoint's, "
                                  f"{self.config.encoding.source}), got {formats.name(quant)}")
        return stored

    def layer(self, layer, layout=WHOLE, quant=None):
        """(``{kind: array}`` of the rank's part of a layer, its dtype name, its weight format): float tensors
        quantized by ``quant`` where asked, each rank's part by itself."""
        self._stored(layer, quant)
        tensors, dtype, stored = hf.read_layer_as_stored(self.shards, self.config, layer, layout)
        if stored.quantized:  # a quantized checkpoint computes in its own format
            return tensors, dtype, stored
        tensors, method = _at_load(self.config, layer, tensors, quant)
        return tensors, dtype, method


class ConvertedCheckpoint:
    """The files of a conversion (``X.safetensors`` or its rank files ``X-tp{r}-of-K.safetensors``,
    ``X-ep{r}-of-K.safetensors``): packed, and quantized if they were converted so."""

    converted = True

    def __init__(self, path):
        self.path, self.where = path, os.path.abspath(path)
        first = ConvertedFile.any_rank(path)
        self.config, self.quant, self.layers = first.config, first.quant, first.layers
        self.ep_size = first.ep_size  # an expert-parallel set also gives the whole layer (every rank's experts)
        self._files = {}

    def file(self, layout=WHOLE):
        """The file of ``layout``'s rank (a :class:`~ms_swiglu.layout.ParallelLayout`) in the conversion with its
        ranks (once every rank's file is found and of one conversion)."""
        key = (layout.tp_size, layout.ep_size, layout.rank)
        if key not in self._files:
            if layout.rank == 0:
                self._files[key] = ConvertedFile.whole_set(self.where, layout.tp_size, layout.ep_size)
            else:
                self._files[key] = ConvertedFile(self.where, layout.tp_size, layout.rank, layout.ep_size)
        return self._files[key]

    def check(self, layers, tp_size=1, quant=None, ep_size=1):
        file = self.file(ParallelLayout.of(0, tp_size, ep_size))
        for layer in layers:
            file.check_layer(layer)
        file.check_quant(quant)
        self.config.check_tp(tp_size, layers, None if self.quant else quant)
        self.config.check_ep(ep_size, layers)

    def layer(self, layer, layout=WHOLE, quant=None):
        if layout == WHOLE and self.ep_size > 1:
            return self._whole(layer, quant)
        file = self.file(layout)
        tensors, dtype = file.layer(layer)
        if file.quant:
            file.check_quant(quant)
            return tensors, dtype, formats.get(file.quant)
        tensors, method = _at_load(self.config, layer, tensors, quant)
        return tensors, dtype, method


    def _whole(self, layer, quant):
        """A layer of an expert-parallel set whole: its routed experts (and their scales) from every rank's file,
        in rank order, the rest from rank 0's."""
        parts = [self.layer(layer, ParallelLayout.of(r, ep_size=self.ep_size), quant) for r in range(self.ep_size)]
        tensors, dtype, method = dict(parts[0][0]), parts[0][1], parts[0][2]
        for spec in layer_tensors(self.config, layer):
            for kind in [spec.kind + p.suffix for p in method.parts or (Part(""),)] if spec.experts else ():
                if kind in tensors:
                    tensors[kind] = np.concatenate([p[0][kind] for p in parts])
        return tensors, dtype, method


def is_converted(path):
    """Whether ``path`` names converted files (``X.safetensors``, or its rank files) rather than a checkpoint
    folder."""
    return path.endswith(".safetensors") or os.path.isfile(path)


def open_checkpoint(path):
    """The checkpoint at ``path``: an open one is returned as it is."""
    if isinstance(path, (HFCheckpoint, ConvertedCheckpoint)):
        return path
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise CheckpointError(f"checkpoint: expected a folder or a converted file name, got {path!r}")
    path = os.fspath(path)
    return ConvertedCheckpoint(path) if is_converted(path) else HFCheckpoint(path)


def read_config(path):
    """The :class:`~ms_swiglu.families.base.ModelConfig` of a checkpoint folder or of convert's files."""
    return open_checkpoint(path).config
