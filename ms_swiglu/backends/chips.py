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
from typing import Optional

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

# Per-model figures for the kit's roofline prediction. Source of every row: the CANN runtime's platform config of
# the SoC, the file CANN installs as <arch>-linux/data/platform_config/<SoC>.ini and publishes in the hicann/runtime
# repository, src/platform/platform_config/cann/<SoC>.ini
# (https://github.com/hicann/runtime/tree/681ef7610df13c8128982901142a2c869ddbb53e/src/platform/platform_config/cann):
# cube_core_cnt, cube_freq (MHz) and [DtypeMKN] (the M, K, N of one cube instruction: Default=16,16,16,
# DT_INT8=16,32,16). Peak = cores x frequency x M K N x 2 (a multiply-add is two operations). bfloat16 takes the
# Default row (support_bf16=1, no row of its own), as float16 does. float32: no row gives its rate (None).
# HBM bandwidth: None for every model: no public Huawei document found gives it per model (the files give none;
# third-party pages disagree: 0.4 to 1.2 TB/s for "910B"); the prediction then has no memory term.
PLATFORM_CONFIG = ("hicann/runtime src/platform/platform_config/cann/{soc}.ini (CANN platform config), commit "
                   "681ef7610df13c8128982901142a2c869ddbb53e")
CUBE_MKN = {"float16": 16 * 16 * 16, "bfloat16": 16 * 16 * 16, "int8": 16 * 32 * 16}  # [DtypeMKN]


@dataclasses.dataclass(frozen=True)
class Model:
    """One SoC model (what aclrtGetSocName answers), its cube and, where sourced, its HBM bandwidth."""

    soc: str  # e.g. "Ascend910B3"
    family: str  # MindSpore's normalised SoC version: the Chip it belongs to
    cube_cores: int  # cube_core_cnt
    cube_mhz: int  # cube_freq
    hbm_gbps: Optional[float] = None  # GB/s (1e9 bytes); None: not sourced
    note: str = ""

    def peak(self, kind):
        """Cube peak in operations per second for ``kind`` (float16, bfloat16, int8); None where not sourced."""
        mkn = CUBE_MKN.get(kind)
        return None if mkn is None else self.cube_cores * self.cube_mhz * 1e6 * mkn * 2

    def entry(self):
        """The manifest's record of the model (verify_on_device reads it; no package import on the device)."""
        tera = {k: (None if self.peak(k) is None else round(self.peak(k) / 1e12, 1))
                for k in ("float16", "bfloat16", "float32")}
        return {"soc": self.soc, "family": self.family, "hbm_gbps": self.hbm_gbps, "cube_tflops": tera,
                "int8_tops": round(self.peak("int8") / 1e12, 1), "source": PLATFORM_CONFIG.format(soc=self.soc),
                "note": self.note}


A3_DIE = "one die of an Atlas A3 NPU (two per NPU, each its own device)"
MODELS = (
    Model("Ascend910B1", "ascend910b", 24, 1850),
    Model("Ascend910B2", "ascend910b", 24, 1800),
    Model("Ascend910B2C", "ascend910b", 24, 1800),
    Model("Ascend910B3", "ascend910b", 20, 1800),
    Model("Ascend910B4", "ascend910b", 20, 1500),
    Model("Ascend910B4-1", "ascend910b", 20, 1500),
    Model("Ascend910_9391", "ascend910_93", 24, 1850, note=A3_DIE),
    Model("Ascend910_9392", "ascend910_93", 24, 1850, note=A3_DIE),
    Model("Ascend910_9381", "ascend910_93", 24, 1800, note=A3_DIE),
    Model("Ascend910_9382", "ascend910_93", 24, 1800, note=A3_DIE),
    Model("Ascend910_9372", "ascend910_93", 20, 1800, note=A3_DIE),
    Model("Ascend910_9362", "ascend910_93", 20, 1500, note=A3_DIE),
)
BY_SOC = {m.soc: m for m in MODELS}


def models(family):
    """The :class:`Model` s of a SoC family (none for a family without sourced figures)."""
    return [m for m in MODELS if m.family == family]


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
