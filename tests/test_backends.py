"""The backend objects (one per backend, asked instead of names), and the cpu library's names, tuning table and
oneDNN binding (real headers; a runtime outside their ABI is refused and the kernels fall back)."""
import ctypes
import dataclasses
import os
import subprocess
import sys
import textwrap

import mindspore as ms
import numpy as np
import pytest

from ms_swiglu import FFNBlock, PackedSwiGLUMLP, backends
from ms_swiglu.backends.cpu import kernels
from ms_swiglu.backends.spec import Backend
from ms_swiglu.config import DTYPE_NAMES
from conftest import assert_close, ref_swiglu, to_f64, to_tensor


def test_every_registered_backend_is_one_object_named_as_registered():
    for name in backends.REGISTRY:
        b = backends.get(name)
        assert isinstance(b, Backend) and b.name == name and backends.resolve(name) is b
        assert backends.resolve(b) is b
    assert backends.NAMES == ("auto", *backends.REGISTRY)
    assert backends.resolve("auto").name == "cpu"  # the device target here is CPU
    with pytest.raises(ValueError, match=r"backend: expected one of auto, ascend, cpu, akg, composite, ge, got 'gpu'"):
        backends.get("gpu")


def test_facts_of_the_backends():
    cpu, composite, akg, ascend = (backends.get(n) for n in ("cpu", "composite", "akg", "ascend"))
    assert [b.runs_on("CPU") for b in (cpu, composite, akg, ascend)] == [True, True, True, False]
    assert [b.recomputable for b in (cpu, composite, akg, ascend)] == [False, True, False, True]
    assert not akg.dynamic_shapes and cpu.dynamic_shapes
    assert not cpu.facts.deployable and composite.facts.deployable and "docs/ascend.md" in ascend.facts.deployable
    assert ascend.facts.graph_ops == {"Swiglu"} and ascend.facts.allowed_ops >= {"Swiglu", "MatMul"}
    # the fused epilogue never materialises [T, 2I]: fewer intermediate bytes than the native path
    assert cpu.facts.activation_bytes(512, 4096, 11008, 4) < composite.facts.activation_bytes(512, 4096, 11008, 4)


