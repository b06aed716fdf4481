"""The peer for `ms-swiglu bench --peer-python`: HuggingFace's LlamaMLP in PyTorch, served over a pipe.

Runs under another interpreter (one with torch, e.g. `pip install torch==2.13.0` in its own venv) and imports
only torch and the standard library. The bench sends one line per request and times the round trip, so the
peer's calls are interleaved with the MindSpore variants in the same run:

    tokens N   -> builds the input [N, H]                                     reply: ok
    run        -> one forward of every MLP layer, chained                     reply: ok
    model      -> every decoder FFN block, chained: x + mlp(rmsnorm(x))       reply: ok
    gemm       -> one [N, H] x [H, 2I] matmul: PyTorch's (oneDNN's) GEMM      reply: ok

The MLP is transformers' LlamaMLP (`down_proj(act_fn(gate_proj(x)) * up_proj(x))`, three bias-free nn.Linear,
SiLU) and the norm its LlamaRMSNorm (float32 statistics), with seeded random weights: the peer is timed, not
checked for values.

Usage: <python with torch> torch_peer.py HIDDEN INTER DTYPE LAYERS [BLOCKS]
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


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden, dtype, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(hidden, dtype=dtype)), eps

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Block(nn.Module):
    def __init__(self, hidden, inter, dtype):
        super().__init__()
        self.post_attention_layernorm, self.mlp = LlamaRMSNorm(hidden, dtype), LlamaMLP(hidden, inter, dtype)

    def forward(self, x):
        return x + self.mlp(self.post_attention_layernorm(x))


def main(argv):
    hidden, inter, dtype, layers = int(argv[0]), int(argv[1]), getattr(torch, argv[2]), int(argv[3])
    blocks = int(argv[4]) if len(argv) > 4 else 0
    torch.manual_seed(0)
    mlps = [LlamaMLP(hidden, inter, dtype).eval() for _ in range(layers)]
    model = [Block(hidden, inter, dtype).eval() for _ in range(blocks)]
    w = torch.randn(2 * inter, hidden).to(dtype)
    x = None
    print(f"ready torch {torch.__version__} threads {torch.get_num_threads()}", flush=True)
    with torch.inference_mode():
        for line in sys.stdin:
            cmd = line.split()
            if cmd[0] == "tokens":
                x = torch.randn(int(cmd[1]), hidden).to(dtype)
            elif cmd[0] in ("run", "model"):
                y = x
                for layer in mlps if cmd[0] == "run" else model:
                    y = layer(y)
            elif cmd[0] == "gemm":
                torch.matmul(x, w.t())
            else:
                print(f"error: expected 'tokens N', 'run', 'model' or 'gemm', got {line.strip()!r}", flush=True)
                return 2
            print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
