"""The Cells of one checkpoint layer, built and filled from a HuggingFace checkpoint folder (packed at load;
with ``tp_size`` > 1, rank ``rank``'s part, read as such from the checkpoint) or from the files ``ms-swiglu
convert`` wrote (packed, and quantized if they are).

``dtype``: the compute dtype; ``None`` keeps the checkpoint's. ``quant`` ("int8", "int8-g128") quantizes a float
checkpoint's projections at load (weight-only; ``ms_swiglu.packing.quantize_int8``); a quantized file loads
quantized.
"""
from ms_swiglu.checkpoint.converted import (SCALE, ConvertedFile, is_converted, quantize_layer, read_config,
                                            read_hf_layer)
from ms_swiglu.checkpoint.files import CheckpointError, SafetensorsFolder
from ms_swiglu.checkpoint.hf import read_float
from ms_swiglu.ffn import FFNBlock
from ms_swiglu.mlp import PackedSwiGLUMLP, load_weights, param_dtype
from ms_swiglu.moe import PackedMoE


def _layer(path, layer, config, tp_size, rank, quant):
    """(``{kind: array}`` of this rank's part of a layer, quantized as asked or as stored; dtype; quant)."""
    if is_converted(path):
        file = ConvertedFile(path, tp_size, rank)
        weights, dtype = file.layer(layer)
        if file.quant:
            file.check_quant(quant)
            return weights, dtype, file.quant
    else:
        weights, dtype = read_hf_layer(config, path, layer, tp_size, rank)
    return (quantize_layer(weights, quant) if quant else weights), dtype, quant


def load_mlp(folder, layer, *, dtype=None, backend="auto", tp_size=1, rank=0, quant=None):
    """The :class:`~ms_swiglu.mlp.PackedSwiGLUMLP` of one dense layer."""
    config = read_config(folder)
    config.check_layer(layer)
    if config.is_moe_layer(layer):
        raise CheckpointError(f"layer {layer}: expected a dense layer, got a mixture-of-experts layer of "
                              f"{config.model_type!r}; use load_moe")
    weights, ckpt_dtype, quant = _layer(folder, layer, config, tp_size, rank, quant)
    mlp = PackedSwiGLUMLP(config.hidden_size, config.intermediate_size, dtype=dtype or ckpt_dtype, backend=backend,
                          tp_size=tp_size, quant=quant)
    names = {"gate_up": "gate_up_proj.weight", "down": "down_proj.weight"}
    return load_weights(mlp, _state(weights, names))


def _state(weights, names, layout=lambda w: w):
    """``{parameter name: array}`` of a layer's ``{kind: array}``; a scale named after its weight."""
    state = {}
    for kind, name in names.items():
        if kind in weights:
            state[name] = layout(weights[kind]) if kind in ("gate_up", "down") else weights[kind]
        if kind + SCALE in weights:
            state[name + SCALE] = weights[kind + SCALE]  # per output row: the same in every layout
    return state


def moe_state(moe, weights):
    """``load_moe_layer``'s arrays as the parameters of ``moe`` (a :class:`~ms_swiglu.moe.PackedMoE`), in the
    layout its backend stores the experts in."""
    names = {"router": "router.weight", "gate_up": "experts.gate_up_proj", "down": "experts.down_proj",
             "bias": "router.e_score_correction_bias", "shared_gate_up": "shared_expert.gate_up_proj.weight",
             "shared_down": "shared_expert.down_proj.weight", "shared_gate": "shared_expert_gate.weight"}
    return _state(weights, names, moe.experts.layout)


def load_moe(folder, layer, *, dtype=None, backend="auto", tp_size=1, rank=0, quant=None):
    """The :class:`~ms_swiglu.moe.PackedMoE` of one MoE layer (experts packed [gate_e; up_e] and stacked)."""
    config = read_config(folder)
    config.check_layer(layer)
    if not config.is_moe_layer(layer):
        raise CheckpointError(f"layer {layer}: expected a mixture-of-experts layer, got a dense layer of "
                              f"{config.model_type!r}; use load_mlp")
    weights, ckpt_dtype, quant = _layer(folder, layer, config, tp_size, rank, quant)
    m = config.moe
    moe = PackedMoE(config.hidden_size, m.intermediate_size, m.num_experts, m.top_k, dtype=dtype or ckpt_dtype,
                    backend=backend, tp_size=tp_size, quant=quant, **m.block_kwargs())
    return load_weights(moe, moe_state(moe, weights))


def load_block(folder, layer, **kw):
    """The FFN of one layer as the checkpoint has it: the MoE block of a sparse layer, else the MLP."""
    return (load_moe if read_config(folder).is_moe_layer(layer) else load_mlp)(folder, layer, **kw)


def load_ffn(folder, layer, *, dtype=None, backend="auto", recompute="none", quant=None):
    """The :class:`~ms_swiglu.ffn.FFNBlock` of one layer: ``post_attention_layernorm.weight`` + its FFN (from a
    checkpoint folder only: converted files hold no norm)."""
    if is_converted(folder):
        raise CheckpointError(f"checkpoint: expected a HuggingFace checkpoint folder for FFN blocks (their "
                              f"post_attention_layernorm), got the converted file {folder}; export --layer N")
    config = read_config(folder)
    mlp = load_block(folder, layer, dtype=dtype, backend=backend, quant=quant)
    block = FFNBlock(config.hidden_size, config.intermediate_size, eps=config.rms_norm_eps,
                     dtype=param_dtype(mlp), mlp=mlp, recompute=recompute)
    norm, _ = read_float(SafetensorsFolder(folder), f"model.layers.{layer}.post_attention_layernorm.weight",
                         (config.hidden_size,))
    load_weights(block.post_attention_layernorm, {"weight": norm})
    return block
