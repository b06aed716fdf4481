"""What Ascend runs of the ``ascend`` target's graphs: one row per op the target emits. No MindSpore import.

Each row: the chips whose CANN aclnn document lists the op and the dtypes it takes there, the document, and which
runtime path has evidence of taking the op in MindSpore 2.10:

- ``mindspore``: MindSpore's own runtime on Ascend (``mindspore.load`` + ``nn.GraphCell``, GRAPH_MODE, jit_level
  O0/O1, the default: kernel by kernel). Evidence: the op's aclnn kernel class in the wheel's
  ``lib/plugin/libmindspore_ops_ascend.so``.
- ``ge``: everything that compiles the graph through GE: MindSpore Lite's ``converter_lite --optimize=ascend_oriented``,
  AIR + ATC, jit_level O2. Evidence: the op's GE adapter (``OpAdapter<...>``) in the wheel's
  ``lib/plugin/ascend/libmindspore_ascend_res_manager.so``, read from the installed wheel for every op of every
  graph (:func:`ge_adapters`); a GE prototype name alone is none.

The exporter refuses an ``ascend`` export whose ops a chip or dtype lacks (and names the ``portable`` target,
whose MatMul/SiLU/Mul every path and chip takes), and the kit states which paths have evidence for every op of
its graph. None of this was run on an NPU: it is what the documents and the wheel say.
"""
import dataclasses
import functools
import importlib.util
import mmap
import os
import re

A2, A3, P310 = "atlas-a2", "atlas-a3", "atlas-310p"
ALL = ("float32", "float16", "bfloat16")
F16 = ("float16",)
OPS_ASCEND = "lib/plugin/libmindspore_ops_ascend.so"
GE_ADAPTERS = "lib/plugin/ascend/libmindspore_ascend_res_manager.so"


@dataclasses.dataclass(frozen=True)
class OpSupport:
    """One op of the ``ascend`` target: ``dtypes`` per chip key (activations), the aclnn document, and the
    evidence per runtime path (None: no evidence found)."""

    op: str
    dtypes: dict
    document: str
    mindspore: str
    ge: str = None
    note: str = ""

    def runs(self, chip, dtype):
        return dtype in self.dtypes.get(chip, ())


_DOCS = "CANN aclnn API reference (hiascend.com, aolapi/context/{}.md; hicann/ops-* docs/{}.md)"

