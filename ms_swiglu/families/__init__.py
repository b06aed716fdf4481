"""The model families the package reads, one module each, by ``model_type``. Adding a family is one module
defining its :class:`~ms_swiglu.families.base.Family` and one line in :data:`FAMILIES` (or :func:`register`).
No MindSpore here."""
from ms_swiglu.families import deepseek_v3, dense, mixtral, qwen_moe
from ms_swiglu.errors import CheckpointError
from ms_swiglu.families.base import Family, Keys, ModelConfig, MoEConfig

FAMILIES = {}


def register(family):
    """Add a family under each of its ``model_types``; returns it."""
    taken = [t for t in family.model_types if t in FAMILIES]
    if not isinstance(family, Family) or not family.model_types or taken:
        raise ValueError(f"register: expected a Family with new model_types, got {family!r} (taken: {taken})")
    FAMILIES.update(dict.fromkeys(family.model_types, family))
    return family


for _family in (dense.LLAMA, dense.MISTRAL, dense.QWEN2, dense.QWEN3, mixtral.FAMILY, qwen_moe.QWEN2_MOE,
                qwen_moe.QWEN3_MOE, deepseek_v3.FAMILY):
    register(_family)


def parse_config(raw, path):
    """The :class:`ModelConfig` of config.json's contents ``raw`` (``path`` names where they come from)."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    model_type = raw.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(f"{path}: expected model_type one of {', '.join(FAMILIES)}, got {model_type!r}")
    return FAMILIES[model_type].parse(raw, path, model_type)


__all__ = ["FAMILIES", "Family", "Keys", "ModelConfig", "MoEConfig", "parse_config", "register"]
