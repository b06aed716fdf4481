"""FP8 weights with block scales, as DeepSeek-V3/R1 and Qwen3's FP8 releases store them: each linear weight
``float8_e4m3fn`` (``F8_E4M3`` in safetensors) with a float32 ``weight_scale_inv`` of shape
``[ceil(N / b0), ceil(K / b1)]`` beside it, ``w = fp8 * scale_inv`` of the block the element falls in (edge
blocks partial), and in config.json ``"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
"weight_block_size": [b0, b1], ...}``. A stored encoding, decoded on read to float32 with one rounding per element
(the e4m3 value times its block's scale, as DeepSeek's ``weight_dequant`` computes it); the Cells never see it.
No MindSpore here.
"""
import dataclasses

import numpy as np

from ms_swiglu.errors import CheckpointError

FP8 = "float8_e4m3fn"  # the dtype name of F8_E4M3 tensors
SCALE_SUFFIX = "_scale_inv"  # model....weight_scale_inv beside model....weight


def _e4m3_table():
    """The float32 value of each of the 256 float8_e4m3fn bit patterns: 1 sign, 4 exponent (bias 7), 3 mantissa
    bits; exponent 0 subnormal; no infinities; S.1111.111 is NaN."""
    bits = np.arange(256, dtype=np.int64)
    sign = np.where(bits & 0x80, -1.0, 1.0)
    exp, man = (bits >> 3) & 0xF, bits & 0x7
    value = np.where(exp == 0, man / 8 * 2.0 ** -6, (1 + man / 8) * 2.0 ** (exp - 7))
    return np.where((exp == 15) & (man == 7), np.nan, sign * value).astype(np.float32)


E4M3 = _e4m3_table()


def decode_e4m3(raw):
    """float8_e4m3fn bit patterns (uint8) -> their exact float32 values."""
    return E4M3[np.asarray(raw, np.uint8)]


@dataclasses.dataclass(frozen=True)
class BlockFP8:
    """The ``fp8`` quantization_config: e4m3 weights, a float32 scale per ``block`` of each weight."""

    block: tuple = (128, 128)

    def scale_shape(self, shape):
        return tuple(-(-n // b) for n, b in zip(shape, self.block))

    def scale_part(self, shape, part):
        """The blocks of the scales that the rows and columns ``part`` (a tuple of slices, or None) touch."""
        if part is None:
            return None
        return tuple(slice(s.indices(n)[0] // b, -(-s.indices(n)[1] // b)) for s, n, b in
                     zip(part, shape, self.block))

    def dequantize(self, values, scale, shape, part, name):
        """float32 ``values`` (the e4m3 weights of ``part``) times their blocks' scales, rounded once."""
        bad = int((~(np.isfinite(scale) & (scale > 0))).sum())
        if bad:
            raise CheckpointError(f"{name}{SCALE_SUFFIX}: expected finite positive scales, got {bad} of {scale.size} "
                                  f"that are not")
        starts = [0, 0] if part is None else [s.indices(n)[0] for s, n in zip(part, shape)]
        rows = (starts[0] + np.arange(values.shape[0])) // self.block[0] - starts[0] // self.block[0]
        cols = (starts[1] + np.arange(values.shape[1])) // self.block[1] - starts[1] // self.block[1]
        return values * scale[rows][:, cols]  # float32 x float32: one rounding


def encoding(raw, path):
    """The stored encoding config.json's ``quantization_config`` names: None (float weights) or :class:`BlockFP8`;
    anything else is refused by name."""
    qc = raw.get("quantization_config")
    if qc is None:
        return None
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if method != "fp8":
        raise CheckpointError(f"{path}: expected quantization_config.quant_method fp8 (block-scaled e4m3), "
                              f"compressed-tensors, gptq, awq or no quantization_config, got {method!r} (convert the "
                              f"checkpoint to float first)")
    fmt, block = qc.get("fmt", "e4m3"), qc.get("weight_block_size")
    if fmt != "e4m3":
        raise CheckpointError(f"{path}: expected quantization_config.fmt e4m3, got {fmt!r}")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and not isinstance(b, bool)
                                                                and b > 0 for b in block)):
        raise CheckpointError(f"{path}: expected quantization_config.weight_block_size [rows, columns] (positive "
                              f"integers), got {block!r}")
    return BlockFP8(tuple(block))
