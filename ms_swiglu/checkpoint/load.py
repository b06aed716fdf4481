"""The Cells of one checkpoint layer, built and filled from a HuggingFace checkpoint folder (packed at load;
with ``tp_size`` > 1, rank ``rank``'s part, read as such from the checkpoint) or from the files ``ms-swiglu
convert`` wrote (packed, and quantized if they are). ``checkpoint``: a path, or what
:func:`~ms_swiglu.checkpoint.source.open_checkpoint` returned (its config is read once).

``dtype``: the compute dtype; ``None`` keeps the checkpoint's. ``quant`` ("int8", "int8-g128") quantizes a float
checkpoint's projections at load (weight-only, ``ms_swiglu.quant``); a quantized file loads quantized.
"""
from ms_swiglu.checkpoint.files import CheckpointError
from ms_swiglu.checkpoint.hf import read_float
from ms_swiglu.checkpoint.source import open_checkpoint
from ms_swiglu.ffn import FFNBlock
from ms_swiglu.initial import empty_weights
from ms_swiglu.layout import ParallelLayout
from ms_swiglu.mlp import PackedSwiGLUMLP, load_weights, param_dtype
from ms_swiglu.moe import PackedMoE
from ms_swiglu.schema import PART_SUFFIXES, layer_tensors


def _open(checkpoint, layer, moe):
    """(the open checkpoint, its config) once ``layer`` is checked to be of the kind asked."""
    ckpt = open_checkpoint(checkpoint)
    config = ckpt.config
    config.check_layer(layer)
    if config.is_moe_layer(layer) != moe:
        got, use = ("a mixture-of-experts", "load_moe") if config.is_moe_layer(layer) else ("a dense", "load_mlp")
        raise CheckpointError(f"layer {layer}: expected a {'mixture-of-experts' if moe else 'dense'} layer, got "
                              f"{got} layer of {config.model_type!r}; use {use}")
    return ckpt, config


def layer_state(config, layer, tensors):
    """``{Cell parameter name: array}`` of a layer's ``{kind: array}`` (the schema's names), as the format stores
    them (``load_weights(..., stored=True)`` converts them to the form the Cell's ops hold)."""
    state = {}
    for spec in layer_tensors(config, layer):
        if spec.kind in tensors:
            state[spec.param] = tensors[spec.kind]
        for suffix in PART_SUFFIXES:  # the format's other parts
            if spec.kind + suffix in tensors:
                state[spec.param + suffix] = tensors[spec.kind + suffix]
    return state


def load_mlp(checkpoint, layer, *, dtype=None, backend="auto", tp_size=1, rank=0, quant=None, ep_size=1):
    """The :class:`~ms_swiglu.mlp.PackedSwiGLUMLP` of one dense layer (whole on every expert-parallel rank)."""
    ckpt, config = _open(checkpoint, layer, moe=False)
    layout = ParallelLayout.of(rank, tp_size, ep_size)
    weights, ckpt_dtype, method = ckpt.layer(layer, layout, quant)
    with empty_weights():  # (whole on an expert-parallel rank: its layout's tensor-parallel part)
        mlp = PackedSwiGLUMLP(config.hidden_size, config.intermediate_size, dtype=dtype or ckpt_dtype,
                              backend=backend, quant=method, layout=ParallelLayout(layout.tp_size, layout.tp_rank))
    return load_weights(mlp, layer_state(config, layer, weights), stored=True)


def load_moe(checkpoint, layer, *, dtype=None, backend="auto", tp_size=1, rank=0, quant=None, ep_size=1,
             dispatch="replicated"):
    """The :class:`~ms_swiglu.moe.PackedMoE` of one MoE layer (experts packed [gate_e; up_e] and stacked); with
    ``ep_size`` K > 1, rank ``rank``'s E/K routed experts, its tokens ``dispatch``-ed (``ms_swiglu.parallel``)."""
    ckpt, config = _open(checkpoint, layer, moe=True)
    layout = ParallelLayout.of(rank, tp_size, ep_size)
    weights, ckpt_dtype, method = ckpt.layer(layer, layout, quant)
    m = config.moe
    with empty_weights():
        moe = PackedMoE(config.hidden_size, m.intermediate_size, m.num_experts, m.top_k, dtype=dtype or ckpt_dtype,
                        backend=backend, quant=method, layout=layout, dispatch=dispatch, **m.block_kwargs())
    return load_weights(moe, layer_state(config, layer, weights), stored=True)


def load_block(checkpoint, layer, *, dispatch="replicated", **kw):
    """The FFN of one layer as the checkpoint has it: the MoE block of a sparse layer, else the MLP."""
    ckpt = open_checkpoint(checkpoint)
    if ckpt.config.is_moe_layer(layer):
        return load_moe(ckpt, layer, dispatch=dispatch, **kw)
    return load_mlp(ckpt, layer, **kw)


def load_ffn(checkpoint, layer, *, dtype=None, backend="auto", recompute="none", quant=None):
    """The :class:`~ms_swiglu.ffn.FFNBlock` of one layer: ``post_attention_layernorm.weight`` + its FFN (from a
    checkpoint folder only: converted files hold no norm)."""
    ckpt = open_checkpoint(checkpoint)
    if ckpt.converted:
        raise CheckpointError(f"checkpoint: expected a HuggingFace checkpoint folder for FFN blocks (their "
                              f"post_attention_layernorm), got the converted file {ckpt.path}; export --layer N")
    config = ckpt.config
    mlp = load_block(ckpt, layer, dtype=dtype, backend=backend, quant=quant)
    block = FFNBlock(config.hidden_size, config.intermediate_size, eps=config.rms_norm_eps,
                     dtype=param_dtype(mlp), mlp=mlp, recompute=recompute)
    norm, _ = read_float(ckpt.shards, f"model.layers.{layer}.post_attention_layernorm.weight",
                         (config.hidden_size,))
    load_weights(block.post_attention_layernorm, {"weight": norm})
    return block
