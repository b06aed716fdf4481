"""Qwen2-MoE and Qwen3-MoE: softmax top-k, renormalised if ``norm_topk_prob``; layer i is MoE unless i is in
``mlp_only_layers``, if ``(i + 1) % decoder_sparse_step == 0``. Qwen2-MoE adds a shared expert scaled by
``sigmoid(shared_expert_gate)``."""
from ms_swiglu.families.base import Family, Keys, MoEConfig
from ms_swiglu.routing import Softmax


class QwenMoE(Family):
    has_moe = True
    def __init__(self, model_type, shared):
        self.model_types, self.shared = (model_type,), shared
        self.keys = Keys(shared="shared_expert.", shared_gate="shared_expert_gate.weight") if shared else Keys()

    def moe(self, c, layers):
        shared = c.int("shared_expert_intermediate_size", 5632, minimum=0) if self.shared else 0
        moe = MoEConfig(c.int("num_experts"), c.int("num_experts_per_tok"), c.int("moe_intermediate_size"),
                        Softmax(renormalize=c.bool("norm_topk_prob", False)), shared_intermediate_size=shared,
                        shared_expert_gate=bool(shared))
        dense, step = set(c.ints("mlp_only_layers")), c.int("decoder_sparse_step", 1)
        return moe, frozenset(i for i in layers if i not in dense and (i + 1) % step == 0)


QWEN2_MOE = QwenMoE("qwen2_moe", shared=True)
QWEN3_MOE = QwenMoE("qwen3_moe", shared=False)
