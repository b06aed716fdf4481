"""The first values of a Cell's weights: random (He-uniform, as ``nn.Dense`` has them) for a Cell built on its
own, or none at all for a Cell built to be filled from a checkpoint (:func:`empty_weights`): its Parameters are
placeholders that allocate nothing until the loaded arrays replace them. No MindSpore import at module load."""
import contextlib
import math
import threading

_state = threading.local()


@contextlib.contextmanager
def empty_weights():
    """Within the block, Cells are built with placeholder Parameters (a loader fills them next)."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    try:
        yield
    finally:
        _state.depth = depth


def building_empty():
    return getattr(_state, "depth", 0) > 0


def parameter(shape, dtype, name, *, fill=None, requires_grad=True):
    """A Parameter of ``shape`` and ``dtype``: ``fill()`` (a NumPy array of that shape, e.g. int8 zeros) or
    He-uniform random; within :func:`empty_weights` a placeholder."""
    from mindspore import Parameter, Tensor  # noqa: PLC0415
    from mindspore.common.initializer import HeUniform, Zero, initializer  # noqa: PLC0415

    if building_empty():
        value = Tensor(shape=list(shape), dtype=dtype, init=Zero())
    elif fill is not None:
        value = Tensor(fill(), dtype=dtype)
    else:
        value = initializer(HeUniform(math.sqrt(5)), list(shape), dtype)
    return Parameter(value, name=name, requires_grad=requires_grad)
