"""Shared test set-up: the CPU device, both execution modes, the float64 reference and the tolerances."""
import contextlib
import tempfile

import mindspore as ms
import numpy as np
import pytest
from hypothesis.configuration import set_hypothesis_home_dir
from mindspore import nn

ms.set_device("CPU")

from ms_swiglu.config import TOLERANCE as TOL  # dtype -> (atol, rtol)
MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}
DTYPES = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """hypothesis keeps its examples and caches in the session's temporary folder (it writes them while the
    tests are collected), not in .hypothesis/ of the working directory."""
    set_hypothesis_home_dir(str(config._tmp_path_factory.mktemp("hypothesis")))


@pytest.fixture(params=list(MODES))
def mode(request):
    """Runs the test once in GRAPH_MODE and once in PYNATIVE_MODE."""
    ms.set_context(mode=MODES[request.param])
    yield request.param
    ms.set_context(mode=ms.GRAPH_MODE)


@pytest.fixture(scope="session", autouse=True)
def _kernel_dir(tmp_path_factory):
    """AKG and the graph compiler write kernel_meta/ and logs into the working directory, and the CLI keeps job
    folders and logs under $TMPDIR: both inside the session's own temporary folder."""
    mp = pytest.MonkeyPatch()
    mp.chdir(tmp_path_factory.mktemp("work"))
    tmp = str(tmp_path_factory.mktemp("tmpdir"))
    mp.setenv("TMPDIR", tmp)  # every subprocess's
    mp.setattr(tempfile, "tempdir", tmp)  # this process's
    yield
    mp.undo()


# The kernels' builds (isa.cc), best first: the instruction set each needs, by its name and by the CPU flags
# (/proc/cpuinfo's names) that isa.cc checks for it.
ISAS = {"avx512bf16": ("AVX512-BF16", {"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni"}),
        "avx512": ("AVX-512", {"avx512f", "avx512bw", "avx512vl"}),
        "avx2": ("AVX2", {"avx2", "fma", "f16c"}),
        "generic": ("x86-64", set())}


@contextlib.contextmanager
def on_isa(name):
    """The cpu kernels on instruction set ``name`` (a key of ISAS) within the block (the best one again
    afterwards); the test is skipped, naming the instruction set, on a CPU without it."""
    from ms_swiglu.backends.cpu import kernels  # noqa: PLC0415
    if name not in kernels.isas():
        needs, flags = ISAS[name]
        pytest.skip(f"needs {needs} ({', '.join(sorted(flags))}) for the {name} kernels; this CPU runs "
                    f"{', '.join(kernels.isas())}")
    best = kernels.isa()
    kernels.set_isa(name)
    try:
        yield
    finally:
        kernels.set_isa(best)


def needs_amx():
    """Skips the test, naming AMX-BF16, where the amx path cannot run: a CPU without AMX-BF16 (amx.cc checks for
    AVX512-FP16 too, which every such CPU has), or a Linux that does not give the process the tile data (the
    forced path then falls back to the skinny kernel)."""
    from ms_swiglu.backends.cpu import kernels  # noqa: PLC0415
    if not kernels.tuning()["amx_available"]:
        flags = set(open("/proc/cpuinfo").read().split())
        why = ("this CPU has no AMX-BF16" if "amx_bf16" not in flags
               else "this CPU has AMX-BF16, but the process got no AMX tile data (Linux >= 5.16 grants it)")
        pytest.skip(f"needs AMX-BF16 for the amx path (TDPBF16PS tiles): {why}")


@contextlib.contextmanager
def on_path(path):
    """Within the block every GEMM takes path ``path`` (None: the automatic choice) on the instruction set that
    has its kernel: ``amx`` where the CPU has AMX-BF16 (else the test is skipped, saying "needs AMX-BF16"),
    ``panel`` on the avx2 kernels (AVX2's: on_isa("avx2") skips, saying "needs AVX2", without it). Compute the
    reference within the block too: the tuning table it reads follows the instruction set."""
    from ms_swiglu.backends.cpu import kernels  # noqa: PLC0415
    if path == "amx":
        needs_amx()
    with on_isa("avx2") if path == "panel" else contextlib.nullcontext():
        with contextlib.nullcontext() if path is None else kernels.forced_path(path):
            yield


def to_tensor(a, dtype):
    """A float32 NumPy array as a Tensor of dtype (a name), plus the float64 copy of the rounded values."""
    t = ms.Tensor(np.asarray(a, np.float32)).astype(DTYPES[dtype])
    return t, to_f64(t)


def to_f64(t):
    return t.astype(ms.float32).asnumpy().astype(np.float64)


def ref_swiglu(x):
    """float64 reference of the forward: [..., 2I] -> [..., I]."""
    gate, up = np.split(x, 2, axis=-1)
    with np.errstate(over="ignore", invalid="ignore"):
        return gate / (1.0 + np.exp(-gate)) * up


def ref_swiglu_grad(x, dy):
    """float64 reference of the backward: [..., 2I], [..., I] -> [..., 2I] = [d_gate, d_up]."""
    gate, up = np.split(x, 2, axis=-1)
    s = 1.0 / (1.0 + np.exp(-gate))
    silu = gate * s
    return np.concatenate([dy * up * (s + silu * (1.0 - s)), dy * silu], axis=-1)


def assert_close(actual, expected, dtype, what=""):
    """actual (Tensor or array) against the float64 reference within the dtype's tolerance; NaN must match NaN."""
    atol, rtol = TOL[dtype]
    a = to_f64(actual) if isinstance(actual, ms.Tensor) else np.asarray(actual, np.float64)
    assert a.shape == expected.shape, f"{what}: shape {a.shape} != expected {expected.shape}"
    np.testing.assert_allclose(a, expected, atol=atol, rtol=rtol, equal_nan=True, err_msg=what)


class LossCell(nn.Cell):
    """sum(net(x) * dy) in float32 (the CPU has no bfloat16 sum): its gradient is the vector-Jacobian product."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, x, dy):
        return (self.net(x).astype(ms.float32) * dy.astype(ms.float32)).sum()
