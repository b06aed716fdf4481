"""The rounding chain of a network of this package's blocks, for the device acceptance criterion
(``verify_on_device.acceptance(dtype, **chain(net))``).

:func:`chain` counts, for a Cell made of :class:`~ms_swiglu.mlp.PackedSwiGLUMLP`, :class:`~ms_swiglu.moe.PackedMoE`,
:class:`~ms_swiglu.ffn.FFNBlock` and :class:`~ms_swiglu.ffn.FFNStack` (found by ``cells_and_names``; a block inside
another counted block is counted by its parent), the intermediate values a correct device rounds to the dtype
(``roundings``), the GEMMs whose float32 accumulation order is the device's own (``gemms``) and the largest GEMM
reduction length (``reduction``). Each rounding is an independent relative error of at most u of a value the
output depends on with a gain of about 1; branches that meet in an add (routed experts, shared expert, router)
are summed rather than taking the longest one: an upper bound, since each branch is only part of the output.

    PackedSwiGLUMLP     3 roundings (gate_up output, SwiGLU output, down output), 2 GEMMs, K = max(H, I/p);
                        quantized (``.quant``): its format's ``roundings`` per projection (weight-only: the
                        scale cast to the activation dtype, the dequantized weight rounded to it: +4; W8A8: the
                        per-token scale: +2) and, for int8 activations, one ``quantizer`` per projection
    PackedMoE           router: logits in the router weight's dtype: 1 rounding + 1 GEMM (softmax routers,
                        model dtype), DeepSeek-V3's float32 router 0 roundings + 1 GEMM (for a float32 model both
                        round to float32: 1); routed experts: 3 roundings + 2 GEMMs, +1 the routing weights cast
                        to the activation dtype (the ascend MoeTokenUnpermute takes them so), +1 the weighted
                        combine, quantized as a dense MLP; shared expert: its MLP's count, +1 the add; with Qwen2-MoE's
                        shared_expert_gate +2 (the gate logit in the dtype, the gated product) and +1 GEMM (K = H)
    FFNBlock            its MLP's count + 2 (the RMSNorm output, the residual add)
    int8 activations    ``quantizers``: where a rounded input crosses a rounding boundary of the int8 grid, the
                        device's value is one step s off the golden's (``verify_on_device.acceptance`` bounds
                        their effect with the measured ``peak`` of the inputs, ``export.golden``)
    FFNStack / others   the sum over the blocks

For float32 networks the roundings are float32's (the acceptance takes u of the dtype). The rules were checked
against ``tests/device_sim.py`` (a simulated correct device): see ``tests/test_acceptance.py``.
"""
from ms_swiglu import quant as formats
from ms_swiglu.ffn import FFNBlock, FFNStack
from ms_swiglu.mlp import PackedSwiGLUMLP
from ms_swiglu.moe import PackedMoE

BLOCKS = (FFNStack, FFNBlock, PackedMoE, PackedSwiGLUMLP)


def _mlp(mlp):
    local = mlp.intermediate_size // getattr(mlp, "tp_size", 1)  # (an FFNBlock's mlp may be the unpacked baseline)
    method = formats.get(getattr(mlp, "quant", None))
    out = {"roundings": 3 + 2 * method.roundings, "reduction": max(mlp.hidden_size, local), "gemms": 2}
    return _quantizers(out, method)


def _quantizers(count, method):
    """A count with its int8 activation quantizers (``quantizers``: one per projection of a W8A8 format)."""
    return {**count, "quantizers": count.get("quantizers", 0) + 2} if method.quantizes_activations else count


def _moe(moe):
    router = moe.router
    low = router.weight.dtype == moe.compute_dtype  # logits rounded to the model dtype (softmax routers)
    roundings, gemms = (1 if low else 0), 1
    local = moe.experts.unstore(tuple(moe.experts.gate_up_proj.shape))[-2] // 2
    reduction = max(moe.hidden_size, local)
    method = formats.get(moe.quant)
    roundings += 3 + 1 + 1 + 2 * method.roundings  # gate_up, SwiGLU, down; routing weights; combine; the format's
    gemms += 2
    out = _quantizers({}, method)
    if moe.shared_expert is not None:
        shared = _mlp(moe.shared_expert)
        roundings += shared["roundings"] + 1  # + the add
        gemms += shared["gemms"]
        reduction = max(reduction, shared["reduction"])
        out = _quantizers(out, formats.get(moe.shared_expert.quant))
        if moe.shared_expert_gate is not None:
            roundings += 2  # the gate logit in the dtype, the gated product
            gemms += 1
    return {"roundings": roundings, "reduction": reduction, "gemms": gemms, **out}


def _count(cell):
    if isinstance(cell, FFNStack):
        return _sum(_count(b) for b in cell.blocks)
    if isinstance(cell, FFNBlock):
        inner = _count(cell.mlp)
        return {**inner, "roundings": inner["roundings"] + 2}
    if isinstance(cell, PackedMoE):
        return _moe(cell)
    return _mlp(cell)


def _sum(counts):
    out = {"roundings": 0, "reduction": 0, "gemms": 0}
    for c in counts:
        out = {"roundings": out["roundings"] + c["roundings"], "reduction": max(out["reduction"], c["reduction"]),
               "gemms": out["gemms"] + c["gemms"],
               **({"quantizers": out.get("quantizers", 0) + c.get("quantizers", 0)}
                  if out.get("quantizers") or c.get("quantizers") else {})}
    return out


def chain(net):
    """``{"roundings": int, "reduction": int, "gemms": int}`` of ``net`` (a Cell made of this package's blocks);
    TypeError if it holds none."""
    if isinstance(net, BLOCKS):
        return _count(net)
    found = []  # the outermost blocks: a name under a block already found belongs to that block
    for name, cell in net.cells_and_names():
        if isinstance(cell, BLOCKS) and not any(name.startswith(f"{outer}.") for outer, _ in found):
            found.append((name, cell))
    if not found:
        raise TypeError(f"chain: expected a Cell made of PackedSwiGLUMLP / PackedMoE / FFNBlock / FFNStack blocks, "
                        f"got {type(net).__name__} with none")
    return _sum(_count(cell) for _, cell in found)


def output_chains(net):
    """The chain of each output of ``net``'s exported graph: the network's output, then, for an FFNStack that
    returns its branches, block l's MLP output, whose input carries the roundings of the blocks before it and of
    its RMSNorm."""
    whole = chain(net)
    if not (isinstance(net, FFNStack) and net.branch_outputs):
        return [whole]
    out, before = [whole], []
    for block in net.blocks:
        inner = _count(block.mlp)
        out.append(_sum(before + [{**inner, "roundings": inner["roundings"] + 1}]))  # + the RMSNorm output
        before.append(_count(block))
    return out
