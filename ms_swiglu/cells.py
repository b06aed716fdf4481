"""The base of the package's token-wise blocks (MLP, MoE, FFN): ``[..., H] -> [..., H]``."""
from mindspore import Tensor, nn, ops


class TokenCell(nn.Cell):
    """A Cell whose output has the shape of its input ``[..., H]``. Called with no token (a leading dim 0) it
    returns ``[..., 0, H]`` without running its graph, so that no graph holds a branch for that case (graphs
    exported for a device stay straight-line, and a device kernel such as aclnnSwiGlu never sees an empty
    tensor); inside a larger graph it is that graph's input that decides."""

    def __call__(self, *args, **kwargs):
        x = args[0] if args else None
        if isinstance(x, Tensor) and x.ndim >= 2 and 0 in x.shape[:-1]:
            outputs = getattr(self, "n_outputs", 1)  # a Cell that also returns its branches gives each empty
            return ops.zeros(x.shape, x.dtype) if outputs == 1 else tuple(ops.zeros(x.shape, x.dtype)
                                                                            for _ in range(outputs))
        return super().__call__(*args, **kwargs)
