"""The Cells of one checkpoint layer, built and filled from a HuggingFace checkpoint folder (packed at load;
with ``tp_size`` > 1, rank ``rank``'s part, read as such from the checkpoint).

``dtype``: the compute dtype; ``None`` keeps the checkpoint's.
"""
from ms_swiglu.checkpoint.files import SafetensorsFolder
from ms_swiglu.checkpoint.hf import load_dense_layer, load_moe_layer, read_config
from ms_swiglu.ffn import FFNBlock
from ms_swiglu.mlp import PackedSwiGLUMLP, load_weights, param_dtype
from ms_swiglu.moe import PackedMoE


def load_mlp(folder, layer, *, dtype=None, backend="auto", tp_size=1, rank=0):
    """The :class:`~ms_swiglu.mlp.PackedSwiGLUMLP` of one dense layer."""
    config = read_config(folder)
    weights, ckpt_dtype = load_dense_layer(folder, layer, config, tp_size, rank)
    mlp = PackedSwiGLUMLP(config.hidden_size, config.intermediate_size, dtype=dtype or ckpt_dtype, backend=backend,
                          tp_size=tp_size)
    return load_weights(mlp, {"gate_up_proj.weight": weights["gate_up"], "down_proj.weight": weights["down"]})


def moe_state(moe, weights):
    """``load_moe_layer``'s arrays as the parameters of ``moe`` (a :class:`~ms_swiglu.moe.PackedMoE`), in the
    layout its backend stores the experts in."""
    state = {"router.weight": weights["router"], "experts.gate_up_proj": moe.experts.layout(weights["gate_up"]),
             "experts.down_proj": moe.experts.layout(weights["down"])}
    names = {"bias": "router.e_score_correction_bias", "shared_gate_up": "shared_expert.gate_up_proj.weight",
             "shared_down": "shared_expert.down_proj.weight", "shared_gate": "shared_expert_gate.weight"}
    state.update({names[k]: w for k, w in weights.items() if k in names})
    return state


def load_moe(folder, layer, *, dtype=None, backend="auto", tp_size=1, rank=0):
    """The :class:`~ms_swiglu.moe.PackedMoE` of one MoE layer (experts packed [gate_e; up_e] and stacked)."""
    config = read_config(folder)
    weights, ckpt_dtype = load_moe_layer(folder, layer, config, tp_size, rank)
    m = config.moe
    moe = PackedMoE(config.hidden_size, m.intermediate_size, m.num_experts, m.top_k, dtype=dtype or ckpt_dtype,
                    backend=backend, tp_size=tp_size, **m.block_kwargs())
    return load_weights(moe, moe_state(moe, weights))


def load_block(folder, layer, **kw):
    """The FFN of one layer as the checkpoint has it: the MoE block of a sparse layer, else the MLP."""
    return (load_moe if read_config(folder).is_moe_layer(layer) else load_mlp)(folder, layer, **kw)


def load_ffn(folder, layer, *, dtype=None, backend="auto", recompute="none"):
    """The :class:`~ms_swiglu.ffn.FFNBlock` of one layer: ``post_attention_layernorm.weight`` + its FFN."""
    config = read_config(folder)
    mlp = load_block(folder, layer, dtype=dtype, backend=backend)
    block = FFNBlock(config.hidden_size, config.intermediate_size, eps=config.rms_norm_eps,
                     dtype=param_dtype(mlp), mlp=mlp, recompute=recompute)
    norm, _ = SafetensorsFolder(folder).read(f"model.layers.{layer}.post_attention_layernorm.weight",
                                             (config.hidden_size,))
    load_weights(block.post_attention_layernorm, {"weight": norm})
    return block
