"""The config fields of the families the package reads, as an installed transformers has them: each config
class's ``attribute_map``, and each field's default and the name ``save_pretrained`` writes it under. Run it with
the Python of an environment that has the transformers version to record (it needs no torch):

    python tools/config_fields.py > tests/data/transformers-<version>.json

``tests/test_config_fields.py`` holds the package's family table (``ms_swiglu.families``) against these files.
"""
import json
import os
import sys
import tempfile

CLASSES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
           "mixtral": "MixtralConfig", "qwen2_moe": "Qwen2MoeConfig", "qwen3_moe": "Qwen3MoeConfig",
           "deepseek_v3": "DeepseekV3Config"}
# every field any family of the package reads (a family reads those its class has)
FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "rms_norm_eps", "hidden_act", "num_local_experts",
          "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
          "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
          "n_shared_experts", "n_group", "topk_group", "routed_scaling_factor", "first_k_dense_replace")


def record():
    import transformers  # noqa: PLC0415

    transformers.logging.set_verbosity_error()
    out = {"transformers": transformers.__version__, "families": {}}
    for family, name in CLASSES.items():
        cls = getattr(transformers, name)
        config = cls()
        with tempfile.TemporaryDirectory() as folder:
            config.save_pretrained(folder)
            with open(os.path.join(folder, "config.json")) as f:
                saved = json.load(f)
        attribute_map = dict(cls.attribute_map)
        fields = {}
        for field in FIELDS:
            written = attribute_map.get(field, field)
            if written in saved and field in (written, *attribute_map):
                fields[field] = {"default": saved[written], "written_as": written}
        out["families"][family] = {"attribute_map": attribute_map, "fields": fields}
    return out


if __name__ == "__main__":
    json.dump(record(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
