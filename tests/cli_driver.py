"""Runs many ``ms-swiglu`` commands in one process, one after the other, so that one Python and MindSpore start-up
serves all of them, and prints one line per command: ``CASE {json}`` with its exit status, what it wrote to stdout
and stderr (file descriptors 1 and 2, so the output of MindSpore's C++ side counts too) and, for each watched
folder, its entries with their kind (f file, d folder, p FIFO, c character device, l symlink, ? other).

    python -I cli_driver.py < CASES.json    (a list of {"argv": [...], "cwd": folder or null, "watch": [folders]})

A command runs as the ``ms-swiglu`` entry point runs it (ms_swiglu.__main__: the signal handling first, then
ms_swiglu.cli.main); argparse's exit is its status, and an exception that escapes is printed with its traceback,
status 1, as Python does for a script. Used through conftest.cli_batch.
"""
import contextlib
import json
import os
import stat
import sys
import traceback

from ms_swiglu import signals

signals.install()  # before anything starts a thread, as the ms-swiglu command does
from ms_swiglu import cli  # noqa: E402

KINDS = ((stat.S_ISLNK, "l"), (stat.S_ISREG, "f"), (stat.S_ISDIR, "d"), (stat.S_ISFIFO, "p"), (stat.S_ISCHR, "c"))


def _kind(path):
    mode = os.lstat(path).st_mode
    return next((k for test, k in KINDS if test(mode)), "?")


def _listing(folder):
    if not os.path.isdir(folder):
        return None
    return {name: _kind(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}


def _run(argv):
    try:
        return cli.main(argv)
    except SystemExit as exc:  # argparse
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 -- as the interpreter reports an uncaught exception
        traceback.print_exc()
        return 1


def _captured(argv):
    """(status, stdout, stderr) of one command, its file descriptors 1 and 2 captured in memory files."""
    out, err = os.memfd_create("stdout"), os.memfd_create("stderr")
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(out, 1)
    os.dup2(err, 2)
    try:
        status = _run(argv)
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
    texts = []
    for fd in (out, err):
        os.lseek(fd, 0, os.SEEK_SET)
        with os.fdopen(fd, "rb") as f:
            texts.append(f.read().decode(errors="backslashreplace"))
    return status, *texts


def main():
    home = os.getcwd()
    for case in json.load(sys.stdin):
        os.chdir(case.get("cwd") or home)
        status, out, err = _captured(case["argv"])
        signals.reset()
        os.chdir(home)
        watched = {w: _listing(w) for w in case.get("watch", [])}
        print("CASE " + json.dumps({"status": status, "stdout": out, "stderr": err, "watched": watched}), flush=True)


if __name__ == "__main__":
    main()
