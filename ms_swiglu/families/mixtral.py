"""Mixtral: every layer MoE under ``block_sparse_moe.``; softmax top-k, renormalised; experts w1 (gate), w3 (up),
w2 (down)."""
from ms_swiglu.families.base import DEFAULTS, SPELLINGS, Family, Keys, MoEConfig
from ms_swiglu.routing import Softmax


class Mixtral(Family):
    has_moe = True
    model_types = ("mixtral",)
    keys = Keys(block="block_sparse_moe", expert="experts.{e}.{part}.weight", parts=("w1", "w3", "w2"))
    spellings = dict(SPELLINGS, num_local_experts=("num_experts",))  # transformers 5's attribute_map
    defaults = dict(DEFAULTS, intermediate_size=14336, rms_norm_eps=1e-5, num_local_experts=8, num_experts_per_tok=2)

    def moe(self, c, layers):
        moe = MoEConfig(c.int("num_local_experts"), c.int("num_experts_per_tok"), c.int("intermediate_size"),
                        Softmax(renormalize=True))
        return moe, frozenset(layers)


FAMILY = Mixtral()
