"""The ge target: a sparse MoE graph of ops that have a GE adapter in the MindSpore 2.10 wheel. Each family's export
holds only such ops (read from the real wheel); the ge Cells, with NumPy stand-ins of GE's MoE primitives written
from their documented formulas, equal the float32 reference; their expert FLOPs are k/E of the dense portable
graph's; and the wheel's adapter list reads as it should."""
import json
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest

from ms_swiglu.backends import ascend_support, ge
from ms_swiglu.checkpoint.load import load_block
from ms_swiglu.export.mindir import gemm_flops
from conftest import assert_close, cli_batch
from hf_checkpoint import MOE_LAYER, make_checkpoint, moe_families
from moe_reference import ref_block, stored_params

H, I, E, TOP_K, SHAPE = 32, 24, 8, 2, (2, 3)
FAMILIES = moe_families(I, n_group=4)

# the ops of the ascend target and MindSpore's functional forms that have no GE adapter
NO_ADAPTER = ("MoeInitRoutingV2", "GroupedMatmulV4", "Swiglu", "InnerMoeTokenUnpermute", "TopkExt", "ArgSort",
              "SumExt", "AddExt", "Zeros", "MatMulExt", "Muls")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """{family: (folder, stored tensors)}."""
    root = tmp_path_factory.mktemp("ge_families")
    return {f: (str(root / f), make_checkpoint(root / f, model_type=f, hidden=H, experts=E, top_k=TOP_K, seed=41,
                                               **kw)) for f, kw in FAMILIES.items()}


@pytest.fixture(scope="module")
def exports(ckpts, tmp_path_factory):
    """One process of `ms-swiglu export` commands: each family's MoE layer on ge at a static shape, Mixtral's on
    portable at the same shape, DeepSeek-V3's dense layer 0 on ge (dynamic), and the ge refusals.
    {name: (Ran, folder)}."""
    root = tmp_path_factory.mktemp("ge_exports")
    static = ["--static-shape", ",".join(map(str, SHAPE))]

    def export(family, out, *extra, layer=None):
        return ["export", "--checkpoint", ckpts[family][0], "--layer", MOE_LAYER[family] if layer is None else layer,
                "--output-dir", root / out, *extra]

    cases = {f"ge/{f}": export(f, f"ge-{f}", "--target", "ge", *static) for f in FAMILIES}
    cases.update({
        "portable/mixtral": export("mixtral", "portable-mixtral", "--target", "portable", *static),
        "ge/dense": export("deepseek_v3", "ge-dense", "--target", "ge", layer=0),
        "refused/dynamic": export("mixtral", "r-dynamic", "--target", "ge"),
        "refused/ep": export("mixtral", "r-ep", "--target", "ge", "--ep-size", "2"),
        "refused/int8": export("mixtral", "r-int8", "--target", "ge", "--quantize", "int8", *static),
        "refused/310p": export("qwen3_moe", "r-310p", "--target", "ge", "--chip", "atlas-310p", *static),
    })
    runs = cli_batch(list(cases.values()))
    return {name: (r, root / cases[name][6]) for name, r in zip(cases, runs)}


def _manifest(folder):
    return json.loads((folder / "manifest.json").read_text())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_exports_only_ops_with_a_ge_adapter(exports, family):
    r, folder = exports[f"ge/{family}"]
    assert r.returncode == 0, r.stderr
    m = _manifest(folder)
    found, adapters = set(m["op_types"]), ascend_support.ge_adapters()
    assert found <= adapters, sorted(found - adapters)
    assert not found & set(NO_ADAPTER) and found <= ge.GE_OPS
    routing = {"MoeInitRouting", "MoeComputeExpertTokens", "GroupedMatmul", "MoeFinalizeRouting"}
    assert routing <= found and "BatchMatMul" not in found
    assert ("MoeGatingTopKSoftmax" in found) == (family != "deepseek_v3")
    assert m["runtime_paths"]["ge"] == {"evidence": True, "missing": []}
    assert m["inputs"][0]["shape"] == [*SHAPE, H] and m["checked"]["golden"] == "cpu twin"
    script = (folder / "convert_lite.sh").read_text()
    assert "converter_lite --fmk=MINDIR" in script and "MS_SWIGLU_UNPROVEN" not in script  # GE takes it as portable


