"""The roofline inputs of an exported network, per golden case: the bytes one call must move between HBM and the
chip, and the GEMM operations its cube runs. The manifest holds them with the chip's per-model figures
(``ms_swiglu.backends.chips.MODELS``); ``verify_on_device.py`` predicts
``max((weight + activation bytes) / HBM bandwidth, FLOPs / cube peak of the dtype)`` and prints it beside the
measured time.

Bytes are the compulsory traffic, so the prediction is a floor: every weight the call reads, once, as stored
(int8 weights one byte, their scales in their own dtype), and the graph's input and output in the activation
dtype. Intermediates ([T, 2I], [T, I], a stack's hidden states) are not counted: they may stay in L2. FLOPs are
two per multiply-add of the GEMMs; RMSNorm, SwiGLU and the routing arithmetic run on the vector units and are left
out. T is the rows the graph gets; an int8- or int4-weight GEMM computes in the activation dtype (the weights
dequantized in the kernel), so its FLOPs count at the activation dtype's peak; W8A8's (``compute`` "int8") at the
int8 peak.

    PackedSwiGLUMLP   weights [2I/p, H] + [H, I/p]; 2 T H (2I/p) + 2 T (I/p) H = 6 T H I/p FLOPs
    PackedMoE         router: its weights, 2 T H E FLOPs. Routed experts, grouped (ascend, cpu: only the routed
                      rows): the experts the tokens reach, E_r (1 - (1 - k/E)^T) of a rank's E_r expected when
                      each token picks k of E uniformly (k for one token, all of them for many), 6 T k (E_r/E) H I
                      FLOPs; dense (portable: every expert on every token): all E_r experts, 6 T E_r H I. Shared
                      expert: as an MLP, its gate [1, H] and 2 T H. Sharded expert parallelism routes the K T
                      gathered rows
    FFNBlock          its MLP (or MoE) + the RMSNorm weight
    FFNStack          the sum over its blocks (the input and output counted once)
"""
from ms_swiglu import quant as formats
from ms_swiglu.backends import chips
from ms_swiglu.backends.matmul import DenseExperts
from ms_swiglu.ffn import FFNBlock, FFNStack
from ms_swiglu.mlp import PackedSwiGLUMLP
from ms_swiglu.moe import PackedMoE

RULE = "predicted = max((weight_bytes + activation_bytes) / HBM bandwidth, flops / cube peak of the dtype)"


def _bytes(cell):
    """Bytes of a Cell's parameters as stored."""
    return sum(int(p.nbytes) for _, p in cell.parameters_and_names())


def mlp(cell, tokens):
    """``{"weight_bytes", "flops"}`` of a :class:`PackedSwiGLUMLP` on ``tokens`` rows."""
    local = cell.intermediate_size // getattr(cell, "tp_size", 1)
    return {"weight_bytes": _bytes(cell), "flops": 6 * tokens * cell.hidden_size * local}


def reached(tokens, top_k, experts, local=None):
    """Expected distinct experts among ``local`` (default all ``experts``) that ``tokens`` tokens reach, each
    token picking ``top_k`` distinct experts of ``experts`` uniformly."""
    local = experts if local is None else local
    return local * (1 - (1 - top_k / experts) ** tokens) if tokens else 0.0


def moe(cell, tokens):
    """``{"weight_bytes", "flops", "experts_read"}`` of a :class:`PackedMoE` on ``tokens`` rows."""
    rows = tokens * getattr(cell.dispatch, "ep_size", 1) if cell.dispatch.own_tokens else tokens
    h, e, k = cell.hidden_size, cell.num_experts, cell.top_k
    local_experts = cell.experts.gate_up_proj.shape[0]  # E/K on an expert-parallel rank (stored E first)
    inter = cell.experts.unstore(tuple(cell.experts.gate_up_proj.shape))[-2] // 2  # I/p
    per_expert = _bytes(cell.experts) / local_experts
    if isinstance(cell.experts.op, DenseExperts):  # every expert on every row
        read, routed_rows = float(local_experts), rows * local_experts
    else:
        read, routed_rows = reached(rows, k, e, local_experts), rows * k * local_experts / e
    out = {"weight_bytes": _bytes(cell.router) + read * per_expert,
           "flops": 2 * rows * h * e + 6 * routed_rows * h * inter, "experts_read": read}
    if cell.shared_expert is not None:
        shared = mlp(cell.shared_expert, rows)
        out["weight_bytes"] += shared["weight_bytes"]
        out["flops"] += shared["flops"]
        if cell.shared_expert_gate is not None:
            out["weight_bytes"] += _bytes(cell.shared_expert_gate)
            out["flops"] += 2 * rows * h
    return out


def count(net, tokens):
    """``{"weight_bytes", "flops"[, "experts_read"]}`` of a network of this package's blocks on ``tokens`` rows
    (inputs and outputs not included: :func:`case`)."""
    if isinstance(net, FFNStack):
        parts = [count(b, tokens) for b in net.blocks]
        total = {"weight_bytes": sum(p["weight_bytes"] for p in parts), "flops": sum(p["flops"] for p in parts)}
        read = [p["experts_read"] for p in parts if "experts_read" in p]
        return dict(total, experts_read=sum(read)) if read else total
    if isinstance(net, FFNBlock):
        inner = count(net.mlp, tokens)
        return dict(inner, weight_bytes=inner["weight_bytes"] + _bytes(net.post_attention_layernorm))
    if isinstance(net, PackedMoE):
        return moe(net, tokens)
    if isinstance(net, PackedSwiGLUMLP):
        return mlp(net, tokens)
    raise TypeError(f"roofline: expected a PackedSwiGLUMLP, PackedMoE, FFNBlock or FFNStack, got {type(net).__name__}")


def case(net, tokens, hidden, itemsize):
    """The roofline inputs of one call on ``tokens`` rows of ``hidden`` values of ``itemsize`` bytes: integer
    bytes and FLOPs (expected values rounded). Activations: the input and every graph output (a stack that returns
    its blocks' branches writes 1 + L of them)."""
    c = count(net, tokens)
    outputs = getattr(net, "n_outputs", 1)
    entry = {"tokens": tokens, "weight_bytes": round(c["weight_bytes"]),
             "activation_bytes": (1 + outputs) * tokens * hidden * itemsize, "flops": round(c["flops"])}
    if "experts_read" in c:
        entry["experts_read"] = round(c["experts_read"], 3)
    if any(formats.get(getattr(b, "quant", None)).quantizes_activations for _, b in net.cells_and_names()):
        entry["compute"] = "int8"  # W8A8: its GEMMs at the int8 peak
    return entry


ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def manifest_entry(net, golden, chip, dtype):
    """The manifest's ``roofline``: each golden case's inputs (``golden``: the manifest's entries) and the
    figures of every model of ``chip``'s family (None: a kit for no Ascend chip)."""
    cases = [dict(case(net, g["tokens"], g["shape"][-1], ITEMSIZE[dtype]), case=g["case"]) for g in golden]
    return {"rule": RULE, "dtype": dtype, "cases": cases,
            "models": {m.soc: m.entry() for m in chips.models(chip.soc_family)} if chip is not None else {}}
