"""Model shapes and dtype names shared by the Cells, the demo, the benchmarks and the CLI."""
from mindspore.common import dtype as mstype

# (hidden_size, intermediate_size) of the MLPs the benchmarks and the demo use
PRESETS = {
    "llama-7b": (4096, 11008),
    "qwen2-7b": (3584, 18944),
    "small": (1024, 2752),
}

DTYPES = {"float32": mstype.float32, "float16": mstype.float16, "bfloat16": mstype.bfloat16}


def preset(name):
    """(hidden_size, intermediate_size) of a named preset."""
    if name not in PRESETS:
        raise ValueError(f"preset: expected one of {', '.join(PRESETS)}, got {name!r}")
    return PRESETS[name]


def to_dtype(dtype):
    """A MindSpore float dtype from a dtype or its name ('float32', 'float16', 'bfloat16')."""
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise TypeError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
        return DTYPES[dtype]
    if dtype not in DTYPES.values():
        raise TypeError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype}")
    return dtype
