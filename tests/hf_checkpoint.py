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


def make_checkpoint(folder, *, model_type="llama", hidden=32, inter=48, layers=2, dtype="float32", shards=1,
                    experts=0, top_k=2, seed=0):
    """Writes the folder; returns {name: float32 array of the stored values} for the reference."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": model_type, "hidden_size": hidden,
              "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": 4,
              "rms_norm_eps": 1e-5, "torch_dtype": dtype, "vocab_size": 64}
    if experts:
        config.update(num_local_experts=experts, num_experts_per_tok=top_k, architectures=["MixtralForCausalLM"])
    tensors = {"model.embed_tokens.weight": (64, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({p + "self_attn.q_proj.weight": (hidden, hidden), p + "input_layernorm.weight": (hidden,),
                        p + "post_attention_layernorm.weight": (hidden,)})
        if experts:
            tensors[p + "block_sparse_moe.gate.weight"] = (experts, hidden)
            for e in range(experts):
                q = f"{p}block_sparse_moe.experts.{e}."
                tensors.update({q + "w1.weight": (inter, hidden), q + "w3.weight": (inter, hidden),
                                q + "w2.weight": (hidden, inter)})
        else:
            tensors.update({p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                            p + "mlp.down_proj.weight": (hidden, inter)})
    stored, entries = {}, {}
    for name, shape in tensors.items():
        data, stored[name] = _encode(rng.standard_normal(shape) / np.sqrt(shape[-1]), dtype)
        entries[name] = (TensorSpec(dtype=dtype, shape=list(shape), data_ptr=data.ctypes.data,
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
