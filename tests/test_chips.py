"""Ascend chips: the backend `auto` picks and the dtypes each family takes, with the SoC faked (no NPU here)."""
import mindspore as ms
import numpy as np
import pytest

from ms_swiglu import PackedSwiGLUMLP, backends
from ms_swiglu.backends import chips
from ms_swiglu.config import to_dtype

# MindSpore's normalised SoC versions (MSContext.get_ascend_soc_version) -> (auto backend, bfloat16 allowed)
TABLE = {
    "ascend910b": ("ascend", True),  # Atlas A2 (910B1..B4)
    "ascend910_93": ("ascend", True),  # Atlas A3
    "ascend310p": ("ascend", False),  # Atlas inference series: aclnnSwiGlu in float16/float32, no bf16
    "ascend910": ("composite", False),  # Atlas training series (910A): no Swiglu, no bf16
    "ascend310b": ("composite", False),  # Atlas 200I/500 A2
    "ascend999x": ("composite", False),  # unknown: nothing assumed
}


@pytest.mark.parametrize("soc", list(TABLE))
def test_auto_backend_and_bfloat16_per_chip(soc, monkeypatch):
    want_backend, bf16 = TABLE[soc]
    chip = chips.chip_of(soc)
    monkeypatch.setattr(chips, "current", lambda: chip)
    if want_backend == "composite":
        with pytest.warns(RuntimeWarning, match="documents the builtin Swiglu for atlas-a2, atlas-a3, atlas-310p only; "
                                                "using the composite backend"):
            assert backends.resolve("auto").name == "composite"
    else:
        assert backends.resolve("auto").name == "ascend"
    assert to_dtype("float16") == ms.float16
    if bf16:
        assert to_dtype("bfloat16") == ms.bfloat16
    else:
        with pytest.raises(ValueError, match=r"dtype: expected float32 or float16 on .* \(it has no bfloat16\), got bfloat16"):
            to_dtype("bfloat16")
        with pytest.raises(ValueError, match="has no bfloat16"):
            PackedSwiGLUMLP(16, 24, dtype=ms.bfloat16, backend="composite")


def test_off_ascend_auto_is_cpu_and_every_dtype_builds():
    assert chips.current() is None  # MindSpore's device target here is CPU
    assert chips.auto_backend(None) == "cpu" and backends.resolve("auto").name == "cpu"
    assert to_dtype("bfloat16") == ms.bfloat16


def test_chip_keys_and_families_are_one_table():
    assert [c.key for c in chips.CHIPS] == list(chips.BY_KEY) and chips.DEFAULT.name == "Atlas A2"
    assert {c.soc_family for c in chips.CHIPS} == set(chips.BY_FAMILY)
    assert [c.name for c in chips.CHIPS if c.swiglu] == ["Atlas A2", "Atlas A3", "Atlas inference series (310P)"]
    assert [c.name for c in chips.CHIPS if c.bfloat16] == ["Atlas A2", "Atlas A3"]


def test_no_token_never_reaches_the_ascend_kernel():
    """A static [0, H] input returns [0, H] without the Swiglu kernel (which has no CPU kernel: calling it would
    fail here); the MLP around it runs on the CPU's MatMul."""
    ms.set_context(mode=ms.GRAPH_MODE)
    for shape in ((0, 16), (2, 0, 16)):
        y = PackedSwiGLUMLP(16, 24, backend="ascend")(ms.Tensor(np.ones(shape, np.float32)))
        assert y.shape == shape
