"""Llama, Mistral, Qwen2, Qwen3: every layer a SwiGLU MLP, ``model.layers.{i}.mlp.{gate,up,down}_proj.weight``."""
from ms_swiglu.families.base import Family


class Dense(Family):
    model_types = ("llama", "mistral", "qwen2", "qwen3")


FAMILY = Dense()
