"""What Ascend runs of the ``ascend`` target's graphs: one row per op the target emits. No MindSpore import.

Each row: the chips whose CANN aclnn document lists the op and the dtypes it takes there, the document, and which
runtime path has evidence of taking the op in MindSpore 2.10:

- ``mindspore``: MindSpore's own runtime on Ascend (``mindspore.load`` + ``nn.GraphCell``, GRAPH_MODE, jit_level
  O0/O1, the default: kernel by kernel). Evidence: the op's aclnn kernel class in the wheel's
  ``lib/plugin/libmindspore_ops_ascend.so``.
- ``ge``: everything that compiles the graph through GE: MindSpore Lite's ``converter_lite --optimize=ascend_oriented``,
  AIR + ATC, jit_level O2. Evidence: the op's GE adapter (``OpAdapter<...>``) in the wheel's
  ``lib/plugin/ascend/libmindspore_ascend_res_manager.so``; a GE prototype name alone is none.

The exporter refuses an ``ascend`` export whose ops a chip or dtype lacks (and names the ``portable`` target,
whose MatMul/SiLU/Mul every path and chip takes), and the kit states which paths have evidence for every op of
its graph. None of this was run on an NPU: it is what the documents and the wheel say.
"""
import dataclasses

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
              note="int8 weights; per-group scales [ceil(K/g), N] with g a multiple of 32 in [32, K-1]; "
                   "k, n in [1, 65535]; no empty tensor"),
    OpSupport("GroupedMatmulV4", {A2: ALL, A3: ALL}, _DOCS.format("aclnnGroupedMatmulV4", "aclnnGroupedMatmulV4"),
              mindspore=f"{OPS_ASCEND}: grouped_matmul_v4::GroupedMatmulV4Ascend (aclnnGroupedMatmulV4)",
              note="int8 weights (A16W8): float16/bfloat16 activations, per-channel antiquant scales [E, N] only "
                   "(per-group is for int4); 310P: listed, with dtypes only in V5's document (float16, weights in NZ "
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
    """``{path: {"evidence": bool, "missing": [ops without evidence]}}`` for a graph of ``op_types``."""
    found = [s for op, s in SUPPORT.items() if op in op_types]
    return {path: {"evidence": not [s.op for s in found if getattr(s, path) is None],
                   "missing": [s.op for s in found if getattr(s, path) is None]} for path in PATHS}


def table():
    """The support table as rows of text (docs/ascend.md is written from it)."""
    rows = ["| op | Atlas A2 | Atlas A3 | Atlas 300I/inference (310P) | MindSpore runtime | GE (Lite, ATC) | notes |",
            "|---|---|---|---|---|---|---|"]
    for s in SUPPORT.values():
        cells = [", ".join(s.dtypes.get(chip, ())) or "not listed" for chip in (A2, A3, P310)]
        rows.append(f"| `{s.op}` | {' | '.join(cells)} | {s.mindspore} | {s.ge or 'no adapter found'} | {s.note} |")
    return rows
