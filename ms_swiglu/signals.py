"""How the CLI ends on SIGINT, SIGTERM and SIGHUP: as a Python exception in the main thread, so that every
``finally`` and ``with`` runs its clean-up, and with exit status 128 + the signal's number.

The signals reach Python's own handlers, which raise :class:`Interrupted` in the main thread: at once in Python
code and in a blocking system call (interrupted, PEP 475), right after a MindSpore graph call. MindSpore replaces
the SIGINT handler at every graph call (``mindspore::SignalGuard``) with one that sends the process SIGTERM
(``kill(getpid(), SIGTERM)``); a small C handler in front of Python's SIGTERM one (``csrc/sigorigin.c``) notes
such a self-sent SIGTERM, which is then taken as the SIGINT it was. Only the first signal raises (a second one
does not cut the clean-up short), and :func:`deferred` holds them off for steps that must not stop half-way
(putting outputs in place).

A signal that arrives while the main thread is inside MindSpore's Python code is raised when that call returns to
its caller, never inside it: an exception inside MindSpore's import leaves its C++ half-initialised (its exit
handler then aborts the process), and one inside a graph's compilation (the C++ parser calling back into Python)
is logged by MindSpore as pages of traces and dumped as ``analyze_fail.ir``.

The library never installs this: only the ``ms-swiglu`` command does, for its own process.
"""
import contextlib
import ctypes
import glob
import os
import signal
import sys
import threading
import time

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PAUSE_VARIABLE = "MS_SWIGLU_SIGNAL_AT"  # tests: "point:SIGNAME" sends the process that signal at that point


class Interrupted(KeyboardInterrupt):
    """A signal that ends the command: ``status`` is 128 + its number (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def status(self):
        return 128 + self.signum


class _State:
    installed = False
    origin = None  # the C library of csrc/sigorigin.c
    received = None  # the first signal taken
    raised = False
    hold = 0
    armed = None  # the frame a signal taken inside MindSpore is raised in, once MindSpore returns to it


_state = _State()


def install():
    """Take SIGINT, SIGTERM and SIGHUP for this process (from its main thread)."""
    if _state.installed:
        return
    for signum in SIGNALS:
        signal.signal(signum, _handler)
    found = glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sigorigin*.so"))
    if found:  # without it (a build without the extension) Ctrl-C after a graph call reads as SIGTERM
        _state.origin = ctypes.CDLL(found[0])
        if _state.origin.ms_swiglu_sigorigin_install() != 0:
            raise OSError(ctypes.get_errno(), "sigaction(SIGTERM) failed")
    _state.installed = True


def received():
    """The first signal taken since :func:`install` (or :func:`reset`), or None."""
    return _state.received


def reset():
    """Forget a taken signal (a process that runs several commands, as the tests do)."""
    _disarm()
    _state.received, _state.raised = None, False


def settle():
    """From now on a signal is only noted (:func:`received`), never raised: the command is reporting its end."""
    _state.raised = True


def ignore():
    """Ignore the three signals from now on (the process is ending with its status decided). Python puts the
    default action back for its handled signals at its teardown, which a late signal would then end by force;
    ignored ones it leaves as they are."""
    _disarm()
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def _handler(signum, frame):  # noqa: ARG001
    if signum == signal.SIGTERM and _state.origin is not None and _state.origin.ms_swiglu_sigorigin_take():
        signum = signal.SIGINT  # MindSpore's SIGINT handler sent it
    if _state.received is None:
        _state.received = signum
    if _state.hold or _state.raised or _state.armed is not None:
        return
    caller = _mindspore_caller(frame)
    if caller is not None:
        _arm(caller)
        return
    _state.raised = True
    raise Interrupted(_state.received)


_IMPORT_MACHINERY = ("importlib._bootstrap", "importlib._bootstrap_external", "_frozen_importlib",
                     "_frozen_importlib_external")


def _mindspore_caller(frame):
    """The frame that called into MindSpore, when ``frame`` runs inside MindSpore's Python code (import
    machinery between them skipped); None otherwise."""
    package = sys.modules.get("mindspore")  # in sys.modules from the start of its import
    where = getattr(package, "__file__", None)
    if where is None:
        return None
    root = os.path.dirname(where) + os.sep
    outermost = None
    while frame is not None:
        if frame.f_code.co_filename.startswith(root):
            outermost = frame
        frame = frame.f_back
    caller = outermost and outermost.f_back
    while caller is not None and caller.f_globals.get("__name__") in _IMPORT_MACHINERY:
        caller = caller.f_back
    return caller


def _arm(caller):
    """Raise the taken signal in ``caller`` at its next bytecode, i.e. as soon as MindSpore returns to it."""
    def trace(frame, event, arg):  # noqa: ARG001
        _disarm()
        if not (_state.hold or _state.raised):
            _state.raised = True
            raise Interrupted(_state.received)

    _state.armed = (caller, sys.gettrace())
    caller.f_trace, caller.f_trace_opcodes = trace, True
    sys.settrace(_no_new_frames)  # per-frame tracing runs only while a global trace function is set


def _no_new_frames(frame, event, arg):  # noqa: ARG001
    return None


def _disarm():
    if _state.armed is not None:
        caller, earlier = _state.armed
        _state.armed = None
        caller.f_trace, caller.f_trace_opcodes = None, False
        sys.settrace(earlier)


@contextlib.contextmanager
def deferred():
    """Run the block to its end whatever signal arrives; a signal taken meanwhile is raised after it."""
    _state.hold += 1
    try:
        yield
    finally:
        _state.hold -= 1
    if not _state.hold and _state.received is not None and not _state.raised:
        _state.raised = True
        raise Interrupted(_state.received)


def pause_point(name):
    """A named moment of a command at which the tests send a signal: with ``MS_SWIGLU_SIGNAL_AT=name:SIGTERM``
    the main thread is sent SIGTERM here (as from another process: not by kill(2) from this one), as if it
    came from outside right then."""
    spec = os.environ.get(PAUSE_VARIABLE)
    if not spec or spec.rsplit(":", 1)[0] != name:
        return
    signal.pthread_kill(threading.main_thread().ident, getattr(signal, spec.rsplit(":", 1)[1]))
    for _ in range(500):  # the exception comes at one of these bytecodes (or at the end of a deferred block)
        if _state.received is not None and (_state.hold or _state.raised):
            return
        time.sleep(0.01)
