"""What the package asks of a backend: one :class:`Backend` record per backend, built by its own module.

Shape legend: T = tokens (any leading dims), K = d_in, M = d_out, H = hidden_size, I = intermediate_size,
E = experts, k = experts per token.
"""
import dataclasses
from typing import Callable, Optional

from mindspore import nn


@dataclasses.dataclass(frozen=True)
class Backend:
    """One backend: its ops (built anew for each Cell that uses them) and the facts the package acts on."""

    name: str
    summary: str  # one line: what it runs
    # () -> SwiGLUOp: [T, 2I] ([gate, up]) -> [T, I] = SiLU(gate) * up
    swiglu: Callable
    # (dtype, swiglu, quant) -> Cell (x [T, K], w [M, K], scale) -> x w^T [T, M], or with swiglu its SwiGLU
    # [T, M/2]; quant None: w in dtype and scale None; "int8": w int8 and scale [M] float32, w = scale[:, None] * q;
    # "int8-g128": scale [M, K/128], each for 128 inputs of its row
    linear: Callable
    # (dtype, quant) -> Cell (x [T, H], ids [T, k] int32, weights [T, k] float32, w_gate_up, w_down, s_gate_up,
    # s_down) -> [T, H]: the routed experts of a MoE block, sum_j weights[t, j] * expert_ids[t, j](x[t]), every
    # shape static given T; int8 weights come with per-row scales [E, 2I] and [E, H] (None otherwise)
    experts: Callable
    # how it stores the stacked expert weights: False [E, 2I, H] and [E, H, I] (out, in: HF's layout), True
    # [E, H, 2I] and [E, I, H] (in, out); loaders convert at load, never per call
    experts_in_out: bool
    device: Optional[str]  # the MindSpore device target it runs on ("CPU", "Ascend"); None: any
    recomputable: bool  # MindSpore's graph-mode recompute can run its SwiGLU again (FFNBlock recompute modes)
    upcasts_on_cpu: bool  # its MindSpore MatMuls take float16/bfloat16 in float32 on a CPU device
    dynamic_shapes: bool  # a graph with dynamic token counts compiles
    deployable: str  # where an exported graph of it can run; "" when it is bound to this host
    graph_ops: frozenset  # op types that mark it in an exported graph (and that no other backend's graph may hold)
    # (n, hidden, inter, itemsize) -> bytes of the intermediate tensors one MLP call materialises
    activation_bytes: Callable
    # (eps) -> Cell (x [T, H], w [H]) -> [T, H]: RMSNorm, float32 statistics, rounded once
    rms_norm: Callable
    # () -> Cell (a, b) -> a + b: the FFN block's residual connection
    add: Callable
    allowed_ops: Optional[frozenset] = None  # when set, the only op types an exported graph may hold

    def runs_on(self, device_target):
        return self.device in (None, device_target)

    def __repr__(self):
        return f"<backend {self.name}>"


class SwiGLUOp(nn.Cell):
    """A backend's SwiGLU as a Cell: ``fn(x)``, [T, 2I] -> [T, I]. FFNBlock's selective recompute marks these."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, x):
        return self.fn(x)
