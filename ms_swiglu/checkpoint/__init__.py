"""Checkpoints: safetensors files (``files``, FP8 decoding in ``fp8``), HuggingFace folders (``hf``), the files
``convert`` writes (``converted``), one object for either (``source.open_checkpoint``), and the Cells built from
them (``load``, which imports MindSpore; the others do not, so that the CLI can check its input first)."""
from ms_swiglu.checkpoint.files import (CheckpointError, SafetensorsFolder, dump_safetensors, from_bf16_bits,
                                        read_safetensors, to_bf16_bits, write_safetensors)
from ms_swiglu.checkpoint.hf import DENSE_FAMILIES, MOE_FAMILIES, ModelConfig, load_dense_layer, load_moe_layer
from ms_swiglu.checkpoint.source import open_checkpoint, read_config  # a checkpoint folder or convert's files

__all__ = ["CheckpointError", "DENSE_FAMILIES", "dump_safetensors", "MOE_FAMILIES", "ModelConfig", "SafetensorsFolder",
           "from_bf16_bits", "load_dense_layer", "load_moe_layer", "open_checkpoint", "read_config", "read_safetensors",
           "to_bf16_bits", "write_safetensors"]
