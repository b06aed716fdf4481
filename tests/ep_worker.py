"""One rank of the expert-parallel Cell tests (tests/test_expert_parallel.py), started by msrun: for every case of
CASES, this rank's expert-parallel block (``load_moe(..., ep_size, rank, dispatch)``) and the whole layer in one
process (no collective) run on the same tokens; both outputs go to ``OUT/rank{r}.npz`` for the test to compare.

    ep_worker.py OUT CHECKPOINTS_JSON

CHECKPOINTS_JSON: {name: [folder, layer]}. Every rank runs the cases in the same order (their collectives pair).
"""
import json
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import nn

from ms_swiglu import parallel
from ms_swiglu.checkpoint.load import load_moe

K = 2
# (checkpoint, dtype, quant): every family in float32; bfloat16 and int8 (bfloat16 activations) on two of them,
# float16 on one
BLOCKS = [("mixtral", "float32", None), ("qwen2_moe", "float32", None), ("qwen3_moe", "float32", None),
          ("deepseek_v3", "float32", None), ("qwen2_moe", "bfloat16", None), ("deepseek_v3", "bfloat16", None),
          ("qwen3_moe", "float16", None),
          ("qwen3_moe", "bfloat16", "int8"), ("deepseek_v3", "bfloat16", "int8")]
# rows each rank brings with sharded tokens (replicated: every rank all of them): 1 token; fewer tokens than
# ranks; none on one rank; uneven; many
ROWS = [(1, 0), (0, 1), (6, 0), (3, 2), (9, 7)]


class Partial(nn.Cell):
    """This rank's partial output of an expert-parallel block before the AllReduce adds the ranks' partials: its
    router, its experts' rows, no shared expert (the test's error bound is relative to it)."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def construct(self, x):
        weights, ids = self.block.router(x)
        return self.block.experts(x, self.block.dispatch.local(ids, None), weights)


def _steer(block, to_rank, hidden):
    """Route every token (x > 0) to rank ``to_rank``'s experts only: its router rows positive, the others'
    negative (DeepSeek: its correction bias too, which alone chooses)."""
    w = block.router.weight
    e = w.shape[0]
    rows = np.full((e, hidden), -1.0 / hidden, np.float32)
    rows[to_rank * e // K:(to_rank + 1) * e // K] = np.linspace(0.5, 1.5, e // K)[:, None] / hidden
    w.set_data(ms.Tensor(rows).astype(w.dtype))
    bias = getattr(block.router, "e_score_correction_bias", None)
    if bias is not None:
        b = np.full(e, -10.0, np.float32)
        b[to_rank * e // K:(to_rank + 1) * e // K] = 10.0
        bias.set_data(ms.Tensor(b))


def main(out, checkpoints):
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    rank = parallel.init(K)
    with open(checkpoints) as f:
        ckpts = json.load(f)
    results = {}
    for name, dtype, quant in BLOCKS:
        folder, layer = ckpts[name]
        mstype = getattr(ms, dtype)
        whole = load_moe(folder, layer, dtype=dtype, quant=quant)
        hidden = whole.hidden_size
        blocks = {d: load_moe(folder, layer, dtype=dtype, quant=quant, ep_size=K, rank=rank, dispatch=d)
                  for d in ("replicated", "sharded")}
        partial = Partial(blocks["replicated"])
        for b in (whole, blocks["replicated"], partial):  # dynamic token counts: one compile per block
            b.set_inputs(ms.Tensor(shape=[None, hidden], dtype=mstype))
        blocks["sharded"].set_inputs(ms.Tensor(shape=[None, hidden], dtype=mstype),
                                     ms.Tensor(shape=[1], dtype=ms.int32))
        rng = np.random.default_rng(7)
        for steer in (None, 0, 1):  # real routing; all tokens to rank 0's experts; all to rank 1's
            if steer is not None:
                for b in (whole, *blocks.values()):
                    _steer(b, steer, hidden)
            for rows in ROWS if steer is None else ROWS[-1:]:
                x = rng.standard_normal((sum(rows), hidden)).astype(np.float32)
                if steer is not None:
                    x = np.abs(x)
                xt = ms.Tensor(x).astype(mstype)
                want = whole(xt).astype(ms.float32).asnumpy()
                key = f"{name}/{dtype}/{quant}/{steer}/{rows[0]}+{rows[1]}"
                results[f"{key}/replicated/got"] = blocks["replicated"](xt).astype(ms.float32).asnumpy()
                results[f"{key}/replicated/want"] = want
                results[f"{key}/partial"] = partial(xt).astype(ms.float32).asnumpy()
                mine = slice(sum(rows[:rank]), sum(rows[:rank + 1]))
                own = np.zeros((max(rows), hidden), np.float32)
                own[:rows[rank]] = x[mine]
                got = blocks["sharded"](ms.Tensor(own).astype(mstype), ms.Tensor([rows[rank]], ms.int32))
                got = got.astype(ms.float32).asnumpy()
                results[f"{key}/sharded/got"] = got[:rows[rank]]
                results[f"{key}/sharded/padding"] = got[rows[rank]:]  # rows of no token: zeros
                results[f"{key}/sharded/want"] = want[mine]
    np.savez(os.path.join(out, f"rank{rank}.npz"), **results)


if __name__ == "__main__":
    main(*sys.argv[1:])
