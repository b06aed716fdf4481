"""The weight-format descriptor (ms_swiglu.quant): each format's parts and their axes, int4's byte layout against an
independent packer, how a layout splits every part, and which formats each backend computes how (as data)."""
import numpy as np
import pytest

from ms_swiglu import quant as formats
from ms_swiglu.backends import get as backend
from ms_swiglu.backends.cpu import kernels
from ms_swiglu.backends.spec import Compute
from ms_swiglu.errors import InputError
from ms_swiglu.layout import ParallelLayout
from ms_swiglu.quant.int4 import pack_int4, unpack_int4
from ms_swiglu.schema import Split, TensorSpec, layer_tensors

E, M, K = 3, 8, 256


@pytest.mark.parametrize("name, shapes", [
    ("int8", {"": (E, M, K), "_scale": (E, M)}),
    ("int8-g128", {"": (E, M, K), "_scale": (E, M, 2)}),
    ("int8-g64", {"": (E, M, K), "_scale": (E, M, 4)}),
    ("int4-g128", {"": (E, M, K // 2), "_scale": (E, M, 2)}),
    ("int4-g32-zp", {"": (E, M, K // 2), "_scale": (E, M, 8), "_zero": (E, M, 8)}),
    ("w8a8", {"": (E, M, K), "_scale": (E, M)}),
    ("w8a8-static", {"": (E, M, K), "_scale": (E, M), "_input_scale": (E, 1), "_input_offset": (E, 1)}),
])
def test_every_format_names_its_parts_and_their_shapes(name, shapes):
    method = formats.get(name)
    assert method.name == name and method.quantized
    assert method.part_shapes((E, M, K)) == shapes
    assert [p.suffix for p in method.parts] == list(shapes)


def test_int4_bytes_hold_the_even_input_in_the_low_nibble():
    """Against a packer written from the layout's statement (Ascend's qint4x2 and compressed-tensors' order: the
    first element in the low bits), byte by byte."""
    u = np.random.default_rng(0).integers(0, 16, (5, 12)).astype(np.uint8)
    expected = np.zeros((5, 6), np.uint8)
    for r in range(5):
        for j in range(6):
            expected[r, j] = int(u[r, 2 * j]) + 16 * int(u[r, 2 * j + 1])
    assert np.array_equal(pack_int4(u), expected)
    assert np.array_equal(unpack_int4(expected), u)


def test_int4_encode_rounds_each_group_to_the_nearest_of_sixteen_steps():
    w = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    method = formats.get("int4-g128")
    parts = method.encode(w)
    scale = np.abs(w.reshape(4, 2, 128)).max(-1) / 7.5  # the checkpoints' symmetric convention
    np.testing.assert_array_equal(parts["_scale"], scale.astype(np.float32))
    back = method.decode(parts)
    step = np.repeat(scale, 128, axis=1)
    assert np.all(np.abs(back - w) <= step / 2 + 1e-7 * np.abs(w))  # round to nearest; the top clips at 7 s
    q = unpack_int4(parts[""]).astype(np.float32) - 8  # (u - 8) * scale, one float32 rounding
    np.testing.assert_array_equal(back, (q.reshape(4, 2, 128) * parts["_scale"][..., None]).reshape(4, 256))


def _down(size=K):
    return TensorSpec("down", "down_proj.weight", "down", ("d",), (M, size), Split.COLUMNS, size, quantized=True)


def _gate_up(size=M // 2):
    return TensorSpec("gate_up", "gate_up_proj.weight", "gu", ("g", "u"), (size, K), Split.ROWS, size, quantized=True)


def test_a_layout_splits_every_part_by_its_axes():
    """down (column split) of int4-g32 with zero points: the packed bytes, scales and zero points of the rank's
    columns; gate_up (row split): each part's [gate_r; up_r] rows."""
    method = formats.get("int4-g32-zp")
    rng = np.random.default_rng(2)
    whole = {"down" + p.suffix: rng.integers(0, 200, p.shape((), M, K)).astype(p.dtype) for p in method.parts}
    for r in range(2):
        part = ParallelLayout(2, r).shard(_down(), whole, method)
        assert np.array_equal(part["down"], whole["down"][:, r * 64:(r + 1) * 64])  # 128 inputs: 64 bytes
        for s in ("_scale", "_zero"):
            assert np.array_equal(part["down" + s], whole["down" + s][:, r * 4:(r + 1) * 4])  # 4 groups of 32
    gu = {"gate_up" + p.suffix: rng.integers(0, 200, p.shape((), M, K)).astype(p.dtype) for p in method.parts}
    for r in range(2):
        part = ParallelLayout(2, r).shard(_gate_up(), gu, method)
        for s, a in part.items():
            rows = [r * 2, r * 2 + 1, 4 + r * 2, 4 + r * 2 + 1]  # [gate_r; up_r] of I = 4
            assert np.array_equal(a, gu[s][rows]), s


def test_a_split_that_cuts_a_group_or_a_byte_is_refused_with_the_numbers():
    method = formats.get("int4-g64")
    whole = {"down" + p.suffix: np.zeros(p.shape((), M, 96), p.dtype) for p in method.parts}
    with pytest.raises(InputError, match=r"quant int4-g64: expected a rank's columns to hold whole groups of 64, "
                                         r"got columns 48\.\.95"):
        ParallelLayout(2, 1).shard(_down(96), whole, method)
    with pytest.raises(InputError, match=r"quant int4-g64: expected an input size that is a multiple of 64, got 96"):
        method.part_shapes((M, 96))


def test_backends_declare_how_they_compute_each_format():
    """As data: the cpu backend runs the formats of its library's rows on its kernels (int8 per row, and per group
    of any size; int4; W8A8 dynamic and static) and dequantizes any other in the graph; ascend's quantized matmuls take weight-only int8, int4 in
    groups of a multiple of 32 and W8A8, and refuse the rest; ge dequantizes weight-only formats and refuses int8
    activations; composite dequantizes every one."""
    from ms_swiglu.backends.cpu import kernels

    assert kernels.formats() == ("int8", "int8-group", "int4-group", "w8a8", "w8a8-static")
    names = ("int8", "int8-g128", "int8-g64", "int4-g128", "int4-g32-zp", "int4-g16", "w8a8", "w8a8-static")
    table = {name: {b: backend(b).formats(formats.get(name)) for b in ("cpu", "ascend", "ge", "composite", "akg")}
             for name in names}
    k, g = Compute.KERNEL, Compute.GRAPH
    assert table == {
        "int8": {"cpu": k, "ascend": k, "ge": g, "composite": g, "akg": g},
        "int8-g128": {"cpu": k, "ascend": k, "ge": g, "composite": g, "akg": g},
        "int8-g64": {"cpu": k, "ascend": k, "ge": g, "composite": g, "akg": g},
        "int4-g128": {"cpu": k, "ascend": k, "ge": g, "composite": g, "akg": g},
        "int4-g32-zp": {"cpu": k, "ascend": k, "ge": g, "composite": g, "akg": g},
        "int4-g16": {"cpu": k, "ascend": None, "ge": g, "composite": g, "akg": g},  # antiquant_group_size % 32
        "w8a8": {"cpu": k, "ascend": k, "ge": None, "composite": g, "akg": g},
        "w8a8-static": {"cpu": k, "ascend": k, "ge": None, "composite": g, "akg": g}}


def test_the_library_takes_each_format_by_its_rows_name_only():
    """The ops of a format row are named after it; a scale of another row's shape is refused (status 3), not
    taken for that row's format."""
    from ms_swiglu.backends.cpu import kernels

    assert kernels.op_name("Linear", "int8-g128") == kernels.op_name("Linear", "int8-g64") == "QLinear_int8_group"
    assert kernels.op_name("MoeDownCombine", "int8") == "QMoeDownCombine_int8"
    assert kernels.op_name("Linear") == "Linear"
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    q = rng.integers(-127, 128, (8, 256)).astype(np.int8)
    grouped = np.ones((8, 2), np.float32)
    y = kernels.run("QLinear_int8_group", x, q, grouped, np.zeros((2, 8), np.float32), dtype="float32")
    np.testing.assert_allclose(y, x.astype(np.float64) @ q.T, rtol=1e-6, atol=1e-4)
    with pytest.raises(ValueError, match="status 3"):  # per-row scales given to the grouped row's op
        kernels.run("QLinear_int8_group", x, q, np.ones(8, np.float32), np.zeros((2, 8), np.float32), dtype="float32")
    with pytest.raises(ValueError, match="status 3"):
        kernels.run("QLinear_int8", x, q, grouped, np.zeros((2, 8), np.float32), dtype="float32")
    assert kernels.op_name("GateUpSwiglu", "int4-g32-zp") == "QGateUpSwiglu_int4_group_zp"
    assert kernels.op_name("Linear", "w8a8-static") == "QLinear_w8a8_static"
    unknown = formats.get("w8a8")
    unknown = type(unknown)(unknown.activation)
    unknown.kernel = "int2"  # a format whose row the library does not have
    with pytest.raises(ValueError, match="expected a format of the library's rows"):
        kernels.op_name("Linear", unknown)
    assert kernels.has_op("MoeDownCombine", "w8a8") and not kernels.has_op("MoeDownCombine", unknown)


# ---- the published formats, read from checkpoints written by tests/quant_checkpoint.py ----------------------------

H, I = 64, 128  # a dense layer: gate/up [I, H], down [H, I]; groups of 32 divide both and a tp-2 block of I


def _mlp_oracle_proj(x, w):
    """One projection on int8 activations per token (the device's DynamicQuant), float64 sums."""
    a = np.asarray(x, np.float32)
    s = np.abs(a).max(-1, keepdims=True) / np.float32(127)
    s = np.where(s > 0, s, np.float32(1)).astype(np.float32)
    return np.rint(a / s).astype(np.float64) @ w.T.astype(np.float64) * s


def _mlp_oracle(x, gate, up, down, w8a8=False):
    """float64 SwiGLU MLP of the weights the checkpoint stands for; with ``w8a8`` each projection's input quantized
    per token as the device's DynamicQuant does (s = max|x| / 127, x_q = round half to even, float32 steps)."""
    def mm(a, w):
        return _mlp_oracle_proj(a, w) if w8a8 else a.astype(np.float64) @ w.T.astype(np.float64)
    g, u = mm(x, gate), mm(x, up)
    h = g / (1 + np.exp(-g)) * u
    return mm(h.astype(np.float32) if w8a8 else h, down)


FORMATS = {  # fixture format, its options -> the format name the package reads it as
    "ct-w4a16 sym": (("ct-w4a16",), {"group": 32}, "int4-g32"),
    "ct-w4a16 asym": (("ct-w4a16",), {"group": 32, "symmetric": False}, "int4-g32-zp"),
    "ct-w8a16 g32": (("ct-w8a16",), {"group": 32, "scale_dtype": "bfloat16"}, "int8-g32"),
    "gptq v1 sym": (("gptq",), {"group": 32}, "int4-g32"),
    "gptq v1 asym": (("gptq",), {"group": 32, "symmetric": False, "scale_dtype": "float32"}, "int4-g32-zp"),
    "gptq v2 asym": (("gptq",), {"group": 32, "symmetric": False, "checkpoint_format": "gptq_v2"}, "int4-g32-zp"),
    "awq": (("awq",), {"group": 32}, "int4-g32-zp"),
    "modelslim W8A16": (("modelslim",), {"kind": "W8A16"}, "int8"),
}


@pytest.fixture(scope="module")
def dense_float(tmp_path_factory):
    from hf_checkpoint import make_checkpoint

    folder = tmp_path_factory.mktemp("float")
    make_checkpoint(folder, hidden=H, inter=I, layers=1, seed=5)
    return folder


def _quantized(dense_float, tmp_path, case):
    from quant_checkpoint import to_quantized

    (fmt,), kw, name = FORMATS[case]
    values, extra = to_quantized(str(dense_float), str(tmp_path / "q"), fmt, **kw)
    return tmp_path / "q", values, extra, name


@pytest.mark.parametrize("case", list(FORMATS))
def test_each_reader_gives_the_weights_the_checkpoint_stands_for(dense_float, tmp_path, case):
    """The layer read (whole, and each rank of 2 by itself) decodes to exactly the values the independent writer
    dequantized, and the MLP on the composite and cpu backends matches the float64 oracle on them (float32: its
    tolerance; the weights are the same float32 values on both sides)."""
    from ms_swiglu import load_mlp
    from ms_swiglu.checkpoint import hf, open_checkpoint

    folder, values, _, name = _quantized(dense_float, tmp_path, case)
    ckpt = open_checkpoint(str(folder))
    tensors, _, method = hf.read_layer_as_stored(ckpt.shards, ckpt.config, 0)
    assert method.name == name
    p = "model.layers.0.mlp."
    gate_up = method.decode({s: tensors["gate_up" + s] for s in (pt.suffix for pt in method.parts)})
    down = method.decode({s: tensors["down" + s] for s in (pt.suffix for pt in method.parts)})
    np.testing.assert_array_equal(gate_up, np.concatenate([values[p + "gate_proj.weight"],
                                                           values[p + "up_proj.weight"]]))
    np.testing.assert_array_equal(down, values[p + "down_proj.weight"])
    for r in range(2):
        part, _, _ = hf.read_layer_as_stored(ckpt.shards, ckpt.config, 0, ParallelLayout(2, r))
        expected = {}  # the rank's part as the layout cuts the whole layer
        for spec in layer_tensors(ckpt.config, 0):
            expected.update(ParallelLayout(2, r).shard(spec, tensors, method))
        assert set(part) == set(expected)
        for k in part:
            np.testing.assert_array_equal(part[k], expected[k], err_msg=f"rank {r} {k}")
    x = np.random.default_rng(6).standard_normal((5, H)).astype(np.float32)
    want = _mlp_oracle(x, values[p + "gate_proj.weight"], values[p + "up_proj.weight"], values[p + "down_proj.weight"])
    import mindspore as ms

    for b in ("composite", "cpu"):
        mlp = load_mlp(str(folder), 0, dtype="float32", backend=b)
        assert mlp.quant == name
        got = mlp(ms.Tensor(x)).asnumpy()
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1.3e-6, err_msg=b)


W8A8 = {  # fixture format, its options -> the format name
    "ct-w8a8 dynamic": (("ct-w8a8",), {}, "w8a8"),
    "modelslim W8A8_DYNAMIC": (("modelslim",), {"kind": "W8A8_DYNAMIC"}, "w8a8"),
    "ct-w8a8 static": (("ct-w8a8",), {"static": True, "input_scale": 0.02}, "w8a8-static"),
    "modelslim W8A8 float16": (("modelslim",), {"kind": "W8A8", "dtype": "float16", "input_offset": 3.0,
                                                "input_scale": 0.02}, "w8a8-static"),
}


def _w8a8_oracle(x, q, extra, static):
    """One projection of int8 weights ``q`` (their float values) on int8 activations, float64 sums: dynamic per
    token (s = max|x| / 127, the device's DynamicQuant), or static (x_q = clip(round(x / s + o)), (x_q - o) s)."""
    x = np.asarray(x, np.float32)
    if static:
        s, o = np.float32(extra[0]), np.float32(extra[1])
        xq = np.clip(np.rint(x / s + o), -128, 127) - o
        return xq.astype(np.float64) @ q.T.astype(np.float64) * np.float64(s)
    s = np.abs(x).max(-1, keepdims=True) / np.float32(127)
    s = np.where(s > 0, s, np.float32(1)).astype(np.float32)
    return np.rint(x / s).astype(np.float64) @ q.T.astype(np.float64) * s


@pytest.mark.parametrize("case", list(W8A8))
def test_w8a8_checkpoints_quantize_activations_as_the_device_does(dense_float, tmp_path, case):
    """gate/up and down each take int8 activations (per token, or per tensor with the checkpoint's scale and
    offset); the oracle quantizes with the same float32 steps and sums in float64. Bound: float32 (atol 1e-5, rtol
    1.3e-6) plus, per projection, one rounding flip of an activation (an x / s within float32's error of a half):
    each flip moves a sum by s |w| for one input; bounded here by the largest s |w| of the layer."""
    import mindspore as ms

    from ms_swiglu import load_mlp

    (fmt,), kw, name = W8A8[case]
    from quant_checkpoint import to_quantized

    values, extra = to_quantized(str(dense_float), str(tmp_path / "q"), fmt, **kw)
    static = name == "w8a8-static"
    p = "model.layers.0.mlp."
    w = {k: values[p + f"{k}_proj.weight"] for k in ("gate", "up", "down")}
    io = {k: (extra["input_scale"][p + f"{k}_proj"], extra.get("input_offset", {}).get(p + f"{k}_proj", 0.0))
          for k in w} if static else {k: None for k in w}
    x = np.random.default_rng(7).standard_normal((6, H)).astype(np.float32)
    g, u = _w8a8_oracle(x, w["gate"], io["gate"], static), _w8a8_oracle(x, w["up"], io["up"], static)
    h = (g / (1 + np.exp(-g)) * u).astype(np.float32)
    want = _w8a8_oracle(h, w["down"], io["down"], static)
    flip = max(np.abs(a).max() for a in w.values()) * (max(s for s, _ in io.values()) if static else
                                                         max(np.abs(x).max(), np.abs(h).max()) / 127)
    for b in ("composite", "cpu"):
        mlp = load_mlp(str(tmp_path / "q"), 0, dtype="float32", backend=b)
        assert mlp.quant == name
        before = kernels.launches()
        got = mlp(ms.Tensor(x)).asnumpy()
        ran = {op for op, count in kernels.launches().items() if count > before[op]}
        if b == "cpu":  # the library's int8 x int8 ops, x quantized inside them
            row = name.replace("-", "_")
            assert ran == {f"QGateUpSwiglu_{row}", f"QLinear_{row}"}, ran
        err = np.abs(got - want) - (1e-5 + 1.3e-6 * np.abs(want))
        assert err.max() <= 2 * flip, (b, err.max(), flip)
        assert np.mean(err > 0) < 0.2, b  # a flip is rare: most outputs are within float32's tolerance


def test_moe_experts_of_every_family_layout_read_per_expert(tmp_path):
    """Qwen3-MoE (mlp.experts.{e}.*_proj) and Mixtral (block_sparse_moe.experts.{e}.w1/w3/w2) in
    compressed-tensors W4A16 with the router ignored (its ``re:`` pattern): the stacked experts decode to the
    writer's values, each of 2 expert-parallel ranks reads its own, and the block matches the composite float
    block on those values."""
    import mindspore as ms

    from hf_checkpoint import make_checkpoint
    from ms_swiglu import load_moe
    from ms_swiglu.checkpoint import hf, open_checkpoint
    from quant_checkpoint import to_quantized

    for family, names in (("qwen3_moe", "mlp.experts.{e}.{p}_proj.weight"),
                          ("mixtral", "block_sparse_moe.experts.{e}.{p}.weight")):
        src, dst = tmp_path / family, tmp_path / (family + "-q")
        kw = dict(moe_inter=64) if family == "qwen3_moe" else {}
        make_checkpoint(src, model_type=family, hidden=H, inter=64, layers=1, experts=4, top_k=2, seed=8, **kw)
        values, _ = to_quantized(str(src), str(dst), "ct-w4a16", group=32, ignore_extra=["re:.*gate$"])
        ckpt = open_checkpoint(str(dst))
        tensors, _, method = hf.read_layer_as_stored(ckpt.shards, ckpt.config, 0)
        assert method.name == "int4-g32"
        parts = {"gate_up": ("w1", "w3") if family == "mixtral" else ("gate", "up"),
                 "down": ("w2",) if family == "mixtral" else ("down",)}
        prefix = "model.layers.0."
        for e in range(4):
            for kind, ps in parts.items():
                got = method.decode({s: tensors[kind + s][e] for s in (p.suffix for p in method.parts)})
                want = np.concatenate([values[prefix + names.format(e=e, p=p)] for p in ps])
                np.testing.assert_array_equal(got, want, err_msg=f"{family} expert {e} {kind}")
        for r in range(2):
            part, _, _ = hf.read_layer_as_stored(ckpt.shards, ckpt.config, 0, ParallelLayout.of(r, ep_size=2))
            np.testing.assert_array_equal(part["gate_up"], tensors["gate_up"][2 * r:2 * r + 2])
        float_block = load_moe(str(src), 0, dtype="float32", backend="composite")
        from ms_swiglu.mlp import load_weights, weights as cell_weights
        state = cell_weights(float_block)
        for kind, ps in parts.items():
            param = f"experts.{kind}_proj"
            state[param] = np.stack([np.concatenate([values[prefix + names.format(e=e, p=p)] for p in ps])
                                     for e in range(4)])
        load_weights(float_block, state)
        x = ms.Tensor(np.random.default_rng(9).standard_normal((7, H)).astype(np.float32))
        want = float_block(x).asnumpy()
        for b in ("composite", "cpu"):
            got = load_moe(str(dst), 0, dtype="float32", backend=b)(x).asnumpy()
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1.3e-6, err_msg=f"{family} {b}")


def test_cli_runs_converts_and_refuses_published_formats(dense_float, tmp_path):
    """``run`` on the folder and on its conversion give the same output; the converted int4 file is about a
    quarter of the bfloat16 one (0.25 of the weights' bytes plus 4 bytes per 32 inputs: 0.375 of bfloat16 at
    G = 32, 0.281 at G = 128); ``--quantize`` other than the checkpoint's, a tp split cutting a group, a missing
    scale, a NaN scale and a permuted g_idx exit 2 with one line."""
    from conftest import cli_batch
    from quant_checkpoint import to_quantized
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "gptq"
    to_quantized(str(dense_float), str(folder), "gptq", group=32)
    bad = {}
    for what in ("no-scale", "nan-scale", "act-order"):
        d = bad[what] = tmp_path / what
        if what == "act-order":
            to_quantized(str(dense_float), str(d), "gptq", group=32, g_idx="shuffled")
            continue
        to_quantized(str(dense_float), str(d), "gptq", group=32)
        t = load_file(d / "model.safetensors")
        name = "model.layers.0.mlp.up_proj.scales"
        if what == "no-scale":
            del t[name]
        else:
            t[name] = t[name].copy()
            t[name][0, 0] = np.nan
        save_file(t, d / "model.safetensors")
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(10).standard_normal((3, H)).astype(np.float32))
    conv, bf16 = tmp_path / "c.safetensors", tmp_path / "b.safetensors"
    run = ["run", "--layer", "0", "--input", str(x), "--dtype", "float32"]
    runs = cli_batch([run + ["--checkpoint", str(folder), "--output", str(tmp_path / "y1.npy")],
                      ["convert", "--checkpoint", str(folder), "--output", str(conv)],
                      run + ["--checkpoint", str(conv), "--output", str(tmp_path / "y2.npy")],
                      ["convert", "--checkpoint", str(dense_float), "--output", str(bf16), "--dtype", "bfloat16"],
                      run + ["--checkpoint", str(folder), "--quantize", "int8"],
                      run + ["--checkpoint", str(folder), "--tp-size", "8"],
                      *[run + ["--checkpoint", str(d)] for d in bad.values()]])
    assert [r.returncode for r in runs[:4]] == [0] * 4, [r.stderr[-1500:] for r in runs[:4]]
    assert "weights int4-g32" in runs[0].stdout
    np.testing.assert_array_equal(np.load(tmp_path / "y1.npy"), np.load(tmp_path / "y2.npy"))
    meta = load_file(conv)
    assert meta["model.layers.0.mlp.gate_up_proj.weight"].dtype == np.uint8
    ratio = conv.stat().st_size / bf16.stat().st_size
    assert 0.3 < ratio < 0.45, ratio  # header and metadata on both sides: a few KB at these sizes
    lines = [r.stderr.strip().splitlines() for r in runs[4:]]
    assert all(r.returncode == 2 and len(ls) == 1 for r, ls in zip(runs[4:], lines)), [r.stderr for r in runs[4:]]
    assert "--quantize: expected none or int4-g32 (the checkpoint's, GPTQ), got int8" in lines[0][0]
    assert "quant int4-g32: expected hidden_size and every intermediate size / tp_size multiples of 32" in lines[1][0]
    assert "expected tensor model.layers.0.mlp.up_proj.scales, found none" in lines[2][0]
    assert "model.layers.0.mlp.up_proj.scales: expected finite positive scales, got 1 of" in lines[3][0]
    assert "expected groups in input order" in lines[4][0] and "act-order" in lines[4][0]


@pytest.mark.parametrize("static", [False, True])
def test_w8a8_experts_quantize_each_experts_rows_per_token(tmp_path, static):
    """Qwen3-MoE in compressed-tensors W8A8, dynamic per token (each token's x, and each expert's SwiGLU output
    per row, as GroupedMatmul's per-token scales do) or static (each expert's projections their own calibrated
    scale): each token's routed experts against a NumPy oracle, routed by the block's own float router on the same
    x. Bound as for the dense MLP: float32's tolerance plus one rounding flip of an activation per projection."""
    import mindspore as ms

    from hf_checkpoint import make_checkpoint
    from ms_swiglu import load_moe
    from quant_checkpoint import to_quantized

    src, dst = tmp_path / "f", tmp_path / "q"
    make_checkpoint(src, model_type="qwen3_moe", hidden=H, inter=64, moe_inter=64, layers=1, experts=4, top_k=2,
                    seed=11, config_extra={"norm_topk_prob": True})
    scales = {f"model.layers.0.mlp.experts.{e}.{k}_proj": 0.015 + 0.002 * e + 0.001 * (k == "down")
              for e in range(4) for k in ("gate", "up", "down")}  # (gate and up share their input: one scale)
    values, extra = to_quantized(str(src), str(dst), "ct-w8a8", ignore_extra=["re:.*mlp.gate$"], static=static,
                                 **({"input_scale": scales} if static else {}))
    x = np.random.default_rng(12).standard_normal((5, H)).astype(np.float32)
    p = "model.layers.0.mlp.experts.{e}.{k}_proj.weight"
    for b in ("composite", "cpu"):
        block = load_moe(str(dst), 0, dtype="float32", backend=b)
        assert block.quant == ("w8a8-static" if static else "w8a8")
        weights, ids = (a.asnumpy() for a in block.router(ms.Tensor(x)))
        want = np.zeros((5, H))
        flip = 0.0
        for t in range(5):
            for j in range(2):
                e = int(ids[t, j])
                w = {k: values[p.format(e=e, k=k)] for k in ("gate", "up", "down")}
                a = {k: (extra["input_scale"][p.format(e=e, k=k)[:-len(".weight")]], 0.0) if static else None
                     for k in w}
                g, u = (_w8a8_oracle(x[t:t + 1], w[k], a[k], static) for k in ("gate", "up"))
                h = (g / (1 + np.exp(-g)) * u).astype(np.float32)
                want[t] += weights[t, j] * _w8a8_oracle(h, w["down"], a["down"], static)[0]
                step = a["down"][0] if static else np.abs(h).max() / 127
                flip = max(flip, np.abs(w["down"]).max() * step * abs(weights[t, j]))
        got = block(ms.Tensor(x)).asnumpy()
        err = np.abs(got - want) - (1e-5 + 1.3e-6 * np.abs(want))
        assert err.max() <= 2 * flip, (b, err.max(), flip)


def test_float_checkpoints_quantize_to_int4_and_w8a8(tmp_path):
    """``convert --quantize int4-g128`` (round to nearest, scale max|w| / 7.5 per group: the checkpoints'
    symmetric convention) and ``--quantize w8a8`` (max|w| / 127 per row, int8 activations per token) write the
    packed form, whole and per tensor-parallel rank, and the file computes what the format's NumPy encoding of the
    float weights stands for (float32, composite backend; W8A8 within the flip bound of its own test)."""
    import mindspore as ms
    from safetensors.numpy import load_file

    from conftest import cli_batch
    from hf_checkpoint import make_checkpoint
    from ms_swiglu import load_mlp

    hidden, inter = 128, 256
    stored = make_checkpoint(tmp_path / "f", hidden=hidden, inter=inter, layers=1, seed=13)
    p = "model.layers.0.mlp."
    runs = cli_batch([["convert", "--checkpoint", str(tmp_path / "f"), "--output", str(tmp_path / f"{q}.safetensors"),
                       "--quantize", q, *tp] for q in ("int4-g128", "w8a8") for tp in ([], ["--tp-size", "2"])])
    assert [r.returncode for r in runs] == [0] * 4, [r.stderr[-800:] for r in runs]
    f = load_file(tmp_path / "int4-g128.safetensors")
    assert f[p + "gate_up_proj.weight"].dtype == np.uint8 and f[p + "gate_up_proj.weight"].shape == (2 * inter,
                                                                                                      hidden // 2)
    assert f[p + "down_proj.weight_scale"].shape == (hidden, inter // 128)
    r1 = load_file(tmp_path / "w8a8-tp1-of-2.safetensors")
    assert r1[p + "down_proj.weight"].dtype == np.int8 and r1[p + "down_proj.weight"].shape == (hidden, inter // 2)
    x = np.random.default_rng(14).standard_normal((4, hidden)).astype(np.float32)
    for q in ("int4-g128", "w8a8"):
        method = formats.get(q)
        w = {k: method.decode(method.encode(stored[p + f"{k}_proj.weight"])) for k in ("gate", "up", "down")}
        want = _mlp_oracle(x, w["gate"], w["up"], w["down"], w8a8=q == "w8a8")
        mlp = load_mlp(str(tmp_path / f"{q}.safetensors"), 0, dtype="float32", backend="composite")
        assert mlp.quant == q
        got = mlp(ms.Tensor(x)).asnumpy()
        if q == "w8a8":
            # the oracle repeats the activations' quantization in float32; only down's input h differs (float32
            # against float64 sums), and where an h / s lands within that of a half, its rounding flips: one step
            # s_h = max|h| / 127 on one input moves an output by s_h |w_down| at most
            g, u = (_mlp_oracle_proj(x, w[k]) for k in ("gate", "up"))
            s_h = np.abs(g / (1 + np.exp(-g)) * u).max(-1, keepdims=True) / 127
            bound = 1e-5 + 1.3e-6 * np.abs(want) + s_h * np.abs(w["down"]).max()
            assert (np.abs(got - want) <= bound).all()
        else:
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1.3e-6)


def _mindir_tensors(path):
    """{parameter name (the graph's prefix removed): NumPy array} of a MindIR's stored weights, by their types:
    Ascend's int4 (type 18) as its packed bytes, uint8, int8, float32, float16."""
    from mindspore.train import mind_ir_pb2

    model = mind_ir_pb2.ModelProto()
    model.ParseFromString(open(path, "rb").read())
    kinds = {18: np.uint8, mind_ir_pb2.TensorProto.UINT8: np.uint8, mind_ir_pb2.TensorProto.INT8: np.int8,
             mind_ir_pb2.TensorProto.FLOAT: np.float32, mind_ir_pb2.TensorProto.FLOAT16: np.float16}
    return {p.name.split(":")[-1]: np.frombuffer(p.raw_data, kinds[p.data_type]).reshape(list(p.dims))
            for p in model.graph.parameter if p.data_type in kinds and p.raw_data}


def _ascend_int4(packed, scale, zero):
    """What WeightQuantBatchMatmul / GroupedMatmulV4 compute from the held int4 ``packed`` [..., K, N/2] (signed
    nibbles, the even n in the low one) with antiquant ``(w + offset) * scale``, offset ``8 - z`` and the scales
    [..., N, G] the graph transposes to [..., G, N]; returned as [..., N, K] float64."""
    lo = (packed & 15).astype(np.int16)
    hi = (packed >> 4).astype(np.int16)
    signed = np.stack([np.where(lo > 7, lo - 16, lo), np.where(hi > 7, hi - 16, hi)], -1)
    w = np.swapaxes(signed.reshape(*packed.shape[:-1], -1), -1, -2).astype(np.float64)  # [..., N, K]
    groups = w.reshape(*scale.shape, -1)
    return ((groups + (8.0 - zero[..., None])) * scale[..., None].astype(np.float64)).reshape(w.shape)


def test_ascend_exports_hold_int4_as_the_device_reads_it_and_w8a8_with_its_quant_ops(dense_float, tmp_path):
    """``export --target ascend`` of an asymmetric GPTQ checkpoint (dense) and a compressed-tensors W4A16 MoE:
    the MindIR holds the int4 weights as qint4x2 (type 18) in the layout and sign MindSpore's own Ascend test of
    WeightQuantBatchMatmul feeds ([K, N/2], u - 8), and decoding them as the device does gives exactly the
    checkpoint's weights; the graphs take them with WeightQuantBatchMatmul and GroupedMatmulV4. W8A8 (dynamic:
    DynamicQuantExt + QuantBatchMatmul; static: QuantV2 + QuantBatchMatmul with msModelSlim's folded bias) holds
    int8 weights. Refused, exit 2 with one line: int4 groups the op does not take, static W8A8 experts."""
    import json

    from conftest import cli_batch
    from hf_checkpoint import make_checkpoint
    from ms_swiglu.checkpoint import hf, open_checkpoint
    from quant_checkpoint import to_quantized

    gptq, slim, moe, moe_q = (tmp_path / n for n in ("gptq", "slim", "moe", "moe-q"))
    to_quantized(str(dense_float), str(gptq), "gptq", group=32, symmetric=False)
    to_quantized(str(dense_float), str(slim), "modelslim", kind="W8A8")
    make_checkpoint(moe, model_type="qwen3_moe", hidden=H, inter=64, moe_inter=64, layers=1, experts=4, top_k=2,
                    seed=8)
    to_quantized(str(moe), str(moe_q), "ct-w4a16", group=32, symmetric=False, ignore_extra=["re:.*gate$"])
    gptq16, moe_static = tmp_path / "gptq16", tmp_path / "moe-static"
    to_quantized(str(dense_float), str(gptq16), "gptq", group=16)
    to_quantized(str(moe), str(moe_static), "ct-w8a8", static=True, ignore_extra=["re:.*gate$"])
    export = ["export", "--layer", "0", "--target", "ascend", "--dtype", "float16", "--output-dir"]
    runs = cli_batch([export + [str(tmp_path / "e-gptq"), "--checkpoint", str(gptq)],
                      export + [str(tmp_path / "e-moe"), "--checkpoint", str(moe_q)],
                      export + [str(tmp_path / "e-slim"), "--checkpoint", str(slim)],
                      export + [str(tmp_path / "e-w8a8"), "--checkpoint", str(moe), "--quantize", "w8a8"],
                      export + [str(tmp_path / "e-16"), "--checkpoint", str(gptq16)],
                      export + [str(tmp_path / "e-x"), "--checkpoint", str(moe_static)],
                      export[:-1] + ["--target", "portable", "--output-dir", str(tmp_path / "p-gptq"),
                                     "--checkpoint", str(gptq)],
                      export[:-1] + ["--target", "portable", "--output-dir", str(tmp_path / "p-slim"),
                                     "--checkpoint", str(slim)],
                      export[:-1] + ["--target", "ge", "--output-dir", str(tmp_path / "g-gptq"), "--checkpoint",
                                     str(gptq)]])
    assert [r.returncode for r in runs[:4]] == [0] * 4, [r.stderr[-1500:] for r in runs[:4]]
    ops = {}
    for name in ("e-gptq", "e-moe", "e-slim", "e-w8a8"):
        m = json.loads((tmp_path / name / "manifest.json").read_text())
        ops[name] = set(m["op_types"])
        tensors = _mindir_tensors(tmp_path / name / m["model_file"])
        if name in ("e-gptq", "e-moe"):
            ckpt = open_checkpoint(str(gptq if name == "e-gptq" else moe_q))
            stored, _, method = hf.read_layer_as_stored(ckpt.shards, ckpt.config, 0)
            pairs = ({"gate_up": "gate_up_proj.weight", "down": "down_proj.weight"} if name == "e-gptq" else
                     {"gate_up": "experts.gate_up_proj", "down": "experts.down_proj"})
            for kind, param in pairs.items():
                want = method.decode({s: stored[kind + s] for s in ("", "_scale", "_zero")})
                got = _ascend_int4(tensors[param], tensors[param + "_scale"], tensors[param + "_zero"])
                np.testing.assert_array_equal(got, want.astype(np.float64))
    assert {"WeightQuantBatchMatmul"} <= ops["e-gptq"] and {"GroupedMatmulV4", "MoeInitRoutingV2"} <= ops["e-moe"]
    assert {"QuantV2", "QuantBatchMatmul"} <= ops["e-slim"] and "DynamicQuantExt" not in ops["e-slim"]
    assert {"DynamicQuantExt", "GroupedMatmulV4"} <= ops["e-w8a8"]  # (Qwen3-MoE: no shared expert)
    lines = [r.stderr.strip().splitlines() for r in runs[4:6]]
    assert [r.returncode for r in runs[4:6]] == [2, 2] and all(len(ls) == 1 for ls in lines), lines
    assert "backend ascend: expected weights in a format it computes, got int4-g16" in lines[0][0]
    assert "expected weight-only or dynamic int8 activations, got w8a8-static" in lines[1][0]
    # portable (its reloaded MindIR run on the CPU against the golden outputs) and ge dequantize in the graph
    assert [r.returncode for r in runs[6:]] == [0, 0, 0], [r.stderr[-1500:] for r in runs[6:]]
    for name in ("p-gptq", "p-slim"):
        m = json.loads((tmp_path / name / "manifest.json").read_text())
        reloaded = m["verification"]["reloaded"]
        assert len(reloaded) == 2 and all(": pass:" in line for line in reloaded), reloaded
        assert m["weights"]["quant"] == ("int4-g32-zp" if name == "p-gptq" else "w8a8-static")
    ge = json.loads((tmp_path / "g-gptq" / "manifest.json").read_text())
    assert ge["runtime_paths"]["ge"]["evidence"] and "WeightQuantBatchMatmul" not in ge["op_types"]
