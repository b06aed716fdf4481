"""The families' config fields against transformers itself: ``tests/data/transformers-<version>.json`` are
written by ``tools/config_fields.py`` from the config classes of transformers 4.57.6 and 5.25.0 (each field's
default, the name save_pretrained writes it under, each class's attribute_map). Every name a version writes or
reads a field by is one the package reads it by, every default is transformers', and a checkpoint whose
config.json uses the other version's names loads to the same layer."""
import json
import os

import numpy as np
import pytest

from ms_swiglu.checkpoint import load_dense_layer, load_moe_layer, read_config
from ms_swiglu.families import FAMILIES, parse_config
from hf_checkpoint import make_checkpoint

DATA = os.path.join(os.path.dirname(__file__), "data")
VERSIONS = ("4.57.6", "5.25.0")


def recorded(version):
    with open(os.path.join(DATA, f"transformers-{version}.json")) as f:
        data = json.load(f)
    assert data["transformers"] == version
    return data["families"]


def names(family, field):
    """Every name the package reads ``field`` by, for ``family``, and its own name for it."""
    for own, others in family.spellings.items():
        if field in (own, *others):
            return {own, *others}, own
    return {field}, field


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_name_and_default_is_transformers(version, model_type):
    family, data = FAMILIES[model_type], recorded(version)[model_type]
    read = set(family.defaults) | set(family.spellings)
    checked = 0
    for field, entry in data["fields"].items():
        spelled, own = names(family, field)
        if own not in read:
            continue  # a field the package does not read
        assert entry["written_as"] in spelled, f"{model_type} {version}: {field} written as {entry['written_as']}"
        assert family.defaults[own] == entry["default"], f"{model_type} {version}: default of {field}"
        checked += 1
    for alias, real in data["attribute_map"].items():
        if names(family, real)[1] in read:
            assert alias in names(family, real)[0], f"{model_type} {version}: attribute_map {alias} -> {real}"
    assert checked >= 5  # hidden_size, intermediate_size, num_hidden_layers, rms_norm_eps, hidden_act at least


def _spelled_as(version, model_type, config):
    """config.json's fields under the names ``version`` writes them (dtype as it writes it)."""
    fields = recorded(version)[model_type]["fields"]
    out = {}
    for key, value in config.items():
        out[fields[key]["written_as"] if key in fields else key] = value
    if "torch_dtype" in out and version.startswith("5"):
        out["dtype"] = out.pop("torch_dtype")
    return out


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_configs_of_either_version_load_to_the_same_layer(tmp_path, model_type):
    moe = FAMILIES[model_type].has_moe
    folder = str(tmp_path / "ckpt")
    make_checkpoint(folder, model_type=model_type, hidden=32, inter=48, layers=1, experts=4 if moe else 0,
                    moe_inter=16, shared_inter=16 if model_type in ("qwen2_moe", "deepseek_v3") else 0,
                    config_extra={"deepseek_v3": {"n_group": 2, "topk_group": 1, "first_k_dense_replace": 0},
                                  "qwen2_moe": {"shared_expert_intermediate_size": 16}}.get(model_type))
    with open(os.path.join(folder, "config.json")) as f:
        written = json.load(f)
    layers = []
    for version in VERSIONS:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(_spelled_as(version, model_type, written), f)
        config = read_config(folder)
        layers.append((config, (load_moe_layer if moe else load_dense_layer)(folder, 0)))
    (config4, (arrays4, dtype4)), (config5, (arrays5, dtype5)) = layers
    assert config4 == config5 and config4.dtype == "float32" and dtype4 == dtype5
    assert sorted(arrays4) == sorted(arrays5) and all(np.array_equal(arrays4[k], arrays5[k]) for k in arrays4)


def test_a_field_given_twice_must_agree():
    raw = {"model_type": "qwen3_moe", "num_experts": 128, "num_local_experts": 16}
    with pytest.raises(ValueError, match=r"expected one value for num_experts \(also written num_local_experts\), "
                                         r"got \{'num_experts': 128, 'num_local_experts': 16\}"):
        parse_config(raw, "config.json")
    assert parse_config(dict(raw, num_experts=16), "config.json").moe.num_experts == 16
    with pytest.raises(ValueError, match="expected one value for dtype"):
        parse_config({"model_type": "llama", "dtype": "bfloat16", "torch_dtype": "float16"}, "config.json")
    # Qwen2-MoE has no such alias in either version: its num_local_experts is another key
    assert parse_config({"model_type": "qwen2_moe", "num_local_experts": 16}, "config.json").moe.num_experts == 60