def test_a_new_backend_is_one_module_and_one_registry_line(tmp_path, monkeypatch):
    """A backend defined outside the package (a module with BACKEND) joins by one registry entry; the Cells, the
    FFN block's recompute check and the op lookup all ask it."""
    (tmp_path / "half_swiglu.py").write_text(textwrap.dedent('''
        import dataclasses
        from ms_swiglu.backends import composite
        from ms_swiglu.backends.matmul import MatMulLinear
        from ms_swiglu.backends.spec import SwiGLUOp

        def _twice(x):
            return composite.swiglu(x) * 2

        BACKEND = dataclasses.replace(composite.BACKEND, name="twice", swiglu=lambda: SwiGLUOp(_twice),
                                      linear=lambda dtype, swiglu, quant: MatMulLinear(BACKEND, dtype, swiglu, quant),
                                      recomputable=False)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(backends.REGISTRY, "twice", "half_swiglu")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    mlp = PackedSwiGLUMLP(16, 24, backend="twice")
    x, x64 = to_tensor(np.random.default_rng(0).standard_normal((3, 16)), "float32")
    gate_up, down = to_f64(mlp.gate_up_proj.weight), to_f64(mlp.down_proj.weight)
    assert mlp.backend.name == "twice"
    assert_close(mlp(x), 2 * ref_swiglu(x64 @ gate_up.T) @ down.T, "float32", "new backend")
    with pytest.raises(ValueError, match="expected a backend MindSpore can recompute .* got twice"):
        FFNBlock(16, 24, backend="twice", mlp=mlp, recompute="full")


def test_the_library_answers_by_name():
    """Dtypes, paths and ops cross the ctypes boundary by name; these fail when Python and C++ drift apart."""
    assert kernels.dtypes() == DTYPE_NAMES == tuple(kernels.NP_DTYPES)
    assert kernels.paths() == ("skinny", "onednn", "onednn-swapped", "amx", "panel") == tuple(kernels.tuning()["paths"])
    lib = ctypes.CDLL(kernels.library_path())
    for op in kernels.ops():  # every counted op is an aot op with the functions MindSpore needs
        for suffix in ("", "InferShape", "InferType"):
            assert hasattr(lib, op + suffix), op + suffix
    assert set(kernels.launches()) == set(kernels.ops())
    with pytest.raises(ValueError, match="expected a dtype in"):
        kernels.path("float64", 8)


def test_the_tuning_table_is_what_the_paths_follow():
    table = kernels.tuning()
    for dtype in DTYPE_NAMES:
        swapped, amx = table["swapped_tokens"][dtype], table["amx_tokens"][dtype]
        for quant in (None, "int8", "int8-g128"):  # per-row int8: its skinny range, checked before amx
            per_row = quant == "int8"  # (int8-g128 takes the paths of dtype's weights)
            panel = table["panel_tokens_int8" if per_row else "panel_tokens"][dtype]
            for n in range(1, 600):
                if per_row and n <= table["skinny_max_tokens_int8"][dtype]:
                    want = "skinny"
                elif table["amx_available"] and amx and amx[0] <= n <= amx[1]:
                    want = "amx"
                elif panel and panel[0] <= n <= panel[1]:
                    want = "panel"
                elif n <= table["skinny_max_tokens"][dtype]:
                    want = "skinny"
                elif per_row and table["onednn_int8_weights"][dtype]:
                    want = "onednn"  # oneDNN's weight decompression takes int8 as the weights operand only
                elif swapped and swapped[0] <= n <= swapped[1]:
                    want = "onednn-swapped"
                else:
                    want = "onednn"
                got = kernels.path(dtype, n, quant)
                assert got == want, (dtype, n, quant, got)
    assert kernels.path("bfloat16", 4, "int8") == "skinny"  # where the int8 table differs from the 16-bit one
    assert kernels.path("bfloat16", 4) == ("amx" if table["amx_available"] else "skinny")


FAKE_DNNL = r"""
typedef struct { int major, minor, patch; const char *hash; unsigned cpu_runtime, gpu_runtime; } dnnl_version_t;
static const dnnl_version_t v = {%d, %d, %d, "fake", %du, 0u};
const dnnl_version_t *dnnl_version(void) { return &v; }
"""

PROBE = r"""
import warnings, numpy as np
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    from ms_swiglu.backends.cpu import kernels
    status = kernels.onednn(); kernels.onednn()
print("STATUS", status)
print("WARNINGS", len([w for w in caught if "ms_swiglu: oneDNN unavailable" in str(w.message)]))
print("PATHS", kernels.path("float32", 512), kernels.path("bfloat16", 1024))
rng = np.random.default_rng(0)
x, w = rng.standard_normal((64, 40)).astype(np.float32), rng.standard_normal((30, 40)).astype(np.float32)
y = kernels.linear(x, w, np.empty((64, 15), np.float32), "float32", swiglu=True)
ref = (x.astype(np.float64) @ w.T.astype(np.float64))
g, u = ref[:, :15], ref[:, 15:]
print("ERR", float(np.abs(y - g / (1 + np.exp(-g)) * u).max()))
"""


@pytest.mark.parametrize("version, runtime, why", [
    ((3, 13, 2), 8, "oneDNN 3.13.2 at {lib}, expected 3.9 <= version < 3.11"),  # threadpool_iface gained wait()
    ((3, 8, 0), 8, "oneDNN 3.8.0 at {lib}, expected 3.9 <= version < 3.11"),  # older than the headers
    ((4, 0, 0), 8, "oneDNN 4.0.0 at {lib}, expected 3.9 <= version < 3.11"),
    ((3, 10, 1), 4, "oneDNN 3.10.1 at {lib}, expected a THREADPOOL build (cpu runtime 8), got cpu runtime 4"),
    (None, None, "cannot load {lib}"),
])
def test_a_onednn_outside_the_headers_abi_is_refused_and_the_kernels_fall_back(tmp_path, version, runtime, why):
    lib = tmp_path / "libdnnl.so.3"
    if version:
        (tmp_path / "fake.c").write_text(FAKE_DNNL % (*version, runtime))
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "fake.c")], check=True)
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, MS_SWIGLU_ONEDNN=str(lib)))
    assert r.returncode == 0, r.stderr[-2000:]
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines() if line.split(" ")[0].isupper())
    assert out["STATUS"].startswith("unavailable: " + why.format(lib=lib)), out["STATUS"]
    assert out["WARNINGS"] == "1"  # one clear warning, however often it is asked
    assert out["PATHS"] == "skinny skinny"  # every token count on the package's own kernels (amx: 3..512 only)
    assert float(out["ERR"]) < 1e-4


NO_REFERENCE = r"""
import numpy as np
from ms_swiglu.backends.cpu import kernels
op = lambda name, w, s: kernels.op_name(name, "int8" if s.ndim < w.ndim else "int8-g128")  # its format's op
from ms_swiglu.checkpoint import to_bf16_bits
from ms_swiglu.quant.int8 import quantize_int8
rng = np.random.default_rng(0)
w, experts = rng.standard_normal((96, 256)).astype(np.float32), rng.standard_normal((4, 96, 256)).astype(np.float32)
ids = (np.arange(200, dtype=np.int32) % 4).reshape(100, 2)  # 50 rows per expert
quantized = {g: (quantize_int8(w, g), quantize_int8(experts, g)) for g in (None, 128)}
for dtype in kernels.dtypes():
    np_dtype = kernels.NP_DTYPES[dtype]
    as_dtype = to_bf16_bits if dtype == "bfloat16" else (lambda a: a.astype(np_dtype))
    for n in (24, 100, 300):
        x = as_dtype(rng.standard_normal((n, 256)).astype(np.float32))
        for path in kernels.paths():
            with kernels.forced_path(path):
                kernels.run("Linear", x, as_dtype(w), np.zeros((n, 96), np_dtype), dtype=dtype)
                for (q, s), (qe, se) in quantized.values():
                    kernels.run(op("Linear", q, s), x, q, s, np.zeros((n, 96), np_dtype), dtype=dtype)
                    kernels.run(op("GateUpSwiglu", q, s), x, q, s, np.zeros((n, 48), np_dtype), dtype=dtype)
                    if n == 100:
                        kernels.run(op("MoeGateUpSwiglu", qe, se), x, ids, qe, se, np.zeros((200, 48), np_dtype), dtype=dtype)
print("DONE")
"""


DECOMPRESSION = r"""
import numpy as np
from ms_swiglu.backends.cpu import kernels
op = lambda name, w, s: kernels.op_name(name, "int8" if s.ndim < w.ndim else "int8-g128")  # its format's op
from ms_swiglu.checkpoint import to_bf16_bits
from ms_swiglu.quant.int8 import quantize_int8
rng = np.random.default_rng(0)
q, s = quantize_int8(rng.standard_normal((96, 256)).astype(np.float32))
top = kernels.tuning()["onednn_int8_weights_max_tokens"]
for dtype in kernels.dtypes():
    np_dtype = kernels.NP_DTYPES[dtype]
    for n in (top, top + 1):
        x = rng.standard_normal((n, 256)).astype(np.float32)
        x = to_bf16_bits(x) if dtype == "bfloat16" else x.astype(np_dtype)
        print("CASE", dtype, n, kernels.path(dtype, n, "int8"), flush=True)
        kernels.run(op("Linear", q, s), x, q, s, np.zeros((n, 96), np_dtype), dtype=dtype)
        kernels.run(op("GateUpSwiglu", q, s), x, q, s, np.zeros((n, 48), np_dtype), dtype=dtype)
"""


def test_int8_weights_take_onednn_decompression_up_to_its_tokens_then_widened():
    """Per-row int8 weights on the oneDNN path: its weight decompression (the weights operand s8) up to
    onednn_int8_weights_max_tokens where oneDNN has it for x's dtype; one token more, the rows widened to the
    dtype oneDNN takes (ONEDNN_VERBOSE's exec lines, one per GEMM: QLinear's one, QGateUpSwiglu's gate and up)."""
    out = subprocess.run([sys.executable, "-c", DECOMPRESSION], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, ONEDNN_VERBOSE="1"))
    assert out.returncode == 0, out.stderr[-2000:]
    weights, case = {}, None
    for line in out.stdout.splitlines():
        if line.startswith("CASE "):
            case = tuple(line.split()[1:])
            weights[case] = []
        elif line.startswith("onednn_verbose,v1,primitive,exec") and case:
            weights[case].append(line.split(" wei:")[1].split(":")[0])
    table, checked = kernels.tuning(), 0
    for (dtype, n, path), kinds in weights.items():
        if path != "onednn" or not table["onednn_int8_weights"][dtype]:
            continue  # (the amx path's range, on a CPU with AMX; or no decompression for this dtype)
        below = int(n) <= table["onednn_int8_weights_max_tokens"]
        assert len(kinds) == 3 and (set(kinds) == {"s8"} if below else "s8" not in kinds), (dtype, n, kinds)
        checked += 1
    assert checked >= 4, weights  # float32 and float16 x at least, on either side


def test_the_kernels_never_run_a_onednn_reference_implementation():
    """oneDNN answers a matmul it has no fast kernel for with "ref:any" (plain loops): on an AVX2-only AMD EPYC,
    float32 x and int8 weights into bfloat16 took 4.3 s for 16 x 4096 x 1024, 1000x its brg_matmul:avx2 into
    float32. Every GEMM the ops run through oneDNN (each dtype, per-row and grouped int8, every forced path, MoE
    experts) is one of its optimized implementations (ONEDNN_VERBOSE's exec lines), on whatever CPU this is."""
    out = subprocess.run([sys.executable, "-c", NO_REFERENCE], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, ONEDNN_VERBOSE="1"))
    assert out.returncode == 0 and "DONE" in out.stdout, out.stderr[-2000:]
    runs = [line.split(",")[6] for line in out.stdout.splitlines() if line.startswith("onednn_verbose,v1,primitive,exec")]
    assert len(runs) >= 24, len(runs)  # oneDNN ran (at least the float32 GEMMs on its paths)
    assert not [r for r in runs if r.startswith("ref")], sorted(set(runs))
