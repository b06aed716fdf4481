"""One rank of a tensor- or expert-parallel run of one checkpoint layer: the script MindSpore's launcher msrun
starts on every node. ``ms-swiglu run --tp-size K`` (``--ep-size K``) starts it for one node; for several nodes
run msrun yourself, e.g.

    msrun --worker_num=16 --local_worker_num=8 --master_addr=<node 0> --master_port=8118 --node_rank=<0|1> \\
          --log_dir=logs --join=True $(python -m ms_swiglu.launch.worker --path) \\
          --checkpoint DIR --layer N --input X.npy --output Y.npy --ep-size 16 --dispatch sharded

Rank r reads only its own block of every weight (its own experts); rank 0 prints the result line and writes
``--output``.
"""
import argparse
import os
import sys

from ms_swiglu.backends import NAMES
from ms_swiglu.config import DTYPE_NAMES
from ms_swiglu.layout import DISPATCHES
from ms_swiglu.quant import names as quant_names


def parser():
    p = argparse.ArgumentParser(prog="ms_swiglu.launch.worker", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="HuggingFace checkpoint folder or converted file (the same "
                                                       "on every node)")
    p.add_argument("--quantize", choices=quant_names())
    p.add_argument("--layer", type=int, required=True)
    p.add_argument("--input", required=True, help="float .npy of shape [..., hidden_size]")
    p.add_argument("--output", help="rank 0 writes the output here as float32 .npy")
    p.add_argument("--tp-size", type=int, default=1, help="tensor-parallel ranks (the world size msrun launches)")
    p.add_argument("--ep-size", type=int, default=1, help="expert-parallel ranks (the world size msrun launches)")
    p.add_argument("--dispatch", choices=DISPATCHES, default="replicated",
                   help="expert parallelism: the same tokens on every rank, or each rank its block of rows")
    p.add_argument("--dtype", choices=DTYPE_NAMES)
    p.add_argument("--backend", choices=NAMES, default="auto")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--force", action="store_true", help="replace an existing --output")
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--path"]:  # for msrun, which takes a script path
        print(os.path.abspath(__file__))
        return 0
    from ms_swiglu.checkpoint import open_checkpoint  # noqa: PLC0415
    from ms_swiglu.runner import read_input, run_layer  # noqa: PLC0415

    args = parser().parse_args(argv)
    ckpt = open_checkpoint(os.path.abspath(args.checkpoint))
    x = read_input(args.input, ckpt.config.hidden_size)
    run_layer(ckpt, args.layer, x, dtype=args.dtype, backend=args.backend,
              repeat=args.repeat, tp_size=args.tp_size, output=os.path.abspath(args.output) if args.output else None,
              force=args.force, quant=args.quantize, ep_size=args.ep_size, dispatch=args.dispatch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
