from setuptools import Extension, setup

# The CPU kernel is a plain shared library loaded by MindSpore's Custom(func_type="aot"); it is
# built as an Extension so that `pip install .` and `pip install -e .` compile it.
kernel = Extension(
    "ms_swiglu._swiglu_cpu",
    sources=["ms_swiglu/csrc/swiglu.cc"],
    depends=["ms_swiglu/csrc/swiglu_impl.inc", "ms_swiglu/csrc/linear_impl.inc"],
    language="c++",
    extra_compile_args=["-O3", "-std=c++17", "-fopenmp", "-Wno-maybe-uninitialized"],
    extra_link_args=["-fopenmp"],
)

setup(
    name="ms_swiglu",
    version="0.1.0",
    description="Packed gate/up SwiGLU MLP for MindSpore: fused kernels, HF loaders, Ascend export",
    packages=["ms_swiglu", "ms_swiglu.export", "ms_swiglu.tools"],
    package_dir={"ms_swiglu": "ms_swiglu", "ms_swiglu.export": "export", "ms_swiglu.tools": "tools"},
    ext_modules=[kernel],
    python_requires=">=3.9",
    install_requires=[
        "mindspore>=2.10,<2.11",
        "numpy>=1.22,<2",  # MindSpore 2.10 converts bfloat16 tensors to NumPy only with NumPy 1.x
        "safetensors>=0.4",
        "decorator",  # AKG (graph-kernel fusion and hybrid kernels on the CPU) imports it
    ],
    extras_require={"test": ["pytest>=7", "hypothesis>=6", "matplotlib>=3.5"], "bench": ["matplotlib>=3.5"]},
    entry_points={"console_scripts": ["ms-swiglu = ms_swiglu.cli:main"]},
)
