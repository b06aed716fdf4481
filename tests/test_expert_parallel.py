"""Expert parallelism: each rank's experts read from HF folders (float, FP8) and converted files, the experts ops'
slots of other ranks (-1), and real msrun jobs of 2 CPU ranks: the Cells of every MoE family with both
dispatchers against one process, and the CLI's run, convert and export with --ep-size."""
import json
import os
import re
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest
from safetensors import safe_open

from ms_swiglu import quant as formats
from ms_swiglu.backends import resolve
from ms_swiglu.checkpoint import hf
from ms_swiglu.checkpoint.files import SafetensorsFolder
from ms_swiglu.checkpoint.load import load_moe
from ms_swiglu.checkpoint.source import open_checkpoint
from ms_swiglu.errors import InputError
from ms_swiglu.export.graph_checks import CONTROL_FLOW
from ms_swiglu.export.mindir import collectives, op_types
from ms_swiglu.layout import ParallelLayout
from ms_swiglu.parallel import dispatch_cell
from conftest import TOL, assert_close, cli_batch, processes_naming
from ep_worker import BLOCKS, ROWS
from hf_checkpoint import MOE_LAYER, make_checkpoint, moe_families, to_fp8
from moe_reference import rnd, silu

H, I, E, TOP_K = 32, 24, 4, 2
HERE = os.path.dirname(os.path.abspath(__file__))
CKPTS = dict(moe_families(I, n_group=2), mixtral=dict(layers=1))  # Mixtral: the default intermediate size


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ep_families")
    return {f: str(root / f) for f, kw in CKPTS.items()
            if make_checkpoint(root / f, model_type=f, hidden=H, experts=E, top_k=TOP_K, seed=31, **kw)}


# ---- each rank's experts, read as such ---------------------------------------------------------------------------

