"""Runs many ``ms-swiglu`` commands in one process, each sent a signal at a named pause point
(``ms_swiglu.signals.pause_point``), and prints one JSON line per case: its exit status, stderr's last line, and
what the watched folders hold afterwards (every file's sha256, hidden entries included, and the text of a
``manifest.json``). One MindSpore import serves every case, and
after the first graph call MindSpore's own SIGINT handler is in place, as in a real interrupted command.

    python signal_driver.py CASES.json     (a list of {"argv": [...], "at": "point:SIGNAME", "watch": [folders]})
"""
import contextlib
import hashlib
import io
import json
import os
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


def main(path):
    with open(path) as f:
        cases = json.load(f)
    for case in cases:
        os.environ[signals.PAUSE_VARIABLE] = case["at"]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            status = cli.main(case["argv"])
        signals.reset()
        watched = {w: _contents(w) for w in case["watch"]}
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        print(json.dumps({"status": status, "stderr": lines, "watched": watched}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
