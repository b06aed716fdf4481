"""Model shapes and dtype names shared by the Cells, the demo, the benchmarks and the CLI (no MindSpore import
at module load, so that the CLI can check its arguments first)."""
from ms_swiglu.errors import InputError, InputTypeError

# (hidden_size, intermediate_size) of the MLPs the benchmarks, the demo and the exporter use
PRESETS = {
    "llama-7b": (4096, 11008),
    "qwen2-7b": (3584, 18944),
    "small": (1024, 2752),
    "tiny": (64, 176),
}

DTYPE_NAMES = ("float32", "float16", "bfloat16")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# (atol, rtol) for comparing a result in this dtype with its reference (one rounding to the dtype)
TOLERANCE = {"float32": (1e-5, 1.3e-6), "float16": (1e-3, 1e-3), "bfloat16": (1e-3, 1.6e-2)}


def preset(name):
    """(hidden_size, intermediate_size) of a named preset."""
    if name not in PRESETS:
        raise InputError(f"preset: expected one of {', '.join(PRESETS)}, got {name!r}")
    return PRESETS[name]


def to_dtype(dtype):
    """A MindSpore float dtype from a dtype or its name ('float32', 'float16', 'bfloat16'); ValueError for
    bfloat16 on an Ascend chip without it."""
    import mindspore as ms  # noqa: PLC0415

    from ms_swiglu.backends import chips  # noqa: PLC0415

    names = {name: getattr(ms, name) for name in DTYPE_NAMES}
    if isinstance(dtype, str):
        if dtype not in names:
            raise InputTypeError(f"dtype: expected one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
        dtype = names[dtype]
    elif dtype not in names.values():
        raise InputTypeError(f"dtype: expected one of {', '.join(DTYPE_NAMES)}, got {dtype}")
    chips.check_dtype(str(dtype).lower(), chips.current())
    return dtype