# The ops that carry the target: the rest of its graphs (Cast, Reshape, Add, Mul, MatMul, Softmax, Sort, ...) are
# MindSpore's common ops with both an aclnn kernel and a GE adapter on every Ascend chip.
SUPPORT = {s.op: s for s in (
    OpSupport("Swiglu", {A2: ALL, A3: ALL, P310: ("float32", "float16")}, _DOCS.format("aclnnSwiGlu", "aclnnSwiGlu"),
              mindspore=f"{OPS_ASCEND}: kernel::SwigluAscend (aclnnSwiGlu)",
              note="split dim even; no empty tensor; 310P: shapes 64-byte aligned; A3 from CANN 8.2.RC1"),
    OpSupport("WeightQuantBatchMatmul", {A2: ("float16", "bfloat16"), A3: ("float16", "bfloat16"), P310: F16},
              _DOCS.format("aclnnWeightQuantBatchMatmulV2", "aclnnWeightQuantBatchMatmulV2"),
              mindspore=f"{OPS_ASCEND}: WeightQuantBatchMatmulV2Ascend (aclnnWeightQuantBatchMatmulV2)",
              ge=f"{GE_ADAPTERS}: OpAdapter<WeightQuantBatchMatmulV2>",
              note="int8 weights [N, K] (transposed); int4 (qint4x2) [K, N/2], signed, the even index in the low "
                   "nibble (MindSpore's tests/st/ops/ascend/test_weight_quant_int4.py), antiquant (w + offset) * "
                   "scale; per-group scales and offsets [ceil(K/g), N] with g a multiple of 32 in [32, K-1]; "
                   "k, n in [1, 65535]; no empty tensor"),
    OpSupport("DynamicQuantExt", {A2: ("float16", "bfloat16"), A3: ("float16", "bfloat16")},
              _DOCS.format("aclnnDynamicQuant", "aclnnDynamicQuant"),
              mindspore=f"{OPS_ASCEND}: AclnnDynamicQuantExtKernelMod (aclnnDynamicQuant)",
              ge=f"{GE_ADAPTERS}: OpAdapter<DynamicQuant>",
              note="per token: scale = max|x| / 127 (float32 [T]), y = round(x / scale) int8"),
    OpSupport("QuantBatchMatmul", {A2: ("float16", "bfloat16"), A3: ("float16", "bfloat16")},
              _DOCS.format("aclnnQuantMatmulV4", "aclnnQuantMatmulV4"),
              mindspore=f"{OPS_ASCEND}: quant_batch_matmul::QuantMatmulV4Ascend (aclnnQuantMatmulV4)",
              ge=f"{GE_ADAPTERS}: OpAdapter<QuantBatchMatmulV3>",
              note="int8 x int8, int32 accumulation: (x1 x2 + bias) * scale * pertoken; float32 scale [N] with "
                   "a float32 per-token scale [M] for float16 outputs, with or without one for bfloat16"),
    OpSupport("QuantV2", {A2: ALL, A3: ALL}, _DOCS.format("aclnnAscendQuant", "aclnnAscendQuantV3"),
              mindspore=f"{OPS_ASCEND}: quant_v2::QuantV2Ascend (aclnnAscendQuant)",
              ge=f"{GE_ADAPTERS}: OpAdapter<AscendQuantV2>",
              note="y = round(x * scale + offset) saturated to int8; scale and offset along the last dim"),
    OpSupport("GroupedMatmulV4", {A2: ALL, A3: ALL}, _DOCS.format("aclnnGroupedMatmulV4", "aclnnGroupedMatmulV4"),
              mindspore=f"{OPS_ASCEND}: grouped_matmul_v4::GroupedMatmulV4Ascend (aclnnGroupedMatmulV4)",
              note="int8 weights (A16W8): float16/bfloat16 activations, per-channel antiquant scales [E, N] only "
                   "(per-group is for int4: A16W4, qint4x2 weights [E, K, N/2], scales and offsets [E, K/g, N]); "
                   "A8W8: int8 rows, per-channel scales [E, N] (bfloat16 for bfloat16 outputs, float32 for "
                   "float16) and per-row scales; 310P: listed, with dtypes only in V5's document (float16, weights in NZ "
                   "format, which this graph does not pass)"),
    OpSupport("MoeInitRoutingV2", {A2: ALL, A3: ALL}, _DOCS.format("aclnnMoeInitRoutingV2", "aclnnMoeInitRoutingV2"),
              mindspore=f"{OPS_ASCEND}: moe_init_routing_v2::MoeInitRoutingV2Ascend (aclnnMoeInitRoutingV2)",
              note="GE has an adapter for MoeInitRouting (v1) only; 310P: drop_pad_mode 0, H % 32 == 0"),
    OpSupport("InnerMoeTokenUnpermute", {A2: ALL, A3: ALL},
              _DOCS.format("aclnnMoeTokenUnpermute", "aclnnMoeTokenUnpermute"),
              mindspore=f"{OPS_ASCEND}: moe_token_unpermute::InnerMoeTokenUnpermuteAscend (aclnnMoeTokenUnpermute)",
              note="top_k <= 512; 310P is listed as not supported"),
    # expert parallelism (``export --ep-size``): the dispatchers' collectives and the experts' sink group
    OpSupport("AllReduce", {A2: ALL, A3: ALL}, "CANN HCCL API reference (hiascend.com, HcclAllReduce)",
              mindspore=f"{OPS_ASCEND}: kernel::HcomAllReduceKernel (HCCL)",
              ge=f"{GE_ADAPTERS}: OpAdapter<HcomAllReduce>",
              note="sum; the world group hccl_world_group; not run under HCCL by this package's checks"),
    OpSupport("AllGather", {A2: ALL, A3: ALL}, "CANN HCCL API reference (hiascend.com, HcclAllGather)",
              mindspore=f"{OPS_ASCEND}: kernel::HcomAllGatherKernel (HCCL)",
              ge=f"{GE_ADAPTERS}: OpAdapter<HcomAllGather>",
              note="sharded tokens: every rank's rows and counts, equal sizes (padded)"),
    OpSupport("NanToNum", {A2: ALL, A3: ALL}, _DOCS.format("aclnnNanToNum", "aclnnNanToNum"),
              mindspore=f"{OPS_ASCEND}: nan_to_num::NanToNumAscend (aclnnNanToNum)",
              ge=f"{GE_ADAPTERS}: OpAdapter<NanToNum>",
              note="zeroes the rows of the experts' sink group, which GroupedMatmulV4 leaves uncomputed"),
)}

