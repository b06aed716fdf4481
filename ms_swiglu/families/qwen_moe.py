"""Qwen2-MoE and Qwen3-MoE: softmax top-k, renormalised if ``norm_topk_prob``; layer i is MoE unless i is in
``mlp_only_layers``, if ``(i + 1) % decoder_sparse_step == 0``. Qwen2-MoE adds a shared expert scaled by
``sigmoid(shared_expert_gate)``."""
from ms_swiglu.families.base import DEFAULTS, SPELLINGS, Family, Keys, MoEConfig
from ms_swiglu.routing import Softmax


class QwenMoE(Family):
    has_moe = True
    def __init__(self, model_type, shared, spellings, defaults):
        self.model_types, self.shared = (model_type,), shared
        self.keys = Keys(shared="shared_expert.", shared_gate="shared_expert_gate.weight") if shared else Keys()
        self.spellings, self.defaults = dict(SPELLINGS, **spellings), dict(DEFAULTS, **defaults)

    def moe(self, c, layers):
        shared = c.int("shared_expert_intermediate_size", minimum=0) if self.shared else 0
        moe = MoEConfig(c.int("num_experts"), c.int("num_experts_per_tok"), c.int("moe_intermediate_size"),
                        Softmax(renormalize=c.bool("norm_topk_prob")), shared_intermediate_size=shared,
                        shared_expert_gate=bool(shared))
        dense, step = set(c.ints("mlp_only_layers")), c.int("decoder_sparse_step")
        return moe, frozenset(i for i in layers if i not in dense and (i + 1) % step == 0)


_MOE = {"decoder_sparse_step": 1, "norm_topk_prob": False, "num_hidden_layers": 24, "hidden_size": 2048}
# Qwen2-MoE has no attribute_map: a num_local_experts there is another key, not num_experts
QWEN2_MOE = QwenMoE("qwen2_moe", shared=True, spellings={}, defaults=dict(
    _MOE, intermediate_size=5632, num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
    shared_expert_intermediate_size=5632))
# transformers 5.1+ writes num_local_experts (attribute_map num_experts -> num_local_experts)
QWEN3_MOE = QwenMoE("qwen3_moe", shared=False, spellings={"num_experts": ("num_local_experts",)}, defaults=dict(
    _MOE, intermediate_size=6144, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768))
