"""DeepSeek-V3: sigmoid scores, ``e_score_correction_bias`` to choose, group-limited top-k (``n_group``,
``topk_group``), ``norm_topk_prob``, ``routed_scaling_factor``; ``n_shared_experts * moe_intermediate_size``
shared; layer i is MoE if ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0``."""
from ms_swiglu.families.base import DEFAULTS, SPELLINGS, Family, Keys, MoEConfig
from ms_swiglu.routing import SigmoidGroups


class DeepseekV3(Family):
    has_moe = True
    model_types = ("deepseek_v3",)
    keys = Keys(shared="shared_experts.", bias="gate.e_score_correction_bias")
    spellings = dict(SPELLINGS, n_routed_experts=("num_local_experts",))  # transformers 5's attribute_map
    defaults = dict(DEFAULTS, hidden_size=7168, intermediate_size=18432, num_hidden_layers=61, n_routed_experts=256,
                    num_experts_per_tok=8, moe_intermediate_size=2048, n_shared_experts=1, n_group=8, topk_group=4,
                    routed_scaling_factor=2.5, first_k_dense_replace=3, norm_topk_prob=True,
                    # DeepSeek's own config keys (its configuration_deepseek.py; transformers keeps them as read)
                    scoring_func="sigmoid", topk_method="noaux_tc", moe_layer_freq=1)

    def moe(self, c, layers):
        c.str("scoring_func", ["sigmoid"])  # DeepSeek-V3's noaux_tc routing; V2's softmax/greedy are not it
        c.str("topk_method", ["noaux_tc"])
        inter = c.int("moe_intermediate_size")
        router = SigmoidGroups(renormalize=c.bool("norm_topk_prob"), n_group=c.int("n_group"),
                               topk_group=c.int("topk_group"), routed_scaling_factor=c.float("routed_scaling_factor"))
        moe = MoEConfig(c.int("n_routed_experts"), c.int("num_experts_per_tok"), inter, router,
                        shared_intermediate_size=c.int("n_shared_experts", minimum=0) * inter)
        first, freq = c.int("first_k_dense_replace", minimum=0), c.int("moe_layer_freq")
        return moe, frozenset(i for i in layers if i >= first and i % freq == 0)


FAMILY = DeepseekV3()
