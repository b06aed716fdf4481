"""The feed-forward half of a LLaMA/Qwen decoder layer: ``x + MLP(RMSNorm(x))``.

Shape legend: T = tokens (any leading dims), H = hidden_size, I = intermediate_size.
"""
import mindspore as ms
import numpy as np
from mindspore import nn

from ms_swiglu import backends
from ms_swiglu.backends.spec import SwiGLUOp
from ms_swiglu.cells import TokenCell
from ms_swiglu.config import to_dtype
from ms_swiglu.errors import InputError
from ms_swiglu.mlp import PackedSwiGLUMLP


class RMSNorm(nn.Cell):
    """``weight * x / sqrt(mean(x^2) + eps)``, statistics and scaling in float32, rounded once, on ``backend``
    (its fused op, or MindSpore's ops).

    Shapes:
        x: [T, H]    weight: [H]    out: [T, H]
    """

    def __init__(self, hidden_size, eps=1e-6, dtype=ms.float32, backend="auto"):
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(np.ones(hidden_size, np.float32)).astype(to_dtype(dtype)), name="weight")
        self.norm = backends.resolve(backend).rms_norm(eps)

    def construct(self, x):
        return self.norm(x, self.weight)


RECOMPUTE = ("none", "full", "selective")


class FFNBlock(TokenCell):
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
            raise InputError(f"recompute: expected one of {', '.join(RECOMPUTE)}, got {recompute!r}")
        self.mlp = mlp or PackedSwiGLUMLP(hidden_size, intermediate_size, dtype=dtype, backend=backend)
        # the norm and the residual add on the MLP's backend (the unpacked baseline has none: then `backend`)
        mlp_backend = getattr(self.mlp, "backend", None)
        ops_backend = mlp_backend or backends.resolve(backend)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps, dtype, backend=ops_backend)
        self.residual = ops_backend.add()
        self.recompute_mode = recompute
        if recompute != "none" and not (mlp_backend and mlp_backend.recomputable):  # the baseline recomputes nothing
            able = ", ".join(name for name in backends.REGISTRY if backends.get(name).recomputable)
            name = mlp_backend.name if mlp_backend else "none"
            raise InputError(f"recompute={recompute!r}: expected a backend MindSpore can recompute ({able}), got "
                             f"{name} (graph-mode recompute does not re-run aot Custom ops; the cpu backend never "
                             f"stores [T, 2I]: its backward recomputes the gate/up GEMM)")
        acts = [cell for _, cell in self.cells_and_names() if isinstance(cell, SwiGLUOp)]
        if recompute == "full":
            self.recompute()
        elif recompute == "selective":
            for act in acts:
                act.recompute()

    def construct(self, x):
        return self.step(x)[0]

    def step(self, x):
        """(the block's output, its MLP's output): [T, H] -> ([T, H], [T, H])."""
        branch = self.mlp(self.post_attention_layernorm(x))
        return self.residual(x, branch), branch


class FFNStack(TokenCell):
    """Consecutive :class:`FFNBlock` s (attention left out), as exported for ``--layers A-B``.

    ``branch_outputs``: the stack also returns each block's MLP (or MoE) output, after its own: an exported kit
    checks every block through them (a block's branch may be a hundredth of the residual stream it adds to, too
    small to see in the stack's output).

    Outputs:
        Tensor [..., H]; with ``branch_outputs`` a tuple (out, branch of block 0, ..., branch of block L-1).
    """

    def __init__(self, blocks, branch_outputs=False):
        super().__init__()
        self.blocks = nn.CellList(blocks)
        self.branch_outputs = branch_outputs
        self.n_outputs = 1 + len(blocks) if branch_outputs else 1

    def construct(self, x):
        branches = ()
        for block in self.blocks:
            x, branch = block.step(x)
            branches = branches + (branch,)
        if self.branch_outputs:
            return (x,) + branches
        return x
