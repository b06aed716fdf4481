"""The feed-forward half of a LLaMA/Qwen decoder layer: ``x + MLP(RMSNorm(x))``.

Shape legend: T = tokens (any leading dims), H = hidden_size, I = intermediate_size.
"""
import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.common import dtype as mstype

from ms_swiglu.activation import SwiGLU
from ms_swiglu.linear import Linear
from ms_swiglu.checkpoint import SafetensorsFolder, read_config
from ms_swiglu.config import to_dtype
from ms_swiglu.mlp import PackedSwiGLUMLP, load_mlp, load_weights, param_dtype
from ms_swiglu.moe import load_moe


class RMSNorm(nn.Cell):
    """``weight * x / sqrt(mean(x^2) + eps)``, statistics and scaling in float32, rounded once.

    Shapes:
        x: [T, H]    weight: [H]    out: [T, H]
    """

    def __init__(self, hidden_size, eps=1e-6, dtype=ms.float32):
        super().__init__()
        self.eps = eps
        self.weight = ms.Parameter(ms.Tensor(np.ones(hidden_size, np.float32)).astype(to_dtype(dtype)), name="weight")

    def construct(self, x):
        x32 = x.astype(mstype.float32)
        var = ops.mean(x32 * x32, -1, keep_dims=True)  # [T, H] -> [T, 1], float32
        return (x32 * ops.rsqrt(var + self.eps) * self.weight.astype(mstype.float32)).astype(x.dtype)


RECOMPUTE = ("none", "full", "selective")
# Backends whose activation MindSpore's graph-mode recompute can run again. Measured here: Cell.recompute,
# primitive recompute and mindspore.recompute never re-run the aot Custom op (its Python bprop puts the
# forward inside a gradient scope), while composite's Split/SiLU/Mul are duplicated in the compiled graph.
_RECOMPUTABLE = ("composite", "ascend")


class FFNBlock(nn.Cell):
    """``x + mlp(post_attention_layernorm(x))``, the FFN half of a decoder layer. ``mlp`` is a
    :class:`PackedSwiGLUMLP` built here, or a packed MLP given (e.g. a :class:`~ms_swiglu.moe.PackedMoE`).

    ``recompute`` (MindSpore's own ``Cell.recompute``, GRAPH_MODE training):
        none       keep every activation for the backward pass
        full       keep only the block input; the whole block runs again in the backward pass
        selective  keep the packed gate_up output (the GEMM result the SwiGLU backward needs) and drop
                   SiLU(gate) * up, which one elementwise pass rebuilds in the backward pass

    Shapes:
        x:   [T, H]
        out: [T, H]
    """

    def __init__(self, hidden_size, intermediate_size, *, eps=1e-6, dtype=ms.float32, backend="auto", mlp=None,
                 recompute="none"):
        super().__init__()
        if recompute not in RECOMPUTE:
            raise ValueError(f"recompute: expected one of {', '.join(RECOMPUTE)}, got {recompute!r}")
        self.post_attention_layernorm = RMSNorm(hidden_size, eps, dtype)
        self.mlp = mlp or PackedSwiGLUMLP(hidden_size, intermediate_size, dtype=dtype, backend=backend)
        self.recompute_mode = recompute
        backends = {cell.backend for _, cell in self.cells_and_names() if isinstance(cell, (SwiGLU, Linear))}
        if recompute != "none" and not backends <= set(_RECOMPUTABLE):
            raise ValueError(f"recompute={recompute!r}: expected a backend MindSpore can recompute "
                             f"({', '.join(_RECOMPUTABLE)}), got {', '.join(sorted(backends))} (graph-mode recompute "
                             f"does not re-run the aot Custom ops; the cpu backend never stores [T, 2I]: its "
                             f"backward recomputes the gate/up GEMM)")
        acts = [cell for _, cell in self.cells_and_names() if isinstance(cell, SwiGLU)]
        if recompute == "full":
            self.recompute()
        elif recompute == "selective":
            for act in acts:
                act.recompute()

    def construct(self, x):
        return x + self.mlp(self.post_attention_layernorm(x))  # [T, H] -> [T, H]


class FFNStack(nn.Cell):
    """Consecutive :class:`FFNBlock` s (attention left out), as exported for ``--layers A-B``."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.CellList(blocks)

    def construct(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def load_ffn(folder, layer, *, dtype=None, backend="auto", recompute="none"):
    """The :class:`FFNBlock` of one checkpoint layer: ``post_attention_layernorm.weight`` + the MLP, or the MoE
    block of a Mixtral checkpoint."""
    config = read_config(folder)
    mlp = (load_moe if config.is_moe else load_mlp)(folder, layer, dtype=dtype, backend=backend)
    block = FFNBlock(config.hidden_size, config.intermediate_size, eps=config.rms_norm_eps,
                     dtype=param_dtype(mlp), mlp=mlp, recompute=recompute)
    norm, _ = SafetensorsFolder(folder).read(f"model.layers.{layer}.post_attention_layernorm.weight",
                                             (config.hidden_size,))
    load_weights(block.post_attention_layernorm, {"weight": norm})
    return block
