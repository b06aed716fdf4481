import glob
import importlib.metadata
import os

from setuptools import Extension, setup


def onednn_include():
    """The include folder of the onednn-devel headers (a build requirement: pyproject.toml)."""
    dist = importlib.metadata.distribution("onednn-devel")
    for f in dist.files or ():
        if str(f).endswith("oneapi/dnnl/dnnl.h"):
            return os.path.dirname(os.path.dirname(os.path.dirname(dist.locate_file(f))))
    raise RuntimeError("ms_swiglu: expected oneapi/dnnl/dnnl.h in the onednn-devel package, found none")


CPU = "ms_swiglu/backends/cpu/csrc"
FLAGS = ["-O3", "-std=c++17", "-Wno-maybe-uninitialized"]
# The cpu backend's kernels: a plain shared library loaded by MindSpore's Custom(func_type="aot"); built as an
# Extension so that `pip install .` and `pip install -e .` compile it.
kernels = Extension(
    "ms_swiglu.backends.cpu._kernels",
    sources=sorted(glob.glob(f"{CPU}/*.cc")),
    depends=glob.glob(f"{CPU}/*.h") + glob.glob(f"{CPU}/*.inc") + ["pyproject.toml"],
    include_dirs=[onednn_include()],
    language="c++",
    extra_compile_args=FLAGS + ["-pthread"],  # its own thread pool (csrc/pool.cc), no OpenMP
    extra_link_args=["-pthread", "-ldl"],
)
# The CLI's SIGTERM origin check (ms_swiglu/signals.py loads it with ctypes; no Python API).
sigorigin = Extension("ms_swiglu._sigorigin", sources=["ms_swiglu/csrc/sigorigin.c"], extra_compile_args=["-O2"])
# The benchmarks' bandwidth probes (not part of the kernels).
probes = Extension("ms_swiglu.tools._probes", sources=["tools/csrc/probes.cc"], language="c++",
                   extra_compile_args=FLAGS + ["-pthread"], extra_link_args=["-pthread"])

setup(
    name="ms_swiglu",
    version="0.1.0",
    description="Packed gate/up SwiGLU MLP for MindSpore: fused kernels, HF loaders, Ascend export",
    packages=["ms_swiglu", "ms_swiglu.backends", "ms_swiglu.backends.cpu", "ms_swiglu.checkpoint",
              "ms_swiglu.families", "ms_swiglu.quant", "ms_swiglu.launch", "ms_swiglu.export", "ms_swiglu.tools"],
    package_dir={"ms_swiglu": "ms_swiglu", "ms_swiglu.export": "export", "ms_swiglu.tools": "tools"},
    ext_modules=[kernels, sigorigin, probes],
    python_requires=">=3.9",
    install_requires=[
        "mindspore>=2.10,<2.11",
        "numpy>=1.22,<2",  # MindSpore 2.10 converts bfloat16 tensors to NumPy only with NumPy 1.x
        "safetensors>=0.4",
        "decorator",  # AKG (graph-kernel fusion and hybrid kernels on the CPU) imports it
    ],
    # ml_dtypes: the tests' independent FP8 reference (0.6 needs NumPy 2)
    extras_require={"test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6", "matplotlib>=3.5", "ml_dtypes<0.6"],
                    "bench": ["matplotlib>=3.5"]},
    entry_points={"console_scripts": ["ms-swiglu = ms_swiglu.__main__:main"]},
)
