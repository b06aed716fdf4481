"""Tensor parallelism for the packed MLP and the MoE experts (not run on Ascend hardware here: HCCL on Ascend,
mccl between CPU processes here; both through ``mindspore.communication``).

Rank r of p holds the column-parallel block ``[gate_r; up_r]`` of ``gate_up`` ([2I/p, H]) and the row-parallel
block ``down[:, r]`` ([H, I/p]); it computes ``SiLU(x W_gate,r) * (x W_up,r) W_down,r`` locally, and one
AllReduce sums the partial outputs. The split itself lives in ``ms_swiglu.packing`` (``shard_packed``,
``shard_down``) and in the checkpoint loader, which reads only the rank's block.
"""
import mindspore as ms
from mindspore import nn, ops
from mindspore.common import dtype as mstype

from ms_swiglu.errors import InputError


class AllReduceSum(nn.Cell):
    """Sums a tensor over the ranks of the world group. Shapes: [T, H] -> [T, H]. bfloat16 is summed in float32
    on a CPU device (its AllReduce has float32 and float16 kernels only), and rounded once."""

    def __init__(self):
        super().__init__()
        self.all_reduce = ops.AllReduce()
        self.widen_bf16 = ms.get_context("device_target") == "CPU"

    def construct(self, x):
        if self.widen_bf16 and x.dtype == mstype.bfloat16:
            return self.all_reduce(x.astype(mstype.float32)).astype(x.dtype)
        return self.all_reduce(x)


def reduce_cell(tp_size):
    """The Cell that closes a row-parallel layer: an AllReduce for tp_size > 1, the identity otherwise."""
    return AllReduceSum() if tp_size > 1 else nn.Identity()


def init(tp_size):
    """Join the launched group (msrun sets the environment) and return this process's rank."""
    from mindspore.communication import get_group_size, get_rank  # noqa: PLC0415
    from mindspore.communication import init as init_comm  # noqa: PLC0415

    init_comm()
    if get_group_size() != tp_size:
        raise InputError(f"tp_size: expected the launched world size {get_group_size()}, got {tp_size}")
    return get_rank()
