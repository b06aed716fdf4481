"""MindIR export and inspection for Ascend deployment (installed as ``ms_swiglu.export``)."""
from ms_swiglu.export.mindir import op_types

__all__ = ["op_types"]
