"""A stand-in for ms_swiglu.launch.worker in the launcher's tests (it takes the same arguments): every rank
joins the group, then rank $TP_FAULT_RANK fails and the others wait, as ranks blocked in a collective would."""
import os
import sys
import time

from ms_swiglu import parallel


def main(argv):
    rank = parallel.init(int(argv[argv.index("--tp-size") + 1]))
    if rank == int(os.environ["TP_FAULT_RANK"]):
        raise RuntimeError(f"injected failure on rank {rank} (TP_FAULT_RANK)")
    time.sleep(600)


if __name__ == "__main__":
    main(sys.argv[1:])
