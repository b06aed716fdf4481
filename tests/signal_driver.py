"""Runs many ``ms-swiglu`` commands in one process, each sent a signal at a named pause point
(``ms_swiglu.signals.pause_point``), and prints one JSON line per case: its exit status, stderr's last line, and
what the watched folders hold afterwards (every file's sha256, hidden entries included, and the text of a
``manifest.json``). One MindSpore import serves every case, and
after the first graph call MindSpore's own SIGINT handler is in place, as in a real interrupted command.

The point ``compile`` is the first call from MindSpore's graph compiler into its Python parser: the signal is
then sent by another process (``kill``) to this one (``"by": "pid"``) or to its process group (``"group"``).

    python signal_driver.py CASES.json     (a list of {"argv": [...], "at": "point:SIGNAME", "watch": [folders],
                                            "by": "pid" | "group" (for compile)})
"""
import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys

from ms_swiglu import signals

signals.install()  # before anything starts a thread, as the ms-swiglu command does
from ms_swiglu import cli  # noqa: E402


def _contents(folder):
    """{relative path: sha256 (a manifest.json: its text)} of every file under ``folder``; a folder: None."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if name == "manifest.json":
                with open(path) as f:
                    found[rel] = f.read()
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    found[rel] = hashlib.sha256(f.read()).hexdigest()
            else:
                found[rel] = None
    return found


PARSER = os.sep + os.path.join("mindspore", "graph", "_parse", "parser.py")


def _at_compile(signame, by):
    """A profile function that, at the first call into MindSpore's parser, has ``kill`` send ``signame``."""
    target = str(os.getpid()) if by == "pid" else f"-{os.getpgid(0)}"

    def hook(frame, event, arg):  # noqa: ARG001
        if event == "call" and frame.f_code.co_filename.endswith(PARSER):
            sys.setprofile(None)
            subprocess.run(["kill", "-s", signame.removeprefix("SIG"), "--", target], check=True,
                           start_new_session=True)  # not in the group it signals
    return hook


def main(path):
    with open(path) as f:
        cases = json.load(f)
    for case in cases:
        point, _, signame = case["at"].rpartition(":")
        os.environ[signals.PAUSE_VARIABLE] = case["at"] if point != "compile" else ""
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if point == "compile":
                sys.setprofile(_at_compile(signame, case.get("by", "pid")))
            status = cli.main(case["argv"])
            sys.setprofile(None)
        signals.reset()
        watched = {w: _contents(w) for w in case["watch"]}
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        print(json.dumps({"status": status, "stderr": lines, "watched": watched}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
