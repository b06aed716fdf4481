"""Router configs: what a family's MoE block routes by, as data (no MindSpore import). Each config builds its
router Cell (``ms_swiglu.routers``) for a block, and :data:`ROUTERS` names them by ``scoring``: adding a router is
one config here and one Cell there.
"""
import dataclasses

from ms_swiglu.errors import InputError


@dataclasses.dataclass(frozen=True)
class Softmax:
    """Mixtral, Qwen2-MoE, Qwen3-MoE: softmax over all experts, top-k, renormalised with ``renormalize``."""

    renormalize: bool = True
    scoring = "softmax"

    def build(self, hidden_size, num_experts, top_k, *, dtype, backend):
        from ms_swiglu.routers import SoftmaxTopK  # noqa: PLC0415

        return SoftmaxTopK(hidden_size, num_experts, top_k, renormalize=self.renormalize, dtype=dtype,
                           backend=backend)


@dataclasses.dataclass(frozen=True)
class SigmoidGroups:
    """DeepSeek-V3 (noaux_tc): sigmoid scores, the best ``topk_group`` of ``n_group`` groups, top-k among them,
    renormalised with ``renormalize``, times ``routed_scaling_factor``; its logits in float32 whatever the model
    dtype."""

    renormalize: bool = True
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    scoring = "sigmoid"

    def build(self, hidden_size, num_experts, top_k, *, dtype, backend):  # noqa: ARG002
        from ms_swiglu.routers import SigmoidGroupTopK  # noqa: PLC0415

        return SigmoidGroupTopK(hidden_size, num_experts, top_k, n_group=self.n_group, topk_group=self.topk_group,
                                renormalize=self.renormalize, routed_scaling_factor=self.routed_scaling_factor,
                                backend=backend)


ROUTERS = {config.scoring: config for config in (Softmax, SigmoidGroups)}


def router_config(scoring="softmax", **options):
    """The config of router ``scoring`` with ``options`` (each must be one of its fields)."""
    if scoring not in ROUTERS:
        raise InputError(f"scoring: expected one of {', '.join(ROUTERS)}, got {scoring!r}")
    config = ROUTERS[scoring]
    fields = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise InputError(f"router {scoring}: expected options among {', '.join(sorted(fields))}, got "
                         f"{', '.join(unknown)}")
    return config(**options)
