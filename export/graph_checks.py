"""The checks of an exported graph, before its kit is put in place: ``check_graph`` is the one entry point.

The MindIR is straight-line, holds the ops that mark its backend and none of another's (only the backend's
allowed ops where it lists them), holds quantized weights in their containers where the network has them
(multiplied by the quantized matmuls on ``ascend``), and its ops are those the target's documents and the installed wheel give
for the chip: the support table for ``ascend``, a GE adapter for every op of a ``ge`` graph.
"""
from ms_swiglu import backends
from ms_swiglu.backends import ascend_support
from ms_swiglu.export.errors import ExportError, VerificationError
from ms_swiglu.export.mindir import op_types, quantized_parameters


def check_graph(path, net, target, backend_name, chip, dtype, allowed=frozenset()):
    """The op types of the MindIR at ``path`` (``net`` exported for ``target`` on the backend ``backend_name``),
    after every check above; ExportError for what the request asked that the chip or target cannot take,
    VerificationError for a graph the package should not have made."""
    found = op_types(path)
    _check_ops(found, target, backend_name, allowed)
    _check_quantized(net, path, found, target)
    if target == "ascend":
        why = ascend_support.refusal(found, chip.key, dtype)
        if why:
            raise ExportError(f"--target ascend --chip {chip.key}: {why}; export --target portable for it")
    if target == "ge":
        _check_ge(found, chip)
    return found


# Control flow in a MindIR: a branch (Switch, SwitchLayer), a sub-graph bound or called (Partial, Call), a loop
CONTROL_FLOW = frozenset({"Switch", "SwitchLayer", "Partial", "Call", "While"})


def _check_ops(found, target, backend_name, extra=frozenset()):
    """The exported graph is straight-line, holds the op types that mark its backend, none that mark another
    backend, and only the backend's allowed op types (and ``extra``: an expert-parallel rank's) when it has such
    a list."""
    flow = sorted(CONTROL_FLOW & set(found))
    if flow:
        raise VerificationError(f"export --target {target}: expected a straight-line graph, got control flow "
                                f"{', '.join(flow)} in op types {found}")
    backend = backends.get(backend_name)
    owners = {}  # op type -> the backends it marks
    for name in backends.REGISTRY:
        for op in backends.get(name).facts.graph_ops:
            owners.setdefault(op, set()).add(name)
    facts = backend.facts
    missing = sorted(facts.graph_ops - set(found))
    foreign = sorted(op for op in found if op in owners and op not in facts.graph_ops)
    allowed = None if facts.allowed_ops is None else facts.allowed_ops | extra
    extra = sorted(set(found) - allowed) if allowed is not None else []
    where = f"export --target {target}"
    if foreign:
        marked = ", ".join(sorted(set().union(*(owners[op] for op in foreign))))
        raise ExportError(f"{where}: expected no {', '.join(foreign)} op (it marks the {marked} backend), got op "
                          f"types {found}")
    if missing:
        raise ExportError(f"{where}: expected the {', '.join(missing)} op of the {backend.name} backend, got op types "
                          f"{found}")
    if extra:
        raise ExportError(f"{where}: expected only ops of {sorted(allowed)}, got {extra}")


# what takes quantized weights in an ascend graph: the dense projections, the grouped experts
QUANT_OPS = ("WeightQuantBatchMatmul", "QuantBatchMatmul", "GroupedMatmulV4")


def _check_quantized(net, mindir, found, target):
    """A quantized network's MindIR holds its weights in their format's containers (int8, int4; not dequantized at
    export), and its ascend graph multiplies them with the quantized matmuls."""
    import mindspore as ms  # noqa: PLC0415

    kinds = (ms.int8, ms.uint8, ms.qint4x2)
    want = sorted((str(p.dtype), list(p.shape)) for _, p in net.parameters_and_names() if p.dtype in kinds)
    got = sorted(quantized_parameters(mindir).values())
    if [(t, d) for t, d in want] != [(t, d) for t, d in got]:
        raise VerificationError(f"export: expected quantized weights {want} in the MindIR, got {got}")
    if want and target == "ascend" and not set(QUANT_OPS) & set(found):
        raise VerificationError(f"export --target ascend: expected {' or '.join(QUANT_OPS)} for the quantized "
                                f"weights, got op types {found}")


def _check_ge(found, chip):
    """A ``ge`` graph: every op has a GE adapter in the installed wheel, and its MoE ops are documented for
    ``chip``."""
    if ascend_support.ge_adapters() is None:
        raise ExportError(f"--target ge: expected MindSpore's GE adapter library ({ascend_support.GE_ADAPTERS} in the "
                          f"mindspore package) to check the graph against, got none")
    missing = ascend_support.paths(found)["ge"]["missing"]
    if missing:
        raise VerificationError(f"export --target ge: expected only ops with a GE adapter in MindSpore's "
                                f"{ascend_support.GE_ADAPTERS}, got {', '.join(missing)}")
    why = ascend_support.ge_refusal(found, chip.key)
    if why:
        raise ExportError(f"--target ge --chip {chip.key}: {why}; export --target portable for it")
