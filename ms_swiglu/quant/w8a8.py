"""int8 weights per output row with int8 activations (W8A8): dynamic per token (compressed-tensors' ``int-quantized``
with dynamic token activations, msModelSlim's ``W8A8_DYNAMIC``; ``w8a8`` for float checkpoints) or static per
tensor (msModelSlim's ``W8A8``). NumPy only; the cpu backend's kernels are the C++ rows ``w8a8`` and
``w8a8-static``.

The products are summed exactly (integers), then
    dynamic: ``y[t, m] = (x_q[t] . q[m]) * s_x[t] * scale[m]`` with ``s_x[t] = max|x[t]| / 127``,
             ``x_q = round(x / s_x)`` (Ascend's DynamicQuant and vLLM's kernels; the compressed-tensors library's
             own reference divides by 127.5: ~0.4% apart, see docs/quantization.md);
    static:  ``y[t, m] = ((x_q[t] - o) . q[m]) * scale[m]`` with the checkpoint's ``s_x`` and ``o``,
             ``x_q = clip(round(x / s_x + o), -128, 127)``, and ``scale`` the row's whole dequantization scale
             ``s_x * s_w`` (msModelSlim's ``deq_scale``, what Ascend's QuantBatchMatmul multiplies by).

Shapes:
    q: [..., M, K] int8    scale: [..., M] float32    input_scale, input_offset: [..., 1] float32 (static)
"""
from ms_swiglu.quant.base import Activation, Part, QuantMethod
from ms_swiglu.quant.int8 import dequantize_int8, quantize_int8
from ms_swiglu.schema import INPUT_OFFSET, INPUT_SCALE, SCALE


class W8A8(QuantMethod):
    """int8 weights, a float32 scale per output row, ``q`` in [-127, 127] (``scale = max|w| / 127`` where
    quantized from float), and int8 activations ``activation`` (:class:`~ms_swiglu.quant.base.Activation`)."""

    quantized = True
    bits = 8
    # the per-token scale from the rounded activations (and the weight scale where the op takes it in bfloat16);
    # the int8 activations' own rounding flips are the chain's ``quantizers`` (ms_swiglu.export.chain)
    roundings = 1

    def __init__(self, activation):
        self.activation = activation
        static = activation is Activation.STATIC
        self.quantizes = not static  # its activation scale comes from a calibrated checkpoint
        self.name = "w8a8-static" if static else "w8a8"
        self.kernel = self.name  # the C++ library's rows (int8 x int8 summed in int32, x quantized in the op)
        self.parts = (Part("", "int8", per=1), Part(SCALE, "float32"),
                      *([Part(INPUT_SCALE, "float32", rows=False), Part(INPUT_OFFSET, "float32", rows=False)]
                        if static else []))
        self.summary = f"int8 weights with a float32 scale per output row, activations {activation.value}"

    def encode(self, w):
        if self.activation is Activation.STATIC:  # its activation scale comes from calibration, not the weights
            from ms_swiglu.errors import InputError  # noqa: PLC0415

            raise InputError("quantize: expected w8a8 (dynamic activations) for float weights, got w8a8-static "
                             "(its activation scales come from a calibrated checkpoint)")
        q, scale = quantize_int8(w)
        return {"": q, SCALE: scale}

    def decode(self, parts):
        """The float32 weights ``q * s_w`` (static: ``scale / s_x``, the weights' own scale)."""
        w = dequantize_int8(parts[""], parts[SCALE])
        return w / parts[INPUT_SCALE][..., None] if self.activation is Activation.STATIC else w

    def dequantize_op(self):
        from ms_swiglu.quant.graph import dequantize_int8  # noqa: PLC0415

        return lambda w, aux, dtype: dequantize_int8(w, aux[:1], dtype)

    def activation_op(self):
        from ms_swiglu.quant import graph  # noqa: PLC0415

        if self.activation is Activation.STATIC:
            return lambda x, aux: graph.quantize_static(x, aux[1], aux[2])
        return lambda x, aux: graph.quantize_tokens(x)
