"""Llama, Mistral, Qwen2, Qwen3: every layer a SwiGLU MLP, ``model.layers.{i}.mlp.{gate,up,down}_proj.weight``."""
from ms_swiglu.families.base import DEFAULTS, Family


class Dense(Family):
    def __init__(self, model_type, intermediate_size):
        self.model_types, self.defaults = (model_type,), dict(DEFAULTS, intermediate_size=intermediate_size)


LLAMA = Dense("llama", 11008)
MISTRAL = Dense("mistral", 14336)
QWEN2 = Dense("qwen2", 22016)
QWEN3 = Dense("qwen3", 22016)
