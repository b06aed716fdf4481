"""ms_swiglu: the SwiGLU MLP of LLaMA/Qwen/Mixtral-class models with one packed gate/up GEMM.

    out = down_proj(SiLU(gate) * up),   [gate, up] = gate_up_proj(x)   (one GEMM, gate rows first)

The MindSpore parts are imported on first use, so that the CLI can reject bad input before loading MindSpore.
"""
import importlib

# module -> names it gives the package ("public=attribute" where the package's name differs)
_EXPORTS = {
    "ms_swiglu.activation": ["SwiGLU", "swiglu"],
    "ms_swiglu.backends": ["BACKENDS=NAMES", "resolve_backend=resolve"],
    "ms_swiglu.config": ["PRESETS", "preset"],
    "ms_swiglu.mlp": ["PackedSwiGLUMLP", "SwiGLUMLP", "to_packed", "to_quantized", "to_unpacked"],
    "ms_swiglu.packing": ["pack_gate_up", "pack_state_dict", "shard_down", "shard_packed", "unpack_gate_up",
                          "unpack_state_dict", "unshard_down", "unshard_packed", "reshard"],
    "ms_swiglu.quant": ["quantize_state_dict"],
    "ms_swiglu.quant.int8": ["quantize_int8", "dequantize_int8"],
    "ms_swiglu.moe": ["PackedMoE"],
    "ms_swiglu.ffn": ["FFNBlock", "FFNStack", "RMSNorm"],
    "ms_swiglu.checkpoint": ["ModelConfig", "CheckpointError", "read_config", "load_dense_layer",
                             "load_moe_layer", "open_checkpoint"],
    "ms_swiglu.checkpoint.load": ["load_mlp", "load_moe", "load_ffn"],
}
_WHERE = {entry.split("=")[0]: (module, entry.split("=")[-1]) for module, entries in _EXPORTS.items()
          for entry in entries}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module 'ms_swiglu' has no attribute {name!r}")
    module, attribute = _WHERE[name]
    return getattr(importlib.import_module(module), attribute)
