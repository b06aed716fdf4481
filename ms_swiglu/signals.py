"""How the CLI ends on SIGINT, SIGTERM and SIGHUP: as a Python exception in the main thread, so that every
``finally`` and ``with`` runs its clean-up, and with exit status 128 + the signal's number.

The signals reach Python's own handlers, which raise :class:`Interrupted` in the main thread: at once in Python
code and in a blocking system call (interrupted, PEP 475), right after a MindSpore graph call. MindSpore replaces
the SIGINT handler at every graph call (``mindspore::SignalGuard``) with one that sends the process SIGTERM
(``kill(getpid(), SIGTERM)``); a small C handler in front of Python's SIGTERM one (``csrc/sigorigin.c``) notes
such a self-sent SIGTERM, which is then taken as the SIGINT it was. Only the first signal raises (a second one
does not cut the clean-up short), and :func:`deferred` holds them off for steps that must not stop half-way
(putting outputs in place).

The library never installs this: only the ``ms-swiglu`` command does, for its own process.
"""
import contextlib
import ctypes
import glob
import os
import signal
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
    _state.received, _state.raised = None, False


def settle():
    """From now on a signal is only noted (:func:`received`), never raised: the command is reporting its end."""
    _state.raised = True


def _handler(signum, frame):  # noqa: ARG001
    if signum == signal.SIGTERM and _state.origin is not None and _state.origin.ms_swiglu_sigorigin_take():
        signum = signal.SIGINT  # MindSpore's SIGINT handler sent it
    if _state.received is None:
        _state.received = signum
    if _state.hold or _state.raised:
        return
    _state.raised = True
    raise Interrupted(_state.received)


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
