"""What a weight format is to the package: a :class:`QuantMethod` (vLLM's quant-method object is the model).

One method per format the Cells compute with; :mod:`ms_swiglu.quant` registers them by name. A method knows its
scales' shape, how to quantize and dequantize an array (NumPy, and in a graph for the native backends), how its
scales split with their weight for a rank, and which Parameters a Cell holds. What a checkpoint stores on disk (an
encoding decoded on read, such as FP8 with block scales) is the checkpoint reader's, not a method's.

Shape legend: M = output rows (any leading dims, e.g. experts), K = inputs of a row.
"""
import numpy as np

from ms_swiglu import initial


from ms_swiglu.schema import SCALE


class QuantMethod:
    """Weights in the compute dtype, no scales: the ``none`` format (and the base of the others)."""

    name = "none"
    summary = "weights in the compute dtype"  # one line for manifests and documents
    quantized = False  # whether weights are stored in another dtype with scales beside them
    stored = None  # the dtype name of the stored weights; None: the compute dtype
    group = None  # inputs per scale; None: one scale per output row

    def __repr__(self):
        return f"<quant {self.name}>"

    def scale_shape(self, rows, k):  # noqa: ARG002
        """The shape of the scales of weights ``[*rows, k]`` (None: no scales)."""
        return None

    def check_inputs(self, k, what="input size"):
        """InputError unless a rank's rows of ``k`` inputs hold whole scale groups."""

    def quantize(self, w):
        """``(stored weights, scales or None)`` of float weights ``[..., M, K]``."""
        return w, None

    def dequantize(self, q, scale):  # noqa: ARG002
        """The float32 weights ``[..., M, K]`` that stored weights and their scales stand for."""
        return np.asarray(q, np.float32)

    def dequantize_op(self):
        """A function ``(w, scale, dtype) -> weights in dtype`` for MindSpore graphs: how the native backends (and
        the reference) apply the format; None where the weights are used as stored."""
        return None

    def shard_scale(self, scale, weight_inputs, columns):
        """The scales of a rank's columns ``columns`` (a slice of the ``weight_inputs`` inputs of each row), for a
        weight split by columns: per-row scales cover whole rows (replicated); per-group ones split with them."""
        return scale

    def create_weights(self, cell, name, shape, dtype, stored=None):
        """Set ``cell.{name}`` (and ``cell.{name}_scale``, None without scales) to this format's Parameters for
        weights ``shape`` ([..., M, K]) computing in ``dtype``; ``stored``: the weight's shape as the Cell holds it,
        where its backend stores it otherwise (the scales follow ``shape``)."""
        setattr(cell, name, initial.parameter(stored or shape, dtype, name))
        setattr(cell, name + SCALE, None)