def test_dense_layers_and_the_portable_moe_as_the_wheel_says(exports):
    """A dense ge graph (dynamic shape) has adapters for every op; the portable MoE graph's SumExt and Muls have
    none, and its runtime paths say so."""
    r, folder = exports["ge/dense"]
    assert r.returncode == 0, r.stderr
    assert set(_manifest(folder)["op_types"]) <= ascend_support.ge_adapters()
    r, folder = exports["portable/mixtral"]
    assert r.returncode == 0, r.stderr
    m = _manifest(folder)
    assert m["runtime_paths"]["ge"] == {"evidence": False, "missing": [op for op in m["op_types"]
                                                                      if op in ("Muls", "SumExt")]}
    assert {"Muls", "SumExt", "BatchMatMul"} <= set(m["op_types"])


@pytest.mark.parametrize("case, message", [
    ("dynamic", "--target ge: expected --static-shape B,S for a MoE layer"),
    ("ep", "--ep-size: expected --target ascend or portable, got ge"),
    ("int8", "backend ge, MoE experts: expected float weights, got int8"),
    ("310p", "--target ge --chip atlas-310p: expected ops that CANN documents for atlas-310p, got GroupedMatmul"),
])
def test_what_the_ge_target_refuses(exports, case, message):
    r, folder = exports[f"refused/{case}"]
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not folder.exists() or not list(folder.iterdir())


def test_expert_flops_are_k_over_e_of_the_dense_graph(exports):
    """From the exported graphs' shapes: the ge graph's GroupedMatmuls against the portable graph's BatchMatMuls
    (the same Mixtral layer and shape), and the figure for a Qwen3-30B-A3B-shaped layer (H 2048, I 768, E 128, k 8)."""
    dense = gemm_flops(str(next(exports["portable/mixtral"][1].glob("*.mindir"))))
    sparse = gemm_flops(str(next(exports["ge/mixtral"][1].glob("*.mindir"))))
    want = ge.expert_flops(H, I, E, TOP_K)
    assert dense["BatchMatMul"] == want["dense"] and sparse["GroupedMatmul"] == want["ge"]
    assert sparse["GroupedMatmul"] / dense["BatchMatMul"] == TOP_K / E
    assert sparse["MatMul"] == dense["MatMul"] == 2 * H * E  # the router, the same in both
    big = ge.expert_flops(2048, 768, 128, 8)
    assert big == {"dense": 1_207_959_552, "ge": 75_497_472} and big["ge"] / big["dense"] == 8 / 128


