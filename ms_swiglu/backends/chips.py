"""Ascend chips: what each family can run, and which backend ``auto`` picks on it. No MindSpore import at load.

Sources (documents, not runs on an NPU):
- the SoC families: MindSpore's ``MSContext.get_ascend_soc_version()``, which maps ``aclrtGetSocName()`` to
  ``ascend910`` (Atlas training series, 910A), ``ascend910b`` (Atlas A2: 910B1-B4), ``ascend910_93`` (Atlas A3),
  ``ascend310p`` (Atlas inference series), ``ascend310b`` (Atlas 200I/500 A2), ``ascend950``;
- which chip runs ``Swiglu`` and in which dtypes: the ``ascend_support`` table (CANN's aclnnSwiGlu lists Atlas A2,
  A3 and the Atlas inference series (310P) without bfloat16; not the Atlas training series or 310B);
- bfloat16: Atlas A2/A3 only (Ascend C ``ToBfloat16``; aclnnMatmul: "Atlas 训练系列产品、Atlas 推理系列产品：不支持
  BFLOAT16").
"""
import dataclasses
import warnings

from ms_swiglu.backends.ascend_support import SUPPORT
from ms_swiglu.errors import InputError


@dataclasses.dataclass(frozen=True)
class Chip:
    """One Ascend family: its name, the SoC names it answers to, and what this package may run on it."""

    name: str
    key: str  # the exporter's --chip value
    soc_family: str  # MindSpore's normalised SoC version
    bfloat16: bool
    npu_smi_names: str  # how `npu-smi info` names it (the Name column), for the kit's scripts

    @property
    def swiglu(self):
        """The builtin Swiglu (the ascend backend) is documented for it, in some dtype."""
        return self.key in SUPPORT["Swiglu"].dtypes


CHIPS = (
    Chip("Atlas A2", "atlas-a2", "ascend910b", True, "910B1..910B4, 910B4-1"),
    Chip("Atlas A3", "atlas-a3", "ascend910_93", True, "Ascend910 (two chips per NPU)"),
    Chip("Atlas inference series (310P)", "atlas-310p", "ascend310p", False, "310P1..310P4"),
    Chip("Atlas training series (910A)", "atlas-910a", "ascend910", False, "910A, 910ProA, 910ProB, 910B"),
    Chip("Atlas 200I/500 A2 (310B)", "atlas-310b", "ascend310b", False, "310B1..310B4"),
)
BY_KEY = {c.key: c for c in CHIPS}
BY_FAMILY = {c.soc_family: c for c in CHIPS}
DEFAULT = BY_KEY["atlas-a2"]


def current():
    """The :class:`Chip` of the Ascend device MindSpore runs on, or None off Ascend."""
    import mindspore as ms  # noqa: PLC0415

    if ms.get_context("device_target") != "Ascend":
        return None
    # MindSpore's own normalised SoC version (private; mindformers' is_910b() reads the same)
    from mindspore._c_expression import MSContext  # noqa: PLC0415

    return chip_of(MSContext.get_instance().get_ascend_soc_version())


def chip_of(soc):
    """The :class:`Chip` of a normalised SoC version; an unknown one is a chip this package assumes nothing of."""
    if soc in BY_FAMILY:
        return BY_FAMILY[soc]
    return Chip(f"unknown Ascend SoC {soc!r}", soc, soc, False, "?")


def auto_backend(chip):
    """The backend ``auto`` means: ``cpu`` off Ascend (chip None); on Ascend ``ascend`` where CANN documents the
    builtin Swiglu for the chip (``ascend_support``), else ``composite`` (MindSpore ops every chip runs)."""
    if chip is None:
        return "cpu"
    if not chip.swiglu:
        warnings.warn(f"ms_swiglu: backend auto on {chip.name}: CANN documents the builtin Swiglu for "
                      f"{', '.join(SUPPORT['Swiglu'].dtypes)} only; using the composite backend", RuntimeWarning,
                      stacklevel=3)
        return "composite"
    return "ascend"


def check_dtype(dtype_name, chip):
    """ValueError for bfloat16 on a chip without it (chip None: not on Ascend, nothing to check)."""
    if chip is not None and dtype_name == "bfloat16" and not chip.bfloat16:
        raise InputError(f"dtype: expected float32 or float16 on {chip.name} (it has no bfloat16), got bfloat16")
