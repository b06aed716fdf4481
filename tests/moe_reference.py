"""NumPy references of the MoE blocks, written from transformers' modelling code (shared by the MoE and export
tests): the routers of each family, the packed experts, the shared expert, rounding where the cpu kernels round."""
import numpy as np


def rnd(a, dtype):
    """Round float64 values to `dtype` and back (the points where the block rounds)."""
    if dtype == "float32":
        return a.astype(np.float32).astype(np.float64)
    if dtype == "float16":
        return a.astype(np.float16).astype(np.float64)
    u = a.astype(np.float32).view(np.uint32)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32).astype(np.float64)


def silu(a):
    return a / (1 + np.exp(-a))


def topk_first(v, k):
    """Top k per row, ties to the lower index (a stable sort of -v)."""
    idx = np.argsort(-v, axis=-1, kind="stable")[:, :k]
    return np.take_along_axis(v, idx, -1), idx


def ref_softmax_router(x, w, k, renormalize, dtype="float32"):
    """Mixtral / Qwen2-MoE / Qwen3-MoE: logits in the model dtype, softmax in float32 (here float64), top-k."""
    logits = rnd(x @ w.T, dtype)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    weights, idx = topk_first(p, k)
    return (weights / weights.sum(-1, keepdims=True) if renormalize else weights), idx


def ref_sigmoid_router(x, w, bias, k, n_group, topk_group, renormalize, scale):
    """DeepSeek-V3 (noaux_tc, transformers v5 / DeepSeek's fixed code: -inf for the other groups' experts)."""
    scores = 1 / (1 + np.exp(-(x @ w.T)))
    choice = scores + bias
    t, e = choice.shape
    groups = np.sort(choice.reshape(t, n_group, e // n_group), -1)[..., -2:].sum(-1)  # top-2 sum per group
    _, keep = topk_first(groups, topk_group)
    mask = np.zeros((t, n_group), bool)
    np.put_along_axis(mask, keep, True, -1)
    choice = np.where(np.repeat(mask, e // n_group, -1), choice, -np.inf)
    _, idx = topk_first(choice, k)
    weights = np.take_along_axis(scores, idx, -1)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
    return weights * scale, idx


def ref_mlp(x, gate_up, down, dtype):
    """One packed SwiGLU MLP as the cpu kernels round: the activation once, the output once."""
    inter = gate_up.shape[0] // 2
    h = x @ gate_up.T
    return rnd(rnd(silu(h[:, :inter]) * h[:, inter:], dtype) @ down.T, dtype)


def ref_block(x, p, dtype="float32"):
    """The whole block from its weights ``p`` (float64 arrays) and ``p["router"]`` settings."""
    if "bias" in p:
        weights, idx = ref_sigmoid_router(x, p["router"], p["bias"], p["k"], p["n_group"], p["topk_group"],
                                          p["renormalize"], p["scale"])
    else:
        weights, idx = ref_softmax_router(x, p["router"], p["k"], p["renormalize"], dtype)
    out = np.zeros_like(x)
    inter = p["gate_up"].shape[1] // 2
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = idx[t, j]
            h = x[t] @ p["gate_up"][e].T
            out[t] += weights[t, j] * (rnd(silu(h[:inter]) * h[inter:], dtype) @ p["down"][e].T)
    out = rnd(out, dtype)
    if "shared_gate_up" in p:
        shared = ref_mlp(x, p["shared_gate_up"], p["shared_down"], dtype)
        if "shared_gate" in p:
            shared = rnd(1 / (1 + np.exp(-rnd(x @ p["shared_gate"].T, dtype))) * shared, dtype)
        out = rnd(out + shared, dtype)
    return out, idx


def stored_params(family, stored, layer, k=2, n_group=4, topk_group=2, scale=2.5):
    """The block's weights straight from the stored HF tensors (an independent reading of the names)."""
    q = f"model.layers.{layer}." + ("block_sparse_moe." if family == "mixtral" else "mlp.")
    g, u, d = ("w1", "w3", "w2") if family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    f64 = {n: a.astype(np.float64) for n, a in stored.items()}
    experts = f64[q + "gate.weight"].shape[0]
    p = {"router": f64[q + "gate.weight"], "k": k,
         "gate_up": np.stack([np.concatenate([f64[f"{q}experts.{e}.{g}.weight"], f64[f"{q}experts.{e}.{u}.weight"]])
                              for e in range(experts)]),
         "down": np.stack([f64[f"{q}experts.{e}.{d}.weight"] for e in range(experts)]),
         "renormalize": family in ("mixtral", "qwen3_moe", "deepseek_v3")}
    shared = {"qwen2_moe": "shared_expert.", "deepseek_v3": "shared_experts."}.get(family)
    if shared:
        p["shared_gate_up"] = np.concatenate([f64[q + shared + "gate_proj.weight"], f64[q + shared + "up_proj.weight"]])
        p["shared_down"] = f64[q + shared + "down_proj.weight"]
    if family == "qwen2_moe":
        p["shared_gate"] = f64[q + "shared_expert_gate.weight"]
    if family == "deepseek_v3":
        p.update(bias=f64[q + "gate.e_score_correction_bias"], n_group=n_group, topk_group=topk_group, scale=scale)
    return p
