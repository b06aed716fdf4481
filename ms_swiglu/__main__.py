"""The ``ms-swiglu`` command (also ``python -m ms_swiglu``): its signal handling is taken first, before any
import starts a thread (NumPy's BLAS starts one), then :func:`ms_swiglu.cli.main` runs."""
import sys


def main():
    from ms_swiglu import signals  # noqa: PLC0415 -- before NumPy or MindSpore is imported

    signals.install()
    from ms_swiglu.cli import main as cli_main  # noqa: PLC0415

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
