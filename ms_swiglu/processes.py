"""Processes: the package's Python subprocesses, isolated from the user's working directory and environment, and
whether a process still runs (for the leftovers of killed ones).

``python -m module`` puts the working directory first on ``sys.path``, so a ``glob.py`` where the user runs
``ms-swiglu`` would be imported by the child. The package's children run ``python -I`` (isolated mode: neither the
working directory nor the script's folder nor user site-packages on ``sys.path``, no PYTHON* variables).
"""
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile


def python(module, *args):
    """The command line that runs ``python -I -m module args`` with this interpreter."""
    return [sys.executable, "-I", "-m", module, *map(str, args)]


def run(cmd, timeout):
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)``, the child ended if the wait is
    cut short (a signal to the command, the timeout)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def safe_environment(env=None):
    """``env`` (default: this process's) for a Python the package does not start itself (msrun's workers): no
    potentially unsafe path prepended to ``sys.path`` (PYTHONSAFEPATH, Python 3.11+; older Pythons do not read
    it, and there the worker script's own folder, inside the package, is the first entry)."""
    return dict(os.environ if env is None else env, PYTHONSAFEPATH="1")


def alive(pid):
    """Whether process ``pid`` still runs (another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def scratch_cwd():
    """Run the block in a new folder under $TMPDIR (removed after it), so that the files MindSpore and AKG write
    into the working directory (akg_kernel_meta, dsa_transfrom.log, kernel_build_tmp.key) stay out of the user's.
    Every path the block uses must be absolute."""
    home, scratch = os.getcwd(), tempfile.mkdtemp(prefix="ms-swiglu-cwd-")
    os.chdir(scratch)
    try:
        yield
    finally:
        os.chdir(home)
        shutil.rmtree(scratch, ignore_errors=True)