@pytest.mark.parametrize("family", sorted(CKPTS))
def test_each_rank_reads_only_its_experts(ckpts, family, monkeypatch):
    folder, layer = ckpts[family], MOE_LAYER[family]
    ckpt = open_checkpoint(folder)
    whole, _ = hf.read_layer(ckpt.shards, ckpt.config, layer)
    read = []
    original = SafetensorsFolder.read
    monkeypatch.setattr(SafetensorsFolder, "read", lambda self, name, *a, **k: read.append(name) or original(
        self, name, *a, **k))
    for rank in range(2):
        read.clear()
        part, _ = hf.read_layer(ckpt.shards, ckpt.config, layer, ParallelLayout.of(rank, ep_size=2))
        mine = range(rank * E // 2, (rank + 1) * E // 2)
        for kind in ("gate_up", "down"):  # whole experts: the rank's, stacked
            np.testing.assert_array_equal(part[kind], whole[kind][mine.start:mine.stop])
        for kind in set(whole) - {"gate_up", "down"}:  # router, bias, shared expert: replicated
            np.testing.assert_array_equal(part[kind], whole[kind])
        experts = {int(n.split("experts.")[1].split(".")[0]) for n in read if ".experts." in n}
        assert experts == set(mine), f"rank {rank} read experts {sorted(experts)}"


def test_an_fp8_checkpoint_rank_reads_its_experts_and_their_scales(ckpts, tmp_path):
    values = to_fp8(ckpts["deepseek_v3"], tmp_path / "fp8", block=(16, 16))
    ckpt = open_checkpoint(str(tmp_path / "fp8"))
    p = "model.layers.1.mlp.experts."
    for rank in range(2):
        part, dtype = hf.read_layer(ckpt.shards, ckpt.config, 1, ParallelLayout.of(rank, ep_size=2))
        assert dtype == "bfloat16" and part["gate_up"].shape == (E // 2, 2 * I, H)
        for i, e in enumerate(range(rank * E // 2, (rank + 1) * E // 2)):
            want = np.concatenate([values[f"{p}{e}.gate_proj.weight"], values[f"{p}{e}.up_proj.weight"]])
            np.testing.assert_array_equal(part["gate_up"][i], want)
            np.testing.assert_array_equal(part["down"][i], values[f"{p}{e}.down_proj.weight"])


# ---- the experts ops: a slot of another rank's expert (-1) adds nothing -----------------------------------------

# where each backend rounds to the dtype: the cpu kernels round the activation only (GEMMs accumulate and the
# output rows sum in float32); composite rounds each GEMM's output too (its MatMuls return the dtype)
ROUNDS = {"cpu": {"h"}, "composite": {"gate_up", "h", "y"}}


def _ref_experts(x, ids, weights, w_gate_up, w_down, dtype, backend):
    """float64: sum over the slots with an id >= 0 of weight * down(SwiGLU(gate_up x)), rounded to ``dtype`` where
    ``backend`` rounds (ROUNDS)."""
    out = np.zeros((x.shape[0], w_down.shape[1]))
    inter, at = w_down.shape[2], ROUNDS[backend]

    def r(a, point):
        return rnd(a, dtype) if point in at else a

    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            if e < 0:
                continue
            gu = r(x[t] @ w_gate_up[e].T, "gate_up")
            h = r(silu(gu[:inter]) * gu[inter:], "h")
            out[t] += weights[t, j] * r(h @ w_down[e].T, "y")
    return out


@pytest.mark.parametrize("backend", ["cpu", "composite"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_experts_ops_skip_the_slots_of_other_ranks(backend, dtype):
    rng = np.random.default_rng(3)
    t, k, experts = 9, 3, 3
    x = rnd(rng.standard_normal((t, H)), dtype)
    w_gate_up = rnd(rng.standard_normal((experts, 2 * I, H)) / np.sqrt(H), dtype)
    w_down = rnd(rng.standard_normal((experts, H, I)) / np.sqrt(I), dtype)
    ids = rng.integers(-1, experts, (t, k)).astype(np.int32)
    ids[0] = -1  # a token none of whose experts is here: zeros
    weights = rng.random((t, k)).astype(np.float32)
    op = resolve(backend).experts(getattr(ms, dtype), formats.NONE, True)
    mt = getattr(ms, dtype)
    store = op.store
    got = op(ms.Tensor(x, ms.float32).astype(mt), ms.Tensor(ids), ms.Tensor(weights),
             ms.Tensor(store(w_gate_up.astype(np.float32))).astype(mt),
             ms.Tensor(store(w_down.astype(np.float32))).astype(mt))
    want = _ref_experts(x, ids, weights.astype(np.float64), w_gate_up, w_down, dtype, backend)
    assert_close(got, rnd(want, dtype), dtype, f"{backend} {dtype}")
    assert not np.any(got.astype(ms.float32).asnumpy()[0])


def test_an_id_below_minus_one_is_an_error():
    """In a fresh interpreter: MindSpore keeps a kernel's error and raises it again at later calls."""
    code = """if True:
        import mindspore as ms, numpy as np
        from ms_swiglu import quant
        from ms_swiglu.backends import resolve
        ms.set_device("CPU")
        op = resolve("cpu").experts(ms.float32, quant.NONE, True)
        t = lambda *shape: ms.Tensor(np.ones(shape, np.float32))
        op(t(1, 8), ms.Tensor(np.array([[-2, 0]], np.int32)), t(1, 2), t(2, 6, 8), t(2, 8, 3)).asnumpy()
    """
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and re.search(r"function\((Moe\w+)\) is 4", r.stderr), r.stderr[-2000:]


class _DocumentedMoEOps:
    """NumPy stand-ins for the Ascend MoE primitives (no CPU kernel), from their documented contracts, for
    PYNATIVE_MODE: MoeInitRoutingV2 groups the T k rows by expert stably and counts them, and takes only ids in
    [0, expert_num); GroupedMatmulV4 computes the rows of each group of ``group_list`` (counts), one group per
    weight, and leaves the rows past them as they were (NaN here); MoeTokenUnpermute sums each token's k rows,
    weighted."""

    def __init__(self):
        self.expert_nums = []

    def init_routing(self, x, ids, active, capacity, expert_num, drop_pad, count_flag, before):  # noqa: ARG002
        ids = ids.asnumpy().reshape(-1)
        assert ids.min() >= 0 and ids.max() < expert_num, f"ids {ids} outside [0, {expert_num})"
        self.expert_nums.append(expert_num)
        k = ids.size // x.shape[0]
        order = np.argsort(ids, kind="stable")
        place = np.empty_like(order)
        place[order] = np.arange(order.size)
        counts = np.bincount(ids, minlength=expert_num)
        return ms.Tensor(x.asnumpy()[order // k]), ms.Tensor(place.astype(np.int32)), ms.Tensor(counts), None

    def gmm(self, xs, ws, *args, split_item, group_type, group_list_type):  # noqa: ARG002
        x, w, counts = xs[0].asnumpy(), ws[0].asnumpy(), args[6].asnumpy()
        assert len(counts) == w.shape[0] and group_list_type == 1
        y = np.full((x.shape[0], w.shape[2]), np.nan, np.float32)
        start = 0
        for g, n in enumerate(counts):
            y[start:start + n] = x[start:start + n] @ w[g]
            start += n
        return [ms.Tensor(y)]

    def unpermute(self, y, place, probs):
        y, place, probs = y.asnumpy(), place.asnumpy(), probs.asnumpy()
        k = probs.shape[1]
        return ms.Tensor(np.stack([sum(probs[t, j] * y[place[t * k + j]] for j in range(k))
                                   for t in range(probs.shape[0])]).astype(np.float32))


def test_the_ascend_sink_group_computes_only_this_ranks_slots(monkeypatch):
    """The ascend experts of an expert-parallel rank (SinkGroupExperts) on the documented primitives: -1 slots
    reach MoeInitRoutingV2 as the sink group E (never -1), the grouped matmuls run E groups, and the sink rows
    (NaN, never computed) add nothing: the result is the NumPy sum over this rank's slots."""
    from ms_swiglu.backends import ascend  # noqa: PLC0415
    from ms_swiglu.backends.composite import swiglu  # noqa: PLC0415

    rng = np.random.default_rng(4)
    t, k, experts = 7, 3, 3
    x = rng.standard_normal((t, H)).astype(np.float32)
    w_gate_up = (rng.standard_normal((experts, 2 * I, H)) / np.sqrt(H)).astype(np.float32)
    w_down = (rng.standard_normal((experts, H, I)) / np.sqrt(I)).astype(np.float32)
    ids = rng.integers(-1, experts, (t, k)).astype(np.int32)
    weights = rng.random((t, k)).astype(np.float32)
    fake = _DocumentedMoEOps()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        op = resolve("ascend").experts(ms.float32, formats.NONE, True)
        assert isinstance(op, ascend.SinkGroupExperts)
        op.init_routing, op.gmm, op.unpermute = fake.init_routing, fake.gmm, fake.unpermute
        monkeypatch.setattr(ascend.ops, "swiglu", lambda h, dim: swiglu(h))  # gate first, as Swiglu
        got = op(ms.Tensor(x), ms.Tensor(ids), ms.Tensor(weights), ms.Tensor(op.store(w_gate_up)),
                 ms.Tensor(op.store(w_down))).asnumpy()
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)
    assert fake.expert_nums == [experts + 1]
    want = _ref_experts(x.astype(np.float64), ids, weights.astype(np.float64), w_gate_up.astype(np.float64),
                        w_down.astype(np.float64), "float32", "cpu")
    assert_close(got, want, "float32", "sink group")


def test_tokens_go_with_sharded_dispatch_only():
    from ms_swiglu import PackedMoE  # noqa: PLC0415

    moe = PackedMoE(H, I, E, TOP_K, backend="composite")
    x = ms.Tensor(np.ones((3, H), np.float32))
    with pytest.raises(InputError, match="tokens: expected it with sharded dispatch only .this block's: local., "
                                         "got it"):
        moe(x, ms.Tensor([3], ms.int32))


def test_dispatch_choices_are_checked():
    with pytest.raises(InputError, match="ep_size: expected a positive divisor of the number of experts 4, got 3"):
        dispatch_cell(4, ParallelLayout(ep_size=3))
    with pytest.raises(InputError, match="dispatch: expected one of replicated, sharded, got 'alltoall'"):
        dispatch_cell(4, ParallelLayout(ep_size=2), "alltoall")
    with pytest.raises(InputError, match="expected one of them 1"):
        ParallelLayout.of(0, tp_size=2, ep_size=2)


# ---- msrun: the Cells of every family, both dispatchers, against one process -----------------------------------

@pytest.fixture(scope="module")
def ep_cells(ckpts, tmp_path_factory):
    """One msrun job of 2 ranks running tests/ep_worker.py: every (family, dtype, quant) of its BLOCKS with both
    dispatchers on the rows of ROWS, real and steered routing; {rank: {case/what: array}}."""
    out = tmp_path_factory.mktemp("ep_cells")
    spec = out / "checkpoints.json"
    spec.write_text(json.dumps({f: [ckpts[f], MOE_LAYER[f]] for f in CKPTS}))
    bin_dir = os.path.dirname(sys.executable)
    r = subprocess.run([os.path.join(bin_dir, "msrun"), "--worker_num=2", "--local_worker_num=2",
                        f"--master_port={_port()}", f"--log_dir={out / 'logs'}", "--join=True",
                        os.path.join(HERE, "ep_worker.py"), str(out), str(spec)], capture_output=True, text=True,
                       timeout=900, cwd=out, env=dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"]))
    logs = "".join((out / "logs" / f"worker_{i}.log").read_text()[-3000:] for i in range(2)
                   if (out / "logs" / f"worker_{i}.log").exists())
    assert r.returncode == 0 and all((out / f"rank{i}.npz").exists() for i in range(2)), logs
    return {i: dict(np.load(out / f"rank{i}.npz")) for i in range(2)}


def _port():
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("dispatch", ["replicated", "sharded"])
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: "-".join(str(v) for v in b))
def test_every_family_on_two_ranks_equals_one_process(ep_cells, block, dispatch):
    """Each rank's output against the one-process block on the same tokens. Float32 within its tolerance. In
    bfloat16 (and int8 with bfloat16 activations) each rank rounds its experts' partial sum p_r to bfloat16
    before the AllReduce adds them: one rounding more per rank than one process, each at most u |p_r| with
    u = 2^-8 (bfloat16's unit roundoff; float16's 2^-11). The partials can cancel (|p_0| + |p_1| >> |y|), so the
    bound is atol + rtol |y| + u (|p_0| + |p_1|), with p_r each rank's partial as it computed it
    (ep_worker.Partial)."""
    name, dtype, quant = block
    atol, rtol = TOL[dtype]
    u = {"float32": 0.0, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[dtype]
    cases = 0
    for rank, results in ep_cells.items():
        for key in [k for k in results if k.startswith(f"{name}/{dtype}/{quant}/") and f"/{dispatch}/got" in k]:
            case = key[:-len(f"/{dispatch}/got")]
            got, want = results[key].astype(np.float64), results[f"{case}/{dispatch}/want"].astype(np.float64)
            partials = sum(np.abs(ep_cells[r][f"{case}/partial"]) for r in ep_cells)  # [T, H], every token
            if dispatch == "sharded":
                rows = [int(n) for n in case.rsplit("/", 1)[1].split("+")]
                partials = partials[sum(rows[:rank]):sum(rows[:rank + 1])]
                assert not np.any(results[f"{case}/sharded/padding"]), f"rank {rank} {case}: padded rows not zero"
            assert got.shape == want.shape, f"rank {rank} {case}: {got.shape} != {want.shape}"
            bound = atol + rtol * np.abs(want) + u * partials
            worst = np.max(np.abs(got - want) - bound) if got.size else -1.0
            assert worst <= 0, f"rank {rank} {case} {dispatch}: off by {worst:.3g} beyond the bound"
            cases += 1
    assert cases == 2 * (len(ROWS) + 2)  # every row split, and all tokens steered to rank 0's then rank 1's experts


# ---- the CLI: convert --ep-size, run --ep-size (msrun), export --ep-size (msrun) --------------------------------

def test_convert_ep_files_hold_only_their_experts(ckpts, tmp_path):
    runs = cli_batch([["convert", "--checkpoint", ckpts["deepseek_v3"], "--output", str(tmp_path / "c.safetensors"),
                       "--ep-size", "2"],
                      ["convert", "--checkpoint", ckpts["deepseek_v3"], "--output", str(tmp_path / "q.safetensors"),
                       "--ep-size", "2", "--quantize", "int8"],
                      ["convert", "--checkpoint", ckpts["qwen2_moe"], "--output", str(tmp_path / "o.safetensors"),
                       "--ep-size", "2"]])
    assert [r.returncode for r in runs] == [0, 0, 0], [r.stderr for r in runs]
    whole = open_checkpoint(ckpts["deepseek_v3"])
    full, _ = hf.read_layer(whole.shards, whole.config, 1)
    sets = set()
    for stem, quant in (("c", None), ("q", "int8")):
        for rank in range(2):
            path = tmp_path / f"{stem}-ep{rank}-of-2.safetensors"
            with safe_open(str(path), "np") as f:
                meta = f.metadata()
                shapes = {n: f.get_slice(n).get_shape() for n in f.keys()}
            assert (meta["ep_size"], meta["tp_size"], meta["rank"]) == ("2", "1", str(rank))
            sets.add(meta["set"])
            p = "model.layers.1.mlp."
            assert shapes[p + "experts.gate_up_proj.weight"] == [E // 2, 2 * I, H]  # its experts only
            assert shapes[p + "experts.down_proj.weight"] == [E // 2, H, I]
            assert shapes[p + "gate.weight"] == [E, H]  # the router and the shared expert: whole
            assert shapes[p + "shared_experts.gate_up_proj.weight"] == [2 * I, H]
            assert shapes["model.layers.0.mlp.gate_up_proj.weight"] == [2 * 48, H]  # the dense layer: whole
            if quant:
                assert shapes[p + "experts.gate_up_proj.weight_scale"] == [E // 2, 2 * I]
            tensors, _, _ = open_checkpoint(str(tmp_path / f"{stem}.safetensors")).layer(
                1, ParallelLayout.of(rank, ep_size=2))
            mine = slice(rank * E // 2, (rank + 1) * E // 2)
            if not quant:
                np.testing.assert_array_equal(tensors["gate_up"], full["gate_up"][mine])
    assert len(sets) == 2  # one set per conversion, shared by its rank files
    # mixed and incomplete sets, and splits the files were not written for, are refused before any rank starts
    os.replace(tmp_path / "o-ep1-of-2.safetensors", tmp_path / "c-ep1-of-2.safetensors")
    (tmp_path / "q-ep1-of-2.safetensors").unlink()
    x = tmp_path / "x.npy"
    np.save(x, np.ones((2, H), np.float32))
    bad = cli_batch([["run", "--checkpoint", str(tmp_path / "c.safetensors"), "--layer", "1", "--input", str(x),
                      "--ep-size", "2"],
                     ["run", "--checkpoint", str(tmp_path / "q.safetensors"), "--layer", "1", "--input", str(x),
                      "--ep-size", "2"],
                     ["run", "--checkpoint", str(tmp_path / "o.safetensors"), "--layer", "0", "--input", str(x),
                      "--tp-size", "2"],
                     ["convert", "--checkpoint", ckpts["mixtral"], "--output", str(tmp_path / "m.safetensors"),
                      "--ep-size", "3"],
                     ["convert", "--checkpoint", ckpts["mixtral"], "--output", str(tmp_path / "m.safetensors"),
                      "--ep-size", "2", "--tp-size", "2"]])
    assert [r.returncode for r in bad] == [2] * 5
    lines = [r.stderr.strip() for r in bad]
    assert all(len(line.splitlines()) == 1 for line in lines), lines
    assert "c-ep1-of-2.safetensors: expected a file of the conversion that wrote" in lines[0]
    assert "q-ep1-of-2.safetensors (--tp-size 1 --ep-size 2), found only q-ep0-of-2.safetensors" in lines[1]
    assert "o-tp0-of-2.safetensors (--tp-size 2), found only o-ep0-of-2.safetensors" in lines[2]
    assert "ep_size: expected a divisor of the number of routed experts 4, got 3" in lines[3]
    assert "expected one of them 1 (expert parallelism beside tensor parallelism is not supported)" in lines[4]
    assert not list(tmp_path.glob("m*"))


@pytest.fixture(scope="module")
def ep_runs(ckpts, tmp_path_factory):
    """`ms-swiglu run --ep-size 2` (msrun) and the one-process run of the same layer and input, in float32 (the
    Cell tests above hold bfloat16 and int8 to their bound): Qwen2-MoE from the HF folder (replicated tokens);
    DeepSeek-V3's MoE layer from int8 rank files and its dense layer 0, both with sharded tokens (5 tokens:
    3 + 2)."""
    root = tmp_path_factory.mktemp("ep_runs")
    x = root / "x.npy"
    np.save(x, np.random.default_rng(5).standard_normal((5, H)).astype(np.float32))
    conv = str(root / "ds.safetensors")
    jobs = [("qwen2", [ckpts["qwen2_moe"], "0"], ["--ep-size", "2"]),
            ("ds_int8", [conv, "1"], ["--ep-size", "2", "--dispatch", "sharded"]),
            ("ds_dense", [ckpts["deepseek_v3"], "0"], ["--ep-size", "2", "--dispatch", "sharded"])]
    cases = [["convert", "--checkpoint", ckpts["deepseek_v3"], "--output", conv, "--quantize", "int8"],
             ["convert", "--checkpoint", ckpts["deepseek_v3"], "--output", conv, "--quantize", "int8", "--ep-size",
              "2"]]
    for name, (ck, layer, *rest), ep in jobs:
        base = ["run", "--checkpoint", ck, "--layer", layer, "--input", str(x), *rest]
        cases += [base + ["--output", str(root / f"{name}_one.npy")],
                  base + ["--output", str(root / f"{name}_ep.npy"), *ep]]
    runs = cli_batch(cases, timeout=900)
    return root, runs


def test_run_with_ep_size_equals_one_process(ep_runs):
    root, runs = ep_runs
    assert [r.returncode for r in runs] == [0] * len(runs), [r.stderr[-500:] for r in runs]
    assert "ep 2 (replicated tokens)" in runs[3].stdout and "ep 2 (sharded tokens)" in runs[5].stdout
    for name in ("qwen2", "ds_int8", "ds_dense"):  # int8: the same weights and scales on both (per expert row)
        one, ep = np.load(root / f"{name}_one.npy"), np.load(root / f"{name}_ep.npy")
        assert ep.shape == one.shape == (5, H)
        assert_close(ep, one.astype(np.float64), "float32", name)


@pytest.fixture(scope="module")
def ep_exports(ckpts, tmp_path_factory):
    """`export --ep-size 2`: DeepSeek-V3's MoE layer for Ascend from its int8 bfloat16 rank files with sharded
    tokens (and the same conversion whole, for the test's own golden outputs), Qwen2-MoE's portable from the HF
    folder in float32 with replicated tokens (whose reloaded MindIRs run on the CPU), then the portable set's
    verify command under msrun."""
    root = tmp_path_factory.mktemp("ep_exports")
    q = ["convert", "--checkpoint", ckpts["deepseek_v3"], "--dtype", "bfloat16", "--quantize", "int8", "--output"]
    runs = cli_batch([q + [str(root / "q.safetensors"), "--ep-size", "2"], q + [str(root / "whole.safetensors")],
                      ["export", "--checkpoint", str(root / "q.safetensors"), "--layer", "1", "--ep-size", "2",
                       "--dispatch", "sharded", "--output-dir", str(root / "ascend")],
                      ["export", "--checkpoint", ckpts["qwen2_moe"], "--layer", "0", "--ep-size", "2", "--target",
                       "portable", "--output-dir", str(root / "portable")],
                      ["export", "--checkpoint", ckpts["deepseek_v3"], "--layer", "0", "--ep-size", "2",
                       "--output-dir", str(root / "dense")],
                      ["export", "--preset", "tiny", "--ep-size", "2", "--output-dir", str(root / "preset")],
                      ["export", "--checkpoint", ckpts["qwen2_moe"], "--layer", "0", "--ep-size", "2", "--target",
                       "cpu", "--output-dir", str(root / "cpu")],
                      ["export", "--checkpoint", ckpts["qwen2_moe"], "--layer", "0", "--ep-size", "2", "--dtype",
                       "bfloat16", "--quantize", "w8a8", "--output-dir", str(root / "w8a8")]], timeout=900)
    assert [r.returncode for r in runs[:2]] == [0, 0], [r.stderr for r in runs[:2]]
    runs = runs[2:]
    bin_dir = os.path.dirname(sys.executable)
    verify = subprocess.run([os.path.join(bin_dir, "msrun"), "--worker_num=2", "--local_worker_num=2",
                             f"--master_port={_port()}", f"--log_dir={root / 'verify_logs'}", "--join=True",
                             "verify_on_device.py", "--device", "CPU"], cwd=root / "portable", capture_output=True,
                            text=True, timeout=600,
                            env=dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"]))
    lines = [line for i in range(2) for line in (root / "verify_logs" / f"worker_{i}.log").read_text().splitlines()
             if line.startswith("rank ")]
    return root, runs, verify, lines


def test_export_writes_one_straight_line_kit_per_rank(ep_exports, ckpts):
    root, runs, _, _ = ep_exports
    assert [r.returncode for r in runs[:2]] == [0, 0], [r.stderr[-800:] for r in runs[:2]]
    for kind, collective_ops, group in (("ascend", {"AllGather", "AllReduce"}, "hccl_world_group"),
                                        ("portable", {"AllReduce"}, "mccl_world_group")):
        top = json.loads((root / kind / "manifest.json").read_text())
        assert top["ep_size"] == 2 and [r["kit"] for r in top["ranks"]] == ["rank0/", "rank1/"]
        assert top["communication"]["group"] == group and "msrun --worker_num=2" in top["verify_command"]
        for rank, entry in enumerate(top["ranks"]):
            mindir = str(root / kind / entry["kit"] / entry["model_file"])
            found = op_types(mindir)  # read back from the file, sub-graphs included
            assert collective_ops <= set(found) and "Custom" not in found and not CONTROL_FLOW & set(found), found
            assert {c["group"] for c in collectives(mindir)} == {group}
            assert all(c["rank_size"] in (None, 2) for c in collectives(mindir))
            kit = json.loads((root / kind / entry["kit"] / "manifest.json").read_text())
            assert kit["communication"]["rank"] == rank
            assert all(c["ok"] for c in kit["verification"]["cpu_twin"])
        if kind == "ascend":
            assert {"Swiglu", "GroupedMatmulV4", "MoeInitRoutingV2"} <= set(found)


def test_export_golden_outputs_are_each_ranks_part_of_one_process(ep_exports):
    """The sharded kits' golden outputs, rank 0's real rows then rank 1's, are the whole layer's output in
    float32 from the int8 weights and their scales (the same conversion, whole), on the tokens of every case."""
    root, _, _, _ = ep_exports
    whole = load_moe(str(root / "whole.safetensors"), 1, dtype="float32", backend="composite")
    kits = [json.loads((root / "ascend" / f"rank{r}" / "manifest.json").read_text()) for r in range(2)]
    assert kits[0]["weights"]["quant"] == "int8" and kits[0]["dtype"] == "bfloat16"
    for c0, c1 in zip(kits[0]["golden"], kits[1]["golden"]):
        xs, ys = [], []
        for r, case in enumerate((c0, c1)):
            n = case["tokens_input"]
            xs.append(np.load(root / "ascend" / f"rank{r}" / case["input"]["npy"])[:n])
            ys.append(np.load(root / "ascend" / f"rank{r}" / case["outputs"][0]["npy"])[:n])
        want = whole(ms.Tensor(np.concatenate(xs))).asnumpy()
        assert_close(np.concatenate(ys), want.astype(np.float64), "float32", f"case {c0['case']}")
    assert [c["tokens_input"] for c in kits[1]["golden"]] == [0, 8]  # one token: rank 1 has none


def test_the_verify_command_passes_on_every_rank(ep_exports):
    root, _, verify, lines = ep_exports
    assert verify.returncode == 0, lines
    assert sum(line.endswith("2 of 2 cases pass (mindspore.load + nn.GraphCell on CPU)") for line in lines) == 2
    alone = subprocess.run([sys.executable, str(root / "portable" / "verify_on_device.py"), "--device", "CPU"],
                           capture_output=True, text=True, timeout=120)
    assert alone.returncode == 2 and "expected to run as one of 2 ranks under msrun" in alone.stderr


def test_export_ep_takes_w8a8_experts_with_their_quant_ops(ep_exports):
    """W8A8 (dynamic) experts on every rank: int8 rows by DynamicQuantExt into GroupedMatmulV4, the shared expert
    by QuantBatchMatmul; each rank's twin passed its golden outputs at export."""
    root, runs, _, _ = ep_exports
    assert runs[5].returncode == 0, runs[5].stderr[-800:]
    for rank in range(2):
        m = json.loads((root / "w8a8" / f"rank{rank}" / "manifest.json").read_text())
        assert {"DynamicQuantExt", "GroupedMatmulV4", "QuantBatchMatmul", "AllReduce"} <= set(m["op_types"])
        assert m["weights"]["quant"] == "w8a8" and m["outputs"][0]["acceptance"]["quantizers"] == 4
        assert all(c["ok"] for c in m["verification"]["cpu_twin"])


def test_export_ep_refuses_what_it_cannot_split(ep_exports):
    root, runs, _, _ = ep_exports
    assert [r.returncode for r in runs[2:5]] == [2, 2, 2]
    assert "--layer: expected a MoE layer for --ep-size" in runs[2].stderr
    assert "--ep-size: expected --checkpoint and --layer N (one MoE layer), got --preset" in runs[3].stderr
    assert "--ep-size: expected --target ascend or portable (graphs that deploy), got cpu" in runs[4].stderr
    assert not any((root / d).exists() for d in ("dense", "preset", "cpu"))


def test_a_failed_rank_leaves_no_export_and_keeps_its_logs(ckpts, tmp_path):
    """Rank 1 of an export fails after rank 0 wrote into the set's staging folder (tests/ep_export_fault.py):
    exit 1 with one line naming the log, no entry in the output folder, no process left; the job keeps its
    logs only."""
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    cmd = [sys.executable, "-c", "import sys; from ms_swiglu.export import parallel; parallel.WORKER = sys.argv[1]; "
           "from ms_swiglu import cli; sys.exit(cli.main(sys.argv[2:]))", os.path.join(HERE, "ep_export_fault.py"),
           "export", "--checkpoint", ckpts["qwen3_moe"], "--layer", "0", "--ep-size", "2", "--output-dir", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, TMPDIR=str(tmp)))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "worker 1 failed: RuntimeError: injected failure on rank 1" in r.stderr
    log = r.stderr.strip().rsplit("(log: ", 1)[1].rstrip(")")
    assert os.path.exists(log) and log.startswith(str(tmp))
    assert not out.exists() or os.listdir(out) == []  # neither rank0/ nor the staging folder
    job = os.path.dirname(os.path.dirname(log))
    assert os.listdir(job) == ["logs"]
    assert not processes_naming(tmp)
