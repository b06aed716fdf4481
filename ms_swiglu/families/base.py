"""What a model family is to the package: where its checkpoint keeps each FFN tensor, which config fields say
what, which layers are mixture-of-experts and how they route. No MindSpore here.

A family is a :class:`Family` (one module per family, as in transformers); :mod:`ms_swiglu.families` registers
them by ``model_type``. :class:`ModelConfig` is what the package reads of a checkpoint's ``config.json``.
"""
import dataclasses
import json

import numpy as np

from ms_swiglu.errors import CheckpointError
from ms_swiglu.packing import check_tp
from ms_swiglu.quant import get as quant_method


@dataclasses.dataclass(frozen=True)
class Keys:
    """Where a family keeps one FFN's tensors, under ``model.layers.{layer}.{block}.``."""

    block: str = "mlp"
    router: str = "gate.weight"
    expert: str = "experts.{e}.{part}_proj.weight"  # part: gate, up, down
    parts: tuple = ("gate", "up", "down")  # the names standing for gate, up, down in `expert`
    shared: str = ""  # the shared expert's prefix, e.g. "shared_expert."
    shared_gate: str = ""  # e.g. "shared_expert_gate.weight"
    bias: str = ""  # e.g. "gate.e_score_correction_bias"

    def prefix(self, layer, block=None):
        return f"model.layers.{layer}.{block or self.block}."


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """The MoE block of a family's sparse layers: the keyword arguments of :class:`~ms_swiglu.moe.PackedMoE`."""

    num_experts: int
    top_k: int
    intermediate_size: int  # of one expert
    router: object  # a config of ms_swiglu.routing
    shared_intermediate_size: int = 0
    shared_expert_gate: bool = False

    def block_kwargs(self):
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("num_experts", "top_k", "intermediate_size")}


_DEFAULT = object()


class Fields:
    """config.json's fields, each checked as it is read, under every name transformers reads it by
    (``spellings``: field -> its other names) and with transformers' default where it is absent (``defaults``);
    a field given under two names with two values is refused."""

    def __init__(self, path, raw, spellings=None, defaults=None):
        self.path, self.raw, self.spellings, self.defaults = path, raw, spellings or {}, defaults or {}

    def _get(self, name, default, ok, what):
        given = {n: self.raw[n] for n in (name, *self.spellings.get(name, ())) if n in self.raw}
        if len({json.dumps(v, sort_keys=True) for v in given.values()}) > 1:
            raise CheckpointError(f"{self.path}: expected one value for {name} (also written "
                                  f"{', '.join(self.spellings[name])}), got {given}")
        if default is _DEFAULT:
            default = self.defaults.get(name)
        value = next(iter(given.values()), default)
        if not ok(value):
            raise CheckpointError(f"{self.path}: expected {name} {what}, got {value!r}")
        return value

    def int(self, name, default=_DEFAULT, minimum=1):
        return self._get(name, default, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum,
                         "a positive integer" if minimum == 1 else f"an integer >= {minimum}")

    def float(self, name, default=_DEFAULT):
        return float(self._get(name, default, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                               and v > 0 and np.isfinite(v), "a positive number"))

    def bool(self, name, default=_DEFAULT):
        return self._get(name, default, lambda v: isinstance(v, bool), "true or false")

    def ints(self, name):
        return self._get(name, [], lambda v: v is None or (isinstance(v, list) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in v)), "a list of layer indices") or []

    def str(self, name, allowed, default=_DEFAULT):
        return self._get(name, default, lambda v: v in allowed, f"one of {', '.join(map(repr, allowed))}")

    def dtype(self):
        """The checkpoint's dtype name (``dtype``, or transformers 4's ``torch_dtype``), None where it has none."""
        return self._get("dtype", None, lambda v: v is None or v in DTYPES, f"one of {', '.join(DTYPES)}")


DTYPES = ("float32", "float16", "bfloat16")
# every family: transformers 4.56+ writes dtype, earlier ones torch_dtype; both read either
SPELLINGS = {"dtype": ("torch_dtype",)}
# the defaults of transformers' PretrainedConfig subclasses shared by every family (tools/config_fields.py)
DEFAULTS = {"hidden_size": 4096, "num_hidden_layers": 32, "rms_norm_eps": 1e-6, "hidden_act": "silu"}


