"""The peer for `ms-swiglu bench --peer-python`: HuggingFace's LlamaMLP in PyTorch, served over a pipe.

Runs under another interpreter (one with torch, e.g. `pip install torch==2.13.0` in its own venv) and imports
only torch and the standard library. The bench sends one line per request and times the round trip, so the
peer's calls are interleaved with the MindSpore variants in the same run:

    tokens N   -> builds the input [N, H]          reply: ok
    run        -> one forward of every layer         reply: ok

The MLP is transformers' LlamaMLP (`down_proj(act_fn(gate_proj(x)) * up_proj(x))`, three bias-free nn.Linear,
SiLU), with seeded random weights: the peer is timed, not checked for values.

Usage: <python with torch> torch_peer.py HIDDEN INTER DTYPE LAYERS
"""
import sys

import torch
from torch import nn


class LlamaMLP(nn.Module):
    def __init__(self, hidden, inter, dtype):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(hidden, inter, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(inter, hidden, bias=False, dtype=dtype)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def main(argv):
    hidden, inter, dtype, layers = int(argv[0]), int(argv[1]), getattr(torch, argv[2]), int(argv[3])
    torch.manual_seed(0)
    mlps = [LlamaMLP(hidden, inter, dtype).eval() for _ in range(layers)]
    x = None
    print(f"ready torch {torch.__version__} threads {torch.get_num_threads()}", flush=True)
    with torch.inference_mode():
        for line in sys.stdin:
            cmd = line.split()
            if cmd[0] == "tokens":
                x = torch.randn(int(cmd[1]), hidden).to(dtype)
            elif cmd[0] == "run":
                y = x
                for mlp in mlps:  # chained, as the bench's --layers chains its MLPs
                    y = mlp(y)
            else:
                print(f"error: expected 'tokens N' or 'run', got {line.strip()!r}", flush=True)
                return 2
            print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
