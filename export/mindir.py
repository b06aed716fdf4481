"""Reading a MindIR back: the operator types it holds, without loading it into MindSpore."""
import collections

from mindspore.train import mind_ir_pb2

from ms_swiglu.errors import InputError

def _model(path):
    """The MindIR at ``path`` as its protobuf ``ModelProto``."""
    model = mind_ir_pb2.ModelProto()
    with open(path, "rb") as f:
        data = f.read()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # protobuf raises its own DecodeError
        raise InputError(f"{path}: expected a MindIR protobuf, got undecodable data ({exc})") from None
    return model


def _nodes(path):
    """The operator type of every node of a MindIR (main graph and sub-graphs), ``Constant`` nodes left out.

    MindIR names primitive nodes ``REF::<Type>:<n>``; a node that calls a sub-graph (the branch a ``Switch``
    chose) is ``REF::<graph>:<node>:<n>`` and is reported as ``Call``."""
    model = _model(path)
    graphs = [model.graph, *model.functions]
    names = {g.name for g in graphs}
    for graph in graphs:
        for node in graph.node:
            name = node.op_type.removeprefix("REF::").split(":")[0]
            if name in names:
                yield "Call"
            elif name != "Constant":
                yield name


def op_counts(path):
    """``{op type: number of nodes}`` of a MindIR: how large its graph is, op by op."""
    return dict(collections.Counter(_nodes(path)))


def op_types(path):
    """Sorted operator types of every node in a MindIR (main graph and sub-graphs), e.g. ``['MatMul', 'Swiglu']``.

    Graph-level ``Constant`` nodes are not operators and are left out.
    """
    return sorted(set(_nodes(path)))


def graph_io(path):
    """``{"inputs": [{"name", "shape"}], "outputs": [...]}`` of a MindIR's main graph; -1 marks a dynamic dim."""
    model = _model(path)

    def describe(values):
        return [{"name": v.name, "shape": list(v.tensor[0].dims) if v.tensor else None} for v in values]

    return {"inputs": describe(model.graph.input), "outputs": describe(model.graph.output)}


def rename_input(path, names):
    """Rename the main graph's inputs of the MindIR at ``path`` to ``names`` (one name each), in place."""
    model = _model(path)
    names = [names] if isinstance(names, str) else list(names)
    renamed = {model.graph.input[i].name: name for i, name in enumerate(names)}
    for graph in [model.graph, *model.functions]:
        for node in graph.node:
            for i, value in enumerate(node.input):
                if value in renamed:
                    node.input[i] = renamed[value]
    for i, name in enumerate(names):
        model.graph.input[i].name = name
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def set_user_info(path, key, value):
    """Set ``user_info[key]`` (a string) of the MindIR at ``path``, in place: MindSpore's own field for what a
    model file carries about itself (``mindspore.export``'s ``custom_func`` writes it too)."""
    model = _model(path)
    model.user_info[key] = value
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def user_info(path):
    """``{key: value}`` of a MindIR's ``user_info``."""
    return dict(_model(path).user_info)


def collectives(path):
    """``[{"op", "group", "rank_size"}]`` of a MindIR's communication primitives (AllReduce, AllGather, ...),
    ``rank_size`` None where the primitive records none."""
    out = []
    for p in _model(path).primitives:
        attrs = {a.name: a for a in p.attribute}
        if "group" in attrs:
            out.append({"op": p.op_type, "group": attrs["group"].s.decode(),
                        "rank_size": attrs["rank_size"].i if "rank_size" in attrs else None})
    return out


def rename_group(path, old, new):
    """Name the communication group ``old`` of every collective in the MindIR at ``path`` ``new``, in place."""
    model = _model(path)
    for p in model.primitives:
        for a in p.attribute:
            if a.name == "group" and a.s == old.encode():
                a.s = new.encode()
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


# MindIR types of stored weight formats -> MindSpore's names of them
QUANTIZED_TYPES = {mind_ir_pb2.TensorProto.INT8: "Int8", mind_ir_pb2.TensorProto.UINT8: "UInt8",
                   mind_ir_pb2.TensorProto.QINT4X2: "Int4"}


def quantized_parameters(path):
    """``{name: (MindSpore type name, dims)}`` of a MindIR's weights stored in a quantized format's containers
    (int8; int4 packed as uint8 bytes, or as Ascend's qint4x2, MindIR type 18, its dims the packed ones)."""
    return {p.name: (QUANTIZED_TYPES[p.data_type], list(p.dims)) for p in _model(path).graph.parameter
            if p.data_type in QUANTIZED_TYPES}


def parameters(path):
    """``{name: float32 array}`` of a MindIR's weights stored inside it (float32, float16, bfloat16; names as
    MindSpore gives them, e.g. ``<graph>:gate_up_proj.weight``), without loading it into MindSpore."""
    import numpy as np  # noqa: PLC0415

    model = _model(path)
    kinds = {mind_ir_pb2.TensorProto.FLOAT: np.float32, mind_ir_pb2.TensorProto.FLOAT16: np.float16,
             mind_ir_pb2.TensorProto.BFLOAT16: np.uint16}
    out = {}
    for p in model.graph.parameter:
        if p.data_type not in kinds or not p.raw_data:
            continue
        a = np.frombuffer(p.raw_data, kinds[p.data_type]).reshape(list(p.dims))
        if p.data_type == mind_ir_pb2.TensorProto.BFLOAT16:
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[p.name] = a.astype(np.float32)
    return out


GEMMS = ("MatMul", "BatchMatMul", "GroupedMatmul")


def _dims(attribute):
    """The dims of a node's (first) output from its ``shape`` attribute (a tensor, or a tuple of them)."""
    tensors = attribute.tensors or [t for v in attribute.values for t in v.tensors]
    return list(tensors[0].dims) if tensors else None


def gemm_flops(path):
    """``{op type: FLOPs per token}`` of the GEMMs (:data:`GEMMS`) of a static-shape MindIR, from its nodes'
    shapes: 2 x the output's elements x the contracted length (the first input's elements over the output's rows:
    either layout of it), divided by the tokens of the graph's input [..., H]. GroupedMatmul counts each of its
    rows once, against its own group's weight."""
    import math  # noqa: PLC0415

    model = _model(path)
    graphs = [model.graph, *model.functions]
    shapes = {v.name: list(v.tensor[0].dims) for g in graphs for v in g.input if v.tensor}
    shapes.update({p.name: list(p.dims) for g in graphs for p in g.parameter})
    for graph in graphs:
        for node in graph.node:
            shape = next((_dims(a) for a in node.attribute if a.name == "shape"), None)
            if shape is not None:
                shapes.update({out: shape for out in node.output})
    x = list(model.graph.input[0].tensor[0].dims)
    if any(d < 0 for d in x):
        raise InputError(f"{path}: expected a static-shape MindIR to count FLOPs per token, got input {x}")
    tokens, flops = math.prod(x[:-1]), {}
    for graph in graphs:
        for node in graph.node:
            op = node.op_type.removeprefix("REF::").split(":")[0]
            if op not in GEMMS:
                continue
            out = next(_dims(a) for a in node.attribute if a.name == "shape")
            contracted = math.prod(shapes[node.input[0]]) // math.prod(out[:-1])
            flops[op] = flops.get(op, 0) + 2 * math.prod(out) * contracted / tokens
    return flops