class Family:
    """A dense family (llama and its kin): every layer a SwiGLU MLP under ``mlp.``. MoE families override
    :meth:`moe`; their keys say where the experts are. ``spellings``: field -> the other names transformers 4 and
    5 read it by (their ``attribute_map``); ``defaults``: the config class's defaults, as transformers applies
    them to an absent field (4.57 and 5.x agree on every field read here)."""

    model_types = ()
    has_moe = False
    keys = Keys()
    spellings = SPELLINGS
    defaults = DEFAULTS

    def __repr__(self):
        return f"<family {'/'.join(self.model_types)}>"

    def moe(self, fields, layers):  # noqa: ARG002
        """(the :class:`MoEConfig` of the sparse layers, the sparse layers among ``layers``); (None, ()) when
        dense."""
        return None, frozenset()

    def parse(self, raw, path, model_type):
        """The :class:`ModelConfig` of config.json's contents ``raw``."""
        c = Fields(path, raw, self.spellings, self.defaults)
        c.str("hidden_act", ["silu", "swish"])  # the SwiGLU MLP's; gelu is another MLP
        values = {name: c.int(name) for name in ("hidden_size", "intermediate_size", "num_hidden_layers")}
        moe, sparse = self.moe(c, range(values["num_hidden_layers"]))
        return ModelConfig(model_type=model_type, rms_norm_eps=c.float("rms_norm_eps"), moe=moe,
                           sparse_layers=sparse, family=self, dtype=c.dtype(), **values)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The fields of ``config.json`` this package uses. ``intermediate_size`` is the dense MLP's (Mixtral's: an
    expert's); ``moe`` describes the sparse layers, ``sparse_layers`` lists them."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    rms_norm_eps: float = 1e-6
    moe: MoEConfig = None
    sparse_layers: frozenset = frozenset()
    dtype: str = None  # config.json's dtype (or torch_dtype), None where it names none
    encoding: object = None  # how a HF checkpoint stores its weights (ms_swiglu.checkpoint.fp8), None: as floats
    family: Family = dataclasses.field(default=Family(), compare=False, repr=False)

    @property
    def is_moe(self):
        return bool(self.sparse_layers)

    @property
    def num_local_experts(self):
        return self.moe.num_experts if self.moe else 0

    @property
    def num_experts_per_tok(self):
        return self.moe.top_k if self.moe else 0

    @property
    def keys(self):
        return self.family.keys

    def is_moe_layer(self, layer):
        return layer in self.sparse_layers

    def layer_parameters(self, layer):
        """How many weights one layer's MLP or MoE block holds (router and shared expert included)."""
        h = self.hidden_size
        if not self.is_moe_layer(layer):
            return 3 * h * self.intermediate_size
        m = self.moe
        return m.num_experts * (3 * h * m.intermediate_size + h) + 3 * h * m.shared_intermediate_size + (
            h if m.shared_expert_gate else 0)

    def split_sizes(self, layers=None):
        """The intermediate sizes tensor parallelism splits in ``layers`` (default: all)."""
        layers = range(self.num_hidden_layers) if layers is None else layers
        sizes = {self.intermediate_size for i in layers if not self.is_moe_layer(i)}
        if any(self.is_moe_layer(i) for i in layers):
            sizes |= {self.moe.intermediate_size} | ({self.moe.shared_intermediate_size} - {0})
        return sorted(sizes)

    def check_tp(self, tp_size, layers=None, quant=None):
        """InputError unless tp_size divides every intermediate size the layers (default: all) split, and the
        projections' input sizes on a rank hold whole scale groups of ``quant`` (a weight format)."""
        sizes = self.split_sizes(layers)
        for size in sizes:
            check_tp(size, tp_size)
        g = quant_method(quant).group
        if g and any(k % g for k in (self.hidden_size, *(size // tp_size for size in sizes))):
            raise CheckpointError(f"quant {quant_method(quant).name}: expected hidden_size and every intermediate "
                                  f"size / tp_size multiples of {g}, got hidden_size {self.hidden_size}, "
                                  f"intermediate size / {tp_size}: {', '.join(str(size // tp_size) for size in sizes)}")

    def check_ep(self, ep_size, layers=None):  # noqa: ARG002 -- dense layers of a MoE model run whole on every rank
        """InputError unless the model has routed experts for ``ep_size`` > 1 expert-parallel ranks, and
        ``ep_size`` divides their number."""
        if ep_size == 1:
            return
        if not self.moe:
            raise CheckpointError(f"ep_size: expected 1 for a model without routed experts ({self.model_type!r}), "
                                  f"got {ep_size}")
        if ep_size < 1 or self.moe.num_experts % ep_size:
            raise CheckpointError(f"ep_size: expected a divisor of the number of routed experts "
                                  f"{self.moe.num_experts}, got {ep_size}")

    def check_layer(self, layer):
        if not 0 <= layer < self.num_hidden_layers:
            raise CheckpointError(f"layer: expected 0..{self.num_hidden_layers - 1} "
                              f"(num_hidden_layers={self.num_hidden_layers}), got {layer}")