PATHS = {"mindspore": "MindSpore's runtime (mindspore.load + nn.GraphCell, jit_level O0/O1)",
         "ge": "GE (MindSpore Lite converter_lite, AIR + ATC, jit_level O2)"}


def refusal(op_types, chip, dtype):
    """Why an ``ascend`` graph of ``op_types`` cannot run on ``chip`` (a key) in ``dtype``, or None."""
    bad = [s.op for op, s in SUPPORT.items() if op in op_types and not s.runs(chip, dtype)]
    if not bad:
        return None
    return (f"expected ops that CANN documents for {chip} in {dtype}, got {', '.join(bad)} (not listed for it; "
            f"ms_swiglu.backends.ascend_support)")


def paths(op_types):
    """``{path: {"evidence": bool, "missing": [ops without evidence]}}`` for a graph of ``op_types``: MindSpore's
    runtime by the support table's kernels (a Custom aot op is bound to the exporting host), GE by the wheel's
    adapters, op by op (:func:`ge_adapters`; all of them missing where the wheel has no adapter library)."""
    kernels = [s.op for op, s in SUPPORT.items() if op in op_types and s.mindspore is None]
    adapters = ge_adapters() or frozenset()
    missing = {"mindspore": kernels + [op for op in op_types if op == "Custom"],
               "ge": [op for op in op_types if op not in adapters]}
    return {path: {"evidence": not missing[path], "missing": missing[path]} for path in PATHS}


# --- GE adapters, read from the wheel ------------------------------------------------------------------------------
#
# MindSpore registers an adapter per primitive name (REG_ADPT_DESC(<id>, <primitive name>, ADPT_DESC(<GE op>)) in
# mindspore/ccsrc/.../op_adapter/op_declare/*.cc); the stripped .so keeps the adapters' RTTI names,
# ``OpAdapter<mindspore::device::ascend::cz<GE op>>``, not the primitive names. A primitive is taken to have an adapter
# when a GE op class of its own name is there (most are registered so), or when its row below names the class its
# adapter is declared with. Identity is wrong only for a primitive without an adapter whose name is the GE op class
# of another primitive's adapter: NOT_THEIR_OWN lists those of MindSpore 2.10 (found by decoding the wheel's
# registrations: the GE op classes that no primitive of their name registers, which are MindSpore primitive names
# too); none is an op of this package's graphs.
_DECLARED = ("mindspore/ccsrc/plugin/res_manager/ascend/op_adapter/op_declare/{}.cc (mindspore-ai/mindspore_test "
             "@a05ce588)")
RENAMED = {  # primitive -> (the GE op class of its adapter, where MindSpore declares it)
    "SiLU": ("Swish", _DECLARED.format("nonlinear_fuc_ops_declare")),  # REG_ADPT_DESC(Swish, kSiLUOpName, ...)
    "MatMul": ("MatMulV2", _DECLARED.format("matrix_calculation_ops_declare")),  # (MatMulV2, kPrimMatMul->name())
    "Softmax": ("SoftmaxV2", _DECLARED.format("nn_norm_ops_declare")),  # (Softmax, kNameSoftmax, SoftmaxV2)
    "GatherD": ("GatherElements", _DECLARED.format("selection_ops_declare")),  # (GatherD, kNameGatherD, ...)
    "Gather": ("GatherV2", _DECLARED.format("selection_ops_declare")),  # (Gather, kPrimGather->name(), GatherV2)
    "CumSum": ("Cumsum", _DECLARED.format("selection_ops_declare")),  # (CumSum, kNameCumSum, Cumsum)
    "Argmax": ("ArgMaxV2", _DECLARED.format("elewise_calculation_ops_declare")),  # (ArgMax, kNameArgmax, ...)
    "QuantBatchMatmul": ("QuantBatchMatmulV3", _DECLARED.format("quantize_ops_declare")),
    "WeightQuantBatchMatmul": ("WeightQuantBatchMatmulV2", _DECLARED.format("quantize_ops_declare")),
    "DynamicQuantExt": ("DynamicQuant", _DECLARED.format("quantize_ops_declare")),
    "QuantV2": ("AscendQuantV2", _DECLARED.format("quantize_ops_declare")),  # kNameAscendQuantV2 = "QuantV2"
    "Depend": ("IdentityN", _DECLARED.format("array_ops_declare")),  # (IdentityNDepend, kNameDepend, IdentityN)
    "MakeTuple": ("IdentityN", _DECLARED.format("array_ops_declare")),  # (IdentityNMakeTuple, ...)
    "TupleGetItem": ("IdentityN", _DECLARED.format("array_ops_declare")),  # (IdentityNTupleGetItem, ...)
    "Load": ("Identity", _DECLARED.format("array_ops_declare")),  # (IdentityLoad, kNameLoad, Identity)
    "TensorShape": ("Shape", _DECLARED.format("array_ops_declare")),  # (TensorShape, kNameTensorShape, Shape)
    "UpdateState": ("NoOp", _DECLARED.format("no_op_declare")),  # (NoOpUpdateState, kNameUpdateState, NoOp)
    "AllReduce": ("HcomAllReduce", _DECLARED.format("hcom_ops_declare")),  # kNameAllReduce = "AllReduce"
    "AllGather": ("HcomAllGather", _DECLARED.format("hcom_ops_declare")),  # kNameAllgather = "AllGather"
}
# GE op classes of other primitives' adapters that are also names of MindSpore primitives without one (GatherV2 is
# Gather's, WeightQuantBatchMatmulV2 WeightQuantBatchMatmul's, DynamicQuant DynamicQuantExt's, Switch GeSwitch's)
NOT_THEIR_OWN = frozenset({"DynamicQuant", "GatherV2", "Scatter", "SparseApplyAdadelta", "Switch",
                           "WeightQuantBatchMatmulV2"})
