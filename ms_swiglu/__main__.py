"""The ``ms-swiglu`` command (also ``python -m ms_swiglu``): its signal handling is taken first, before any
import starts a thread (NumPy's BLAS starts one), then :func:`ms_swiglu.cli.main` runs."""
import sys


def main():
    from ms_swiglu import signals  # noqa: PLC0415 -- before NumPy or MindSpore is imported

    signals.install()
    try:
        with signals.deferred():  # an import cut half-way (NumPy's C extensions) may crash the exit
            from ms_swiglu import cli  # noqa: PLC0415
    except signals.Interrupted:
        pass  # cli.main reports the signal taken
    status = cli.main()
    signals.ignore()  # the status is decided and said: a signal during the interpreter's teardown changes nothing
    return status


if __name__ == "__main__":
    sys.exit(main())
