"""The acceptance of a kit at export: each graph output's criterion (``verify_on_device.acceptance`` of its
rounding chain, ``export.chain``), the golden files with the branches added into each output, the dtype twin held
to them, each branch's detection floor, and the facts the MindIR carries so that the kit's checker recomputes every
threshold from the graph itself. ``golden_files`` is the one entry point."""
import os

import numpy as np

from ms_swiglu.export.chain import output_chains
from ms_swiglu.export.errors import VerificationError
from ms_swiglu.export.golden import raw
from ms_swiglu.export.verify_on_device import acceptance, check, gain_fit


def golden_files(req, work, net, cases, twin, feed):
    """The golden cases into ``work``/golden, the twin checked against them; returns (the manifest's golden
    entries, the twin's results, the manifest's outputs (name, acceptance, branches with their floors), the facts
    for the MindIR)."""
    peak = max((c.peak for c in cases), default=0.0)  # int8 activations: their inputs' largest peak ratio
    chains = [dict(c, peak=peak) if c.get("quantizers") else c for c in output_chains(net)]
    outputs = [{"name": n, "chain": c, "acceptance": acceptance(req.dtype, **c),
                "branches": [{"name": b, "floor": [], "rms_fraction": []} for b in parts]}
               for (n, parts), c in zip(output_names(net, req.layers), chains)]
    golden, results = _write_golden(req, work, cases, twin, outputs, feed)
    facts = kit_facts(req.dtype, outputs, golden)
    return golden, results, [{k: o[k] for k in ("name", "acceptance", "branches")} for o in outputs], facts


def output_names(net, layers):
    """The names of the graph's outputs and of the branches added into each: [(output, [branch, ...])]."""
    from ms_swiglu.ffn import FFNStack  # noqa: PLC0415
    from ms_swiglu.moe import PackedMoE  # noqa: PLC0415

    def parts(block):
        if isinstance(block, PackedMoE):
            return ["routed experts", "shared expert"] if block.shared_expert is not None else ["experts"]
        return ["mlp"]

    if isinstance(net, FFNStack) and net.branch_outputs:
        blocks = [f"layer {layers[0] + i} mlp" for i in range(len(net.blocks))]
        return [("output", blocks)] + [(b, parts(blk.mlp)) for b, blk in zip(blocks, net.blocks)]
    return [("output", parts(net))]


def kit_facts(dtype, outputs, golden):
    """What the kit's acceptance is computed from, as its MindIR carries it (``verify_on_device.FACTS_KEY``): the
    dtype, each output's rounding chain and branches, each case's shape and the tokens it leaves out. The kit's
    checker recomputes every threshold from these and holds manifest.json to them."""
    return {"version": 1, "dtype": dtype,
            "outputs": [{"name": o["name"], "chain": o["chain"], "branches": [b["name"] for b in o["branches"]]}
                        for o in outputs],
            "cases": [{"shape": g["shape"], "excluded_tokens": g["excluded_tokens"],
                       "compared_tokens": g["compared_tokens"], **({"tokens_input": g["tokens_input"]}
                                                                  if "tokens_input" in g else {})} for g in golden]}


def _write_golden(req, work, cases, twin, outputs, feed):
    """The golden ``cases`` (``export.golden``) into ``work``/golden as ``feed`` (:class:`Feed`) gives them to the
    graph: inputs in the dtype (.bin) and as exact float32 values (.npy); per graph output its float32 golden
    (.npy, .bin) and the golden branches added into it (.npy [B, ..., H]), whose gain floors (``gain_fit``) the
    entry records. Returns (the manifest's golden entries, the dtype twin's result per case and output); a twin
    that fails the criterion is a bug (VerificationError). ``outputs`` get their branches' names and floors."""
    import mindspore as ms  # noqa: PLC0415

    golden_dir = os.path.join(work, "golden")
    os.mkdir(golden_dir)
    entries, results = [], []
    for case, gc in enumerate(cases):
        inputs = feed.inputs(gc.x)
        twin_inputs = [ms.Tensor(inputs[0]).astype(getattr(ms, req.dtype)), *map(ms.Tensor, inputs[1:])]
        got = twin(*twin_inputs)
        got = [g.astype(ms.float32).asnumpy() for g in (got if isinstance(got, (tuple, list)) else [got])]
        x_values, x_raw = raw(ms.Tensor(inputs[0]), req.dtype)
        tokens = int(np.prod(x_values.shape[:-1]))
        entry = {"case": case, "tokens": tokens, "shape": list(x_values.shape), **feed.case(inputs)}
        stem = os.path.join(golden_dir, f"input_{case}_t{tokens}")
        np.save(stem + ".npy", x_values)
        with open(stem + ".bin", "wb") as f:
            f.write(x_raw)
        entry["input"] = {"npy": os.path.relpath(stem + ".npy", work), "bin": os.path.relpath(stem + ".bin", work),
                          "bin_dtype": req.dtype, "npy_dtype": "float32"}
        entry["outputs"] = []
        for j, (o, y, branches) in enumerate(zip(outputs, gc.outputs, gc.branches)):
            y, excluded = feed.rows(y, gc.excluded)
            parts = np.stack([feed.rows(b, gc.excluded)[0] for b in branches])
            compared = int(np.prod(y.shape[:-1])) - len(excluded)
            entry["excluded_tokens"], entry["compared_tokens"] = excluded, compared
            if compared:  # (an expert-parallel rank without a token of this case: the others check it)
                result = check(got[j], y, o["acceptance"], excluded, parts)
                results.append(dict(result, case=case, output=o["name"]))
                if not result["ok"]:
                    raise VerificationError(f"export: expected the {req.dtype} computation to pass the acceptance "
                                            f"criterion against the float32 golden outputs, got {result}")
                keep = np.setdiff1d(np.arange(int(np.prod(y.shape[:-1]))), excluded)
                rms = float(np.sqrt(np.mean(y.reshape(-1, y.shape[-1])[keep].astype(np.float64) ** 2)))
                for b, fit, part in zip(o["branches"], gain_fit(y, parts, o["acceptance"], excluded), parts):
                    b["floor"].append(fit["floor"])
                    p = part.reshape(-1, part.shape[-1])[keep].astype(np.float64)
                    b["rms_fraction"].append(float(np.sqrt(np.mean(p * p))) / rms if rms else 0.0)
            stem = os.path.join(golden_dir, f"output_{case}_t{tokens}" + (f"_o{j}" if j else ""))
            np.save(stem + ".npy", y)
            with open(stem + ".bin", "wb") as f:
                f.write(np.ascontiguousarray(y, np.float32).tobytes())
            np.save(stem + "_branches.npy", parts.astype(np.float32))
            entry["outputs"].append({"name": o["name"], "npy": os.path.relpath(stem + ".npy", work),
                                     "bin": os.path.relpath(stem + ".bin", work), "bin_dtype": "float32",
                                     "branches": os.path.relpath(stem + "_branches.npy", work)})
        entries.append(entry)
    return entries, results
