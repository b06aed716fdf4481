"""A stand-in for export/parallel.py's rank script in the export tests (it takes the same arguments): rank 0
writes part of its kit into the set's staging folder, then rank 1 fails, as a rank whose export breaks would."""
import argparse
import os
import sys
import time

from ms_swiglu import parallel


def main(argv):
    p = argparse.ArgumentParser()
    for name in ("--request", "--stage", "--ep-size", "--dispatch", "--golden"):
        p.add_argument(name)
    args = p.parse_args(argv)
    rank = parallel.init(int(args.ep_size))
    if rank == 0:
        os.makedirs(os.path.join(args.stage, "rank0"))
        with open(os.path.join(args.stage, "rank0", "part.mindir"), "wb") as f:
            f.write(b"partial")
        time.sleep(600)  # as a rank blocked in a collective
    time.sleep(2)
    raise RuntimeError(f"injected failure on rank {rank}")


if __name__ == "__main__":
    main(sys.argv[1:])
