"""The kits of tests/test_kit_acceptance.py: one per kind (dense in every dtype and int8 format, int4 and W8A8
as published, each MoE family, FFN stacks), exported from checkpoints written here; conftest.kits_started exports them in the background
from the session's start."""
from hf_checkpoint import make_checkpoint
from quant_checkpoint import to_quantized

H = 64
# kit -> (checkpoint, export options). Sizes: H 64, int8-g128 H 256 (two groups per row); MoE 8 experts top-2.
KITS = {
    "dense-bfloat16": ("dense", ["--layer", 0, "--target", "ascend", "--dtype", "bfloat16"]),
    "dense-float16": ("dense", ["--layer", 0, "--target", "portable", "--dtype", "float16"]),
    "dense-float32": ("dense", ["--layer", 1, "--target", "ascend"]),
    "dense-int8-bfloat16": ("dense", ["--layer", 0, "--target", "ascend", "--dtype", "bfloat16", "--quantize", "int8"]),
    "dense-int8g128-bfloat16": ("wide", ["--layer", 0, "--target", "portable", "--dtype", "bfloat16", "--quantize",
                                         "int8-g128"]),
    "mixtral-bfloat16": ("mixtral", ["--layer", 0, "--target", "portable", "--dtype", "bfloat16"]),
    "qwen2_moe-bfloat16": ("qwen2_moe", ["--layer", 0, "--target", "portable", "--dtype", "bfloat16"]),
    "deepseek_v3-bfloat16": ("deepseek_v3", ["--layer", 1, "--target", "portable", "--dtype", "bfloat16"]),
    # published formats, exported with their Ascend ops (H 256: two groups per row, one per 128 of W8A8's rows)
    "dense-int4g32zp-float16": ("wide-gptq", ["--layer", 0, "--target", "ascend", "--dtype", "float16"]),
    "dense-w8a8-bfloat16": ("wide", ["--layer", 0, "--target", "ascend", "--dtype", "bfloat16", "--quantize",
                                     "w8a8"]),
    "dense-w8a8static-float16": ("wide-modelslim", ["--layer", 0, "--target", "ascend", "--dtype", "float16"]),
    "mixtral-w8a8-bfloat16": ("mixtral", ["--layer", 0, "--target", "ascend", "--dtype", "bfloat16", "--quantize",
                                          "w8a8"]),
    "stack-bfloat16": ("dense", ["--layers", "0-1", "--target", "portable", "--dtype", "bfloat16"]),
    "stack-deepseek_v3": ("deepseek_v3", ["--layers", "0-1", "--target", "portable", "--dtype", "bfloat16"]),
}


def make_checkpoints(root):
    """float32 checkpoints (the kits take their dtype from --dtype)."""
    dense = dict(hidden=H, inter=96, layers=2)
    moe = dict(hidden=H, inter=96, moe_inter=32, experts=8, top_k=2, layers=2)
    make_checkpoint(root / "dense", seed=1, **dense)
    make_checkpoint(root / "wide", hidden=256, inter=128, layers=1, seed=2)
    to_quantized(str(root / "wide"), str(root / "wide-gptq"), "gptq", group=32, symmetric=False)
    to_quantized(str(root / "wide"), str(root / "wide-modelslim"), "modelslim", kind="W8A8")
    make_checkpoint(root / "mixtral", model_type="mixtral", seed=3, **dict(moe, inter=32))
    make_checkpoint(root / "qwen2_moe", model_type="qwen2_moe", seed=4, shared_inter=32,
                    config_extra={"shared_expert_intermediate_size": 32}, **moe)
    make_checkpoint(root / "deepseek_v3", model_type="deepseek_v3", seed=5, shared_inter=32, sparse=[1],
                    config_extra={"n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
                                  "routed_scaling_factor": 2.5, "n_shared_experts": 1}, **moe)
