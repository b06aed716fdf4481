"""Reading a MindIR back: the operator types it holds, without loading it into MindSpore."""
import collections
import re

from mindspore.train import mind_ir_pb2

_REF = re.compile(r"^(?:REF::)?(?P<name>[^:]+)(?::\d+)?$")


def _nodes(path):
    """The operator type of every node of a MindIR (main graph and sub-graphs), ``Constant`` nodes left out."""
    model = mind_ir_pb2.ModelProto()
    with open(path, "rb") as f:
        data = f.read()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # protobuf raises its own DecodeError
        raise ValueError(f"{path}: expected a MindIR protobuf, got undecodable data ({exc})") from None
    for graph in [model.graph, *model.functions]:
        for node in graph.node:
            m = _REF.match(node.op_type)
            name = m.group("name") if m else node.op_type
            if name != "Constant":
                yield name


def op_counts(path):
    """``{op type: number of nodes}`` of a MindIR: how large its graph is, op by op."""
    return dict(collections.Counter(_nodes(path)))


def op_types(path):
    """Sorted operator types of every node in a MindIR (main graph and sub-graphs), e.g. ``['MatMul', 'Swiglu']``.

    MindIR names primitive nodes ``REF::<Type>:<n>``; graph-level ``Constant`` nodes are not operators and
    are left out.
    """
    return sorted(set(_nodes(path)))


def graph_io(path):
    """``{"inputs": [{"name", "shape"}], "outputs": [...]}`` of a MindIR's main graph; -1 marks a dynamic dim."""
    model = mind_ir_pb2.ModelProto()
    with open(path, "rb") as f:
        model.ParseFromString(f.read())

    def describe(values):
        return [{"name": v.name, "shape": list(v.tensor[0].dims) if v.tensor else None} for v in values]

    return {"inputs": describe(model.graph.input), "outputs": describe(model.graph.output)}
