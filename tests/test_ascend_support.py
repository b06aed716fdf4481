"""The Ascend support table (ms_swiglu.backends.ascend_support): docs/ascend.md is written from it, the exporter
refuses what it does not list, and the exporter's straight-line check sees control flow in a real MindIR."""
import importlib.util
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

from ms_swiglu.backends import ascend_support, chips
from ms_swiglu.export.mindir import op_types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _docs_tool():
    spec = importlib.util.spec_from_file_location("docs_tool", os.path.join(ROOT, "tools", "docs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_ascend_holds_the_table_the_code_has():
    with open(os.path.join(ROOT, "docs", "ascend.md")) as f:
        text = f.read()
    assert _docs_tool().ascend_doc(text) == text, "run python tools/docs.py"
    for row in ascend_support.table()[2:]:
        assert row in text


def test_refusals_and_paths_follow_the_table():
    dense, moe = ["MatMul", "Swiglu"], ["MatMul", "Swiglu", "MoeInitRoutingV2", "GroupedMatmulV4",
                                       "InnerMoeTokenUnpermute"]
    assert ascend_support.refusal(dense, "atlas-a2", "bfloat16") is None
    assert ascend_support.refusal(dense, "atlas-310p", "float16") is None
    assert "got Swiglu" in ascend_support.refusal(dense, "atlas-310p", "bfloat16")
    assert "got GroupedMatmulV4, MoeInitRoutingV2, InnerMoeTokenUnpermute" in ascend_support.refusal(
        moe, "atlas-310p", "float16")
    assert "got WeightQuantBatchMatmul" in ascend_support.refusal(["WeightQuantBatchMatmul"], "atlas-a2", "float32")
    assert ascend_support.paths(moe) == {
        "mindspore": {"evidence": True, "missing": []},
        "ge": {"evidence": False, "missing": ["Swiglu", "MoeInitRoutingV2", "GroupedMatmulV4",
                                              "InnerMoeTokenUnpermute"]}}
    assert ascend_support.paths(["WeightQuantBatchMatmul"])["ge"]["evidence"]
    assert [c.key for c in chips.CHIPS if c.swiglu] == list(ascend_support.SUPPORT["Swiglu"].dtypes)


class _Branch(nn.Cell):
    """A runtime branch on the number of tokens, as the ascend backend's zero-token guard was."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(8, 8)

    def construct(self, x):
        if ops.shape(x)[0] * 1 == 0:
            return ops.zeros_like(x)
        return self.dense(x)


def test_the_straight_line_check_sees_a_branch_in_a_real_mindir(tmp_path):
    from ms_swiglu.export import graph_checks

    ms.set_context(mode=ms.GRAPH_MODE)
    net = _Branch()
    net.set_inputs(ms.Tensor(shape=[None, 8], dtype=ms.float32))
    assert net(ms.Tensor(np.ones((2, 8), np.float32))).shape == (2, 8)
    ms.export(net, ms.Tensor(shape=[None, 8], dtype=ms.float32), file_name=str(tmp_path / "b"), file_format="MINDIR")
    found = op_types(str(tmp_path / "b.mindir"))
    assert graph_checks.CONTROL_FLOW & set(found), found
    with pytest.raises(graph_checks.VerificationError, match="expected a straight-line graph, got control flow"):
        graph_checks.check_graph(str(tmp_path / "b.mindir"), net, "portable", "composite", None, "float32")
