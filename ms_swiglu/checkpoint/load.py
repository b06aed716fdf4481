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


def load_moe(folder, layer, *, dtype=None, backend="auto", renormalize=True, tp_size=1, rank=0):
    """The :class:`~ms_swiglu.moe.PackedMoE` of one Mixtral layer (w1 -> gate, w3 -> up, packed at load)."""
    config = read_config(folder)
    weights, ckpt_dtype = load_moe_layer(folder, layer, config, tp_size, rank)
    moe = PackedMoE(config.hidden_size, config.intermediate_size, config.num_local_experts,
                    config.num_experts_per_tok, dtype=dtype or ckpt_dtype, backend=backend, renormalize=renormalize,
                    tp_size=tp_size)
    state = {"router.weight": weights["router"]}
    for e in range(config.num_local_experts):
        state[f"experts.{e}.gate_up_proj.weight"] = weights["gate_up"][e]
        state[f"experts.{e}.down_proj.weight"] = weights["down"][e]
    return load_weights(moe, state)


def load_block(folder, layer, **kw):
    """The FFN of one layer as it is in the checkpoint: the MoE block of a Mixtral layer, else the MLP."""
    return (load_moe if read_config(folder).is_moe else load_mlp)(folder, layer, **kw)


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