class _DocumentedGeOps:
    """NumPy stand-ins for GE's MoE primitives (no CPU kernel), each from its documented formula (CANN aclnn
    documents, hiascend.com aolapi/context/aclnn<Op>.md, and their NumPy references in Ascend/op-plugin):

    - MoeGatingTopKSoftmax: softmaxOut = softmax(x, -1); yOut, expertIdxOut = topK(softmaxOut, k);
      rowIdxOut = arange(N k).reshape(k, N).T (not renormalised).
    - MoeInitRouting: expandedExpertIdx, sortedRowIdx = keyValueSort(expertIdx, rowIdx) (stable);
      expandedRowIdx[sortedRowIdx[i]] = i; expandedX[i] = x[sortedRowIdx[i] % N], the first min(N, activeNum) k.
    - MoeComputeExpertTokens: out[e] = the number of sortedExperts <= e (each expert's last row, plus one).
    - GroupedMatmul (split_item 3, group_type 0, group_list_type 0): y[gl[e-1]:gl[e]] = x[gl[e-1]:gl[e]] @ w[e].
    - MoeFinalizeRouting: out[i] = x1[i] + x2[i] + sum_k scales[i, k] (expandedX[expandedRowIdx[i + k N]]
      + bias[expandedExpertIdx[i, k]]).

    Each also checks what the Cell hands it: the row order it builds, int64 group ends, the routing weights in the
    activation dtype."""

    def gating(self, x, finished, k):
        assert finished is None
        x = x.asnumpy().astype(np.float64)
        p = np.exp(x - x.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        idx = np.argsort(-p, -1, kind="stable")[:, :k]
        rows = np.arange(idx.size).reshape(k, -1).T
        return (ms.Tensor(np.take_along_axis(p, idx, -1).astype(np.float32)), ms.Tensor(idx.astype(np.int32)),
                ms.Tensor(rows.astype(np.int32)))

    def init_routing(self, x, row_idx, expert_idx, active_num):
        x, rows, ids = x.asnumpy(), row_idx.asnumpy(), expert_idx.asnumpy()
        n, k = ids.shape
        assert active_num == n and np.array_equal(rows, np.arange(n * k).reshape(k, n).T), rows
        order = np.argsort(ids.reshape(-1), kind="stable")
        src = rows.reshape(-1)[order]
        where = np.empty(n * k, np.int32)
        where[src] = np.arange(n * k)
        return (ms.Tensor(x[src[:min(n, active_num) * k] % n]), ms.Tensor(where),
                ms.Tensor(ids.reshape(-1)[order].astype(np.int32)))

    def expert_tokens(self, sorted_experts, num_experts):
        s = sorted_experts.asnumpy()
        return ms.Tensor(np.array([(s <= e).sum() for e in range(num_experts)], np.int32))

    def gmm(self, xs, ws, bias, scale, offset, antiquant_scale, antiquant_offset, group_list):
        assert all(a is None for a in (bias, scale, offset, antiquant_scale, antiquant_offset))
        assert group_list.dtype == ms.int64
        x, w, ends = xs[0].asnumpy(), ws[0].asnumpy(), group_list.asnumpy()
        assert len(ends) == w.shape[0] and ends[-1] == x.shape[0]
        y = np.full((x.shape[0], w.shape[2]), np.nan, np.float32)
        for e, (start, end) in enumerate(zip(np.concatenate([[0], ends[:-1]]), ends)):
            y[start:end] = x[start:end] @ w[e]
        return [ms.Tensor(y)]

    def finalize(self, expanded_x, x1, x2, bias, scales, expanded_row_idx, expanded_expert_idx):
        assert scales.dtype == expanded_x.dtype
        y, out, b, s = expanded_x.asnumpy(), x1.asnumpy().copy(), bias.asnumpy(), scales.asnumpy()
        where, ids = expanded_row_idx.asnumpy(), expanded_expert_idx.asnumpy()
        n, k = ids.shape
        if x2 is not None:
            out += x2.asnumpy()
        for i in range(n):
            for j in range(k):
                out[i] += s[i, j] * (y[where[i + j * n]] + b[ids[i, j]])
        return ms.Tensor(out)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_ge_block_on_documented_ops_equals_the_reference(ckpts, family):
    """The ge MoE block in PYNATIVE_MODE (the router and experts Cells as built, GE's primitives replaced by
    _DocumentedGeOps) against the float64 reference of the family (routers, experts, shared expert), float32."""
    folder, stored = ckpts[family]
    fake = _DocumentedGeOps()
    x = np.random.default_rng(5).standard_normal((7, H)).astype(np.float32)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        block = load_block(folder, MOE_LAYER[family], backend="ge")
        op = block.experts.op
        assert isinstance(op, ge.RoutedExperts) and block.fused_shared
        gmm = op.gmm
        assert (gmm.split_item, gmm.group_type, gmm.transpose_a, gmm.transpose_b) == (3, 0, False, False)
        op.init_routing, op.expert_tokens, op.gmm, op.finalize = (fake.init_routing, fake.expert_tokens, fake.gmm,
                                                                  fake.finalize)
        if family != "deepseek_v3":
            assert isinstance(block.router, ge.GatingSoftmaxTopK)
            block.router.gating = fake.gating
        got = block(ms.Tensor(x))
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)
    want, _ = ref_block(x.astype(np.float64), stored_params(family, stored, MOE_LAYER[family]))
    assert_close(got, want, "float32", family)


def test_the_wheel_adapter_list():
    """Primitives known to have a GE adapter, some under another GE op's name, and some known to have none; the
    reader imports no MindSpore."""
    adapters = ascend_support.ge_adapters()
    assert {"MatMul", "SiLU", "Split", "Mul", "Cast", "Softmax", "GatherD", "ReduceSum", "TopK", "MoeInitRouting",
            "MoeComputeExpertTokens", "GroupedMatmul", "MoeFinalizeRouting", "MoeGatingTopKSoftmax",
            "WeightQuantBatchMatmul", "Depend", "UpdateState"} <= adapters
    assert not adapters & {"MatMulExt", "SumExt", "MoeInitRoutingV2", "GroupedMatmulV4", "Swiglu",
                           "InnerMoeTokenUnpermute", "TopkExt", "Muls", "WeightQuantBatchMatmulV2", "DynamicQuant"}
    assert set(ascend_support.RENAMED) <= adapters  # each declared GE op class is in the wheel
    assert not ge.GE_OPS & ascend_support.NOT_THEIR_OWN and ge.GE_OPS <= adapters
    assert ascend_support.ge_adapters() is adapters  # read once
    paths = ascend_support.paths(["MatMul", "MoeInitRoutingV2", "Swiglu"])
    assert paths["ge"] == {"evidence": False, "missing": ["MoeInitRoutingV2", "Swiglu"]}
    code = ("import sys; from ms_swiglu.backends import ascend_support as a; "
            "assert 'MoeInitRouting' in a.ge_adapters() and 'mindspore' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
