"""What the package asks of a backend: one :class:`Backend` record per backend, built by its own module.

Shape legend: T = tokens (any leading dims), K = d_in, M = d_out, H = hidden_size, I = intermediate_size,
E = experts, k = experts per token.
"""
import dataclasses
import enum
from typing import Callable, Optional

import numpy as np
from mindspore import nn

from ms_swiglu.errors import InputError


class Compute(enum.Enum):
    """How a backend computes a weight format (``Backend.formats``)."""

    KERNEL = "its own kernels"
    GRAPH = "dequantized in the graph (MindSpore ops; W8A8: int8 activations quantized there too)"


def in_graph(method):  # noqa: ARG001 -- every format
    """``Backend.formats`` of a backend that runs every format through its ``dequantize_op``."""
    return Compute.GRAPH


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the exporter and the benchmarks know of a backend's graphs (no ops)."""

    deployable: str  # where an exported graph of it can run; "" when it is bound to the host that built it
    graph_ops: frozenset  # op types that mark it in an exported graph (and that no other backend's graph may hold)
    # (n, hidden, inter, itemsize) -> bytes of the intermediate tensors one MLP call materialises
    activation_bytes: Callable
    allowed_ops: Optional[frozenset] = None  # when set, the only op types an exported graph may hold
    partial_ops: frozenset = frozenset()  # op types its experts add on an expert-parallel rank (``partial``)
    # its MoE graphs need a static token count (an op attribute the device's compiler fixes): exported only with
    # a static input shape
    static_moe: bool = False
    expert_parallel: bool = True  # its experts run on an expert-parallel rank (``Backend.experts`` with ``partial``)


@dataclasses.dataclass(frozen=True)
class Backend:
    """One backend: its op factories (each called anew for each Cell that uses them), what the Cells need to know
    to build on it, and its :class:`Facts`.

    ``quant`` below is a weight format (``ms_swiglu.quant``); a backend refuses one it has no kernel for
    (:func:`check_format`)."""

    name: str
    summary: str  # one line: what it runs
    # () -> SwiGLUOp: [T, 2I] ([gate, up]) -> [T, I] = SiLU(gate) * up
    swiglu: Callable
    # (dtype, swiglu, quant) -> Cell (x [T, K], w [M, K], scale) -> x w^T [T, M], or with swiglu its SwiGLU
    # [T, M/2]; w and scale as the format stores them (scale None without one)
    linear: Callable
    # (dtype, quant, partial=False) -> ExpertsOp (x [T, H], ids [T, k] int32, weights [T, k] float32, w_gate_up,
    # w_down, s_gate_up, s_down) -> [T, H]: the routed experts of a MoE block, sum_j weights[t, j] * expert_ids[t,
    # j](x[t]), every shape static given T; with ``partial`` an id may be -1, a slot of another rank's expert (expert
    # parallelism), which adds nothing
    experts: Callable
    # (eps) -> Cell (x [T, H], w [H]) -> [T, H]: RMSNorm, float32 statistics, rounded once
    rms_norm: Callable
    # () -> Cell (a, b) -> a + b: the FFN block's residual connection
    add: Callable
    device: Optional[str]  # the MindSpore device target it runs on ("CPU", "Ascend"); None: any
    recomputable: bool  # MindSpore's graph-mode recompute can run its SwiGLU again (FFNBlock recompute modes)
    upcasts_on_cpu: bool  # its MindSpore MatMuls take float16/bfloat16 in float32 on a CPU device
    dynamic_shapes: bool  # a graph with dynamic token counts compiles
    facts: Facts
    # (router config, hidden_size, num_experts, top_k, dtype) -> the router Cell of a MoE block in ops its graphs
    # take (same Parameters as the config's own router); None: the config's own (``ms_swiglu.routers``)
    router: Optional[Callable] = None
    # (quant method) -> Compute: how it computes each quantized format, None where it refuses one (the support
    # table in docs/quantization.md is this, per backend)
    formats: Callable = in_graph

    def runs_on(self, device_target):
        return self.device in (None, device_target)

    def __repr__(self):
        return f"<backend {self.name}>"


def check_format(backend, method):
    """How ``backend`` (a :class:`Backend`) computes the weight format ``method`` (:class:`Compute`); InputError
    where it refuses it."""
    how = backend.formats(method) if method.quantized else Compute.KERNEL
    if how is None:
        raise InputError(f"backend {backend.name}: expected weights in a format it computes, got {method.name}")
    return how


class WeightForm:
    """How an op holds a weight (a format's weight part), for the loaders to convert to once and the exporter's golden
    network to convert back from: this base holds it as the format stores it, ``[..., out, in]``. ``store`` and
    ``unstore`` take an array in the format's storage, or a logical shape ``(..., out, in)``."""

    in_out = False  # the op takes [..., in, out]
    packs = False  # it repacks a packed format along its held last axis (else such formats are refused in_out)
    dtype = None  # the Parameter's MindSpore dtype; None: the format's part dtype

    def store(self, w):
        """A weight as the format stores it (an array, or its logical shape) as this op holds it."""
        if not self.in_out:
            return w
        if isinstance(w, tuple):
            return (*w[:-2], w[-1], w[-2])
        return np.ascontiguousarray(np.swapaxes(w, -1, -2))

    def unstore(self, w):
        """The inverse of :meth:`store`."""
        return self.store(w)


@dataclasses.dataclass(frozen=True)
class Derived:
    """A value an op computes once at load from a weight's parts (``{suffix: array}`` as the format stores them)
    and takes after them, one per output row ``[M]``: e.g. the int32 bias that folds a static activation offset
    into an integer GEMM. The Cell holds it as ``{weight}{suffix}``."""

    suffix: str
    dtype: str
    compute: Callable


IN_OUT = type("InOut", (WeightForm,), {"in_out": True, "__doc__": "Weights held [..., in, out]."})()


class ExpertsOp(nn.Cell):
    """A backend's routed experts. ``form`` (:class:`WeightForm`): how it holds the stacked weights, e.g. [E, in,
    out] rather than HF's [E, out, in]; :meth:`store` and :meth:`unstore` convert (once, at load), so no layout
    reaches the Cells."""

    form = WeightForm()
    # it takes ``residual`` [T, H] (after the scales) and adds it to the weighted sum itself: the shared expert's
    # output, which GE's MoeFinalizeRouting adds in the same pass
    adds_residual = False

    def store(self, w):
        """A stacked weight [E, out, in] (an array, or its shape) as this op holds it."""
        return self.form.store(w)

    def unstore(self, w):
        """The inverse of :meth:`store`: [E, out, in] again."""
        return self.form.unstore(w)


class SwiGLUOp(nn.Cell):
    """A backend's SwiGLU as a Cell: ``fn(x)``, [T, 2I] -> [T, I]. FFNBlock's selective recompute marks these."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, x):
        return self.fn(x)
