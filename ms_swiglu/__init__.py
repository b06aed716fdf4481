"""ms_swiglu: the SwiGLU MLP of LLaMA/Qwen/Mixtral-class models with one packed gate/up GEMM.

    out = down_proj(SiLU(gate) * up),   [gate, up] = gate_up_proj(x)   (one GEMM, gate rows first)

The MindSpore parts are imported on first use, so that the CLI can reject bad input before loading MindSpore.
"""
import importlib

_EXPORTS = {
    "ms_swiglu.activation": ["BACKENDS", "SwiGLU", "resolve_backend", "swiglu"],
    "ms_swiglu.config": ["PRESETS", "preset"],
    "ms_swiglu.mlp": ["PackedSwiGLUMLP", "SwiGLUMLP", "load_mlp", "to_packed", "to_unpacked"],
    "ms_swiglu.packing": ["pack_gate_up", "pack_state_dict", "shard_down", "shard_packed", "unpack_gate_up",
                          "unpack_state_dict", "unshard_down", "unshard_packed", "reshard"],
    "ms_swiglu.moe": ["PackedMoE", "load_moe", "route"],
    "ms_swiglu.ffn": ["FFNBlock", "FFNStack", "RMSNorm", "load_ffn"],
    "ms_swiglu.checkpoint": ["ModelConfig", "CheckpointError", "read_config", "load_dense_layer",
                             "load_moe_layer"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module 'ms_swiglu' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