_RTTI = re.compile(rb"OpAdapterINS\d_(\d+)cz(\w+)")  # OpAdapter<...::cz<GE op>>: the length counts "cz"


def adapter_library():
    """The path of the installed wheel's GE adapter library, or None (no MindSpore, or a wheel without it). No
    MindSpore import: the package is found by importlib."""
    spec = importlib.util.find_spec("mindspore")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, GE_ADAPTERS)
        if os.path.isfile(path):
            return path
    return None


@functools.lru_cache(maxsize=None)
def ge_adapters():
    """The MindSpore primitive names with a GE adapter in the installed wheel (a frozenset; it holds the GE op
    class names too, which is harmless for a lookup by primitive name), or None without the library."""
    path = adapter_library()
    if path is None:
        return None
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            classes = {m.group(2)[:int(m.group(1)) - 2].decode() for m in _RTTI.finditer(data)}
        finally:
            try:
                data.close()
            except BufferError:  # a signal's exception in the scan: its traceback holds a match; freed with it
                pass
    return frozenset((classes - NOT_THEIR_OWN) | {op for op, (ge, _) in RENAMED.items() if ge in classes})


# The chips CANN documents GE's MoE ops for (aclnnMoeInitRouting, aclnnMoeFinalizeRouting, aclnnMoeComputeExpertTokens,
# aclnnMoeGatingTopKSoftmax, aclnnGroupedMatmul: Atlas A2, and A3 for the routing ops and the GroupedMatmul kernel's
# later versions; 310P, 910A and 310B are listed as not supported): a ``ge`` graph holding one is refused elsewhere.
GE_MOE_CHIPS = {op: (A2, A3) for op in ("MoeGatingTopKSoftmax", "MoeInitRouting", "MoeComputeExpertTokens",
                                         "GroupedMatmul", "MoeFinalizeRouting")}


def ge_refusal(op_types, chip):
    """Why a ``ge`` graph of ``op_types`` cannot run on ``chip`` (a key), or None."""
    bad = [op for op in op_types if chip not in GE_MOE_CHIPS.get(op, (chip,))]
    if not bad:
        return None
    return (f"expected ops that CANN documents for {chip}, got {', '.join(bad)} (documented for "
            f"{', '.join(GE_MOE_CHIPS[bad[0]])} only; ms_swiglu.backends.ascend_support)")


def table():
    """The support table as rows of text (docs/ascend.md is written from it)."""
    rows = ["| op | Atlas A2 | Atlas A3 | Atlas 300I/inference (310P) | MindSpore runtime | GE (Lite, ATC) | notes |",
            "|---|---|---|---|---|---|---|"]
    for s in SUPPORT.values():
        cells = [", ".join(s.dtypes.get(chip, ())) or "not listed" for chip in (A2, A3, P310)]
        rows.append(f"| `{s.op}` | {' | '.join(cells)} | {s.mindspore} | {s.ge or 'no adapter found'} | {s.note} |")
    return rows
