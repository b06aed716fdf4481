"""ms_swiglu: the SwiGLU MLP of LLaMA/Qwen/Mixtral-class models with one packed gate/up GEMM.

    out = down_proj(SiLU(gate) * up),   [gate, up] = gate_up_proj(x)   (one GEMM, gate rows first)
"""
from ms_swiglu.activation import BACKENDS, SwiGLU, resolve_backend, swiglu
from ms_swiglu.config import PRESETS, preset
from ms_swiglu.mlp import PackedSwiGLUMLP, SwiGLUMLP, to_packed, to_unpacked
from ms_swiglu.packing import pack_gate_up, pack_state_dict, unpack_gate_up, unpack_state_dict

__all__ = [
    "BACKENDS", "PRESETS", "PackedSwiGLUMLP", "SwiGLU", "SwiGLUMLP", "pack_gate_up", "pack_state_dict", "preset",
    "resolve_backend", "swiglu", "to_packed", "to_unpacked", "unpack_gate_up", "unpack_state_dict",
]
