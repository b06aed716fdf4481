"""One tensor-parallel rank of ``ms-swiglu run --tp-size K``; started by msrun (see ms_swiglu.launch).

MS_SWIGLU_FAIL_RANK=r makes rank r fail after joining the group: fault injection for the launcher's tests.
"""
import os
import sys

from ms_swiglu import cli


def main():
    args = cli.build_parser().parse_args(["run", *sys.argv[1:]])
    config = cli.read_config(args.checkpoint)
    x = cli._read_input(args.input, config.hidden_size)
    if os.environ.get("MS_SWIGLU_FAIL_RANK") is not None:
        from ms_swiglu import parallel  # noqa: PLC0415

        rank = parallel.init(args.tp_size)
        if rank == int(os.environ["MS_SWIGLU_FAIL_RANK"]):
            raise RuntimeError(f"injected failure on rank {rank} (MS_SWIGLU_FAIL_RANK)")
        import time  # noqa: PLC0415

        time.sleep(600)  # the healthy rank waits, as a rank blocked in a collective would
    return cli.execute(args, config, x, os.path.abspath(args.output) if args.output else None)


if __name__ == "__main__":
    sys.exit(main())
