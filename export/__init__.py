"""MindIR export and inspection for Ascend deployment (installed as ``ms_swiglu.export``)."""
from ms_swiglu.export.mindir import graph_io, op_counts, op_types, parameters

__all__ = ["graph_io", "op_counts", "op_types", "parameters"]
