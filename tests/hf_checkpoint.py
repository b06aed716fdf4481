"""Builds checkpoint folders in the exact layout HuggingFace's save_pretrained writes (safetensors, HF names,
config.json, optionally sharded with model.safetensors.index.json), independently of the package's writer."""
import json
import os

import numpy as np
from safetensors import TensorSpec, serialize_file


def _encode(a, dtype):
    """(raw array to write, float32 values as stored); bfloat16 is truncated from float32 (exactly representable)."""
    if dtype == "bfloat16":
        bits = (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return bits, (bits.astype(np.uint32) << 16).view(np.float32)
    stored = np.ascontiguousarray(a, dtype)
    return stored, stored.astype(np.float32)


# HF's checkpoint names of the MoE families (modeling_*.py, per-expert layout as on the Hub):
# (block prefix, expert key with {e} and {part}, (gate, up, down) part names, shared expert prefix, routed
# experts' config key)
MOE_LAYOUT = {
    "mixtral": ("block_sparse_moe.", "experts.{e}.{part}.weight", ("w1", "w3", "w2"), None, "num_local_experts"),
    "qwen2_moe": ("mlp.", "experts.{e}.{part}_proj.weight", ("gate", "up", "down"), "shared_expert.", "num_experts"),
    "qwen3_moe": ("mlp.", "experts.{e}.{part}_proj.weight", ("gate", "up", "down"), None, "num_experts"),
    "deepseek_v3": ("mlp.", "experts.{e}.{part}_proj.weight", ("gate", "up", "down"), "shared_experts.",
                    "n_routed_experts"),
}


# one MoE layer of each family, as make_checkpoint arguments (DeepSeek-V3: a dense layer 0 first), and its index
MOE_LAYER = {"mixtral": 0, "qwen2_moe": 0, "qwen3_moe": 0, "deepseek_v3": 1}


def moe_families(inter, n_group):
    """{family: make_checkpoint arguments} of one MoE layer of every family with expert size ``inter`` (Mixtral's
    intermediate size), Qwen2-MoE's gated shared expert of 16, DeepSeek-V3's ``n_group`` groups (half of them
    kept), a shared expert, sigmoid scores scaled by 2.5."""
    return {
        "mixtral": dict(layers=1, inter=inter),
        "qwen2_moe": dict(layers=1, moe_inter=inter, shared_inter=16,
                          config_extra={"shared_expert_intermediate_size": 16, "norm_topk_prob": False}),
        "qwen3_moe": dict(layers=1, moe_inter=inter, config_extra={"norm_topk_prob": True}),
        "deepseek_v3": dict(layers=2, moe_inter=inter, shared_inter=inter, sparse=[1],
                            config_extra={"first_k_dense_replace": 1, "n_shared_experts": 1, "n_group": n_group,
                                          "topk_group": n_group // 2, "routed_scaling_factor": 2.5,
                                          "norm_topk_prob": True, "scoring_func": "sigmoid",
                                          "topk_method": "noaux_tc"}),
    }


def make_checkpoint(folder, *, model_type="llama", hidden=32, inter=48, layers=2, dtype="float32", shards=1,
                    experts=0, top_k=2, seed=0, moe_inter=None, shared_inter=0, sparse=None, config_extra=None):
    """Writes the folder; returns {name: float32 array of the stored values} for the reference.

    MoE families: `experts` experts of `moe_inter` (Mixtral: `inter`) in the layers `sparse` (default: all),
    dense MLPs of `inter` in the others; `config_extra` goes into config.json as it is (it must describe the
    same sparse layers). Qwen2-MoE and DeepSeek-V3 get a shared expert of `shared_inter` (Qwen2: gated).
    DeepSeek-V3's e_score_correction_bias is stored float32, as on the Hub."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": model_type, "hidden_size": hidden,
              "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": 4,
              "rms_norm_eps": 1e-5, "torch_dtype": dtype, "vocab_size": 64}
    moe = MOE_LAYOUT.get(model_type) if experts else None
    moe_inter = inter if model_type == "mixtral" else moe_inter
    sparse = set(range(layers) if sparse is None else sparse) if moe else set()
    if moe:
        config.update({moe[4]: experts, "num_experts_per_tok": top_k})
        if model_type != "mixtral":
            config["moe_intermediate_size"] = moe_inter
        config.update(config_extra or {})
    tensors = {"model.embed_tokens.weight": (64, hidden), "model.norm.weight": (hidden,)}
    float32 = set()
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({p + "self_attn.q_proj.weight": (hidden, hidden), p + "input_layernorm.weight": (hidden,),
                        p + "post_attention_layernorm.weight": (hidden,)})
        if i in sparse:
            block, expert, parts, shared, _ = moe
            q = p + block
            tensors[q + "gate.weight"] = (experts, hidden)
            for e in range(experts):
                tensors.update({q + expert.format(e=e, part=parts[0]): (moe_inter, hidden),
                                q + expert.format(e=e, part=parts[1]): (moe_inter, hidden),
                                q + expert.format(e=e, part=parts[2]): (hidden, moe_inter)})
            if shared and shared_inter:
                tensors.update({q + shared + "gate_proj.weight": (shared_inter, hidden),
                                q + shared + "up_proj.weight": (shared_inter, hidden),
                                q + shared + "down_proj.weight": (hidden, shared_inter)})
            if model_type == "qwen2_moe" and shared_inter:
                tensors[q + "shared_expert_gate.weight"] = (1, hidden)
            if model_type == "deepseek_v3":
                tensors[q + "gate.e_score_correction_bias"] = (experts,)
                float32.add(q + "gate.e_score_correction_bias")
        else:
            tensors.update({p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                            p + "mlp.down_proj.weight": (hidden, inter)})
    stored, entries = {}, {}
    for name, shape in tensors.items():
        kind = "float32" if name in float32 else dtype
        values = rng.standard_normal(shape) / np.sqrt(shape[-1]) if len(shape) > 1 else rng.standard_normal(shape) * 0.1
        data, stored[name] = _encode(values, kind)
        entries[name] = (TensorSpec(dtype=kind, shape=list(shape), data_ptr=data.ctypes.data,
                                    data_len=data.nbytes), data)  # data: kept alive for serialize_file
    names = list(entries)
    if shards == 1:
        serialize_file({n: e[0] for n, e in entries.items()}, os.path.join(folder, "model.safetensors"),
                       metadata={"format": "pt"})
    else:
        weight_map = {}
        for s, part in enumerate(np.array_split(np.arange(len(names)), shards)):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            serialize_file({names[i]: entries[names[i]][0] for i in part}, os.path.join(folder, fname),
                           metadata={"format": "pt"})
            weight_map.update({names[i]: fname for i in part})
        total = sum(e[1].nbytes for e in entries.values())
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return stored


def to_fp8(src, dst, block=(128, 128), skip=()):
    """The checkpoint folder ``src`` (float32, single file) rewritten to ``dst`` as DeepSeek publishes FP8: every
    ``*_proj.weight`` and expert weight ``float8_e4m3fn`` (encoded by ml_dtypes, round to nearest even) with a
    float32 ``weight_scale_inv`` per ``block`` (amax / 448), the rest (router, its bias, norms, names in ``skip``)
    as they were, and config.json's quantization_config. Returns {name: float32 values the weights stand for},
    dequantized here by ml_dtypes: the reference."""
    import ml_dtypes  # noqa: PLC0415
    from safetensors.numpy import load_file  # noqa: PLC0415

    tensors = load_file(os.path.join(src, "model.safetensors"))
    os.makedirs(dst, exist_ok=True)
    entries, values = {}, {}
    for name, w in tensors.items():
        fp8 = name.endswith("_proj.weight") or (".experts." in name and name.endswith(".weight"))
        if not fp8 or name in skip:
            entries[name], values[name] = ("float32", np.ascontiguousarray(w, np.float32)), w
            continue
        rows, cols = -(-w.shape[0] // block[0]), -(-w.shape[1] // block[1])
        scale = np.ones((rows, cols), np.float32)
        for i in range(rows):
            for j in range(cols):
                b = w[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]
                scale[i, j] = max(np.abs(b).max() / 448, 1e-12)
        full = np.repeat(np.repeat(scale, block[0], 0), block[1], 1)[:w.shape[0], :w.shape[1]]
        q = (w / full).astype(ml_dtypes.float8_e4m3fn)
        entries[name] = ("float8_e4m3fn", q.view(np.uint8))
        entries[name + "_scale_inv"] = ("float32", scale)
        values[name] = q.astype(np.float32) * full
    specs = {n: TensorSpec(dtype=d, shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
             for n, (d, a) in entries.items()}
    serialize_file(specs, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config.update(torch_dtype="bfloat16", quantization_config={
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(block)})
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return values
