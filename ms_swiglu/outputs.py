"""Files that appear whole or not at all, and never replace an existing file without ``force``.

:class:`OutputSet` writes each file of a set to a temporary file beside it (``.<name>.<pid>.<id>.tmp``), then puts
them in place: without ``force`` by ``os.link``, which fails when the name exists, so that of two writers of one
target exactly one wins; with ``force`` by ``os.replace``, after keeping the file it replaces as a hard link
(``.old``). A failure it can catch (an error, Ctrl-C) removes its temporary files and the files it had put in
place, and puts back what they replaced; the temporary files of killed writers are removed by the next writer of
the same target. What a kill leaves is said by each caller (the README's "What a crash leaves").
"""
import contextlib
import errno
import os
import uuid

from ms_swiglu import paths, signals
from ms_swiglu.errors import InputError
from ms_swiglu.processes import alive


def check_writable(path, force):
    """``path`` absolute, after checking that its folder exists and is writable and that it is new (or ``force``
    and a regular file: nothing else, not a device, a FIFO or a symlink, is ever replaced)."""
    if not path:
        raise InputError("output: expected a file name, got an empty string")
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise InputError(f"output: expected an existing folder for {path}, found none at {folder}")
    probe = os.path.join(folder, f".ms_swiglu-probe.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:  # a real write: access() says yes to root even where nothing can be written
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.remove(probe)
    except OSError as exc:
        raise InputError(f"output: expected a writable folder, got {folder} ({exc.strerror})") from None
    if os.path.isdir(path):
        raise InputError(f"output: expected a file name, got the folder {path}")
    _check_replaceable(path)
    if os.path.lexists(path) and not force:
        raise InputError(f"output: expected a new file, got existing {path} (use --force to replace it)")
    return path


def _check_replaceable(path):
    found = paths.kind(path, follow=False)
    if found not in (None, "a regular file"):
        raise InputError(f"output: expected a new name or a regular file, got {found} at {path} (only regular "
                         f"files are replaced)")


def _disk_full(exc, path):
    """An OSError of a write as the full-disk error it is (NumPy's own says only how much it wrote)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return OSError(exc.errno, os.strerror(exc.errno), path)
    with contextlib.suppress(OSError):
        vfs = os.statvfs(os.path.dirname(path))
        if vfs.f_bavail * vfs.f_frsize < (1 << 20):
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    return exc


def prune_temporaries(path):
    """Remove the temporary files that killed writers of ``path`` left beside it."""
    folder, name = os.path.split(os.path.abspath(path))
    prefix = f".{name}."
    for entry in os.listdir(folder):
        if not (entry.startswith(prefix) and entry.endswith((".tmp", ".old"))):
            continue
        pid = entry[len(prefix):].split(".")[0]
        if pid.isdigit() and not alive(int(pid)):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, entry))


class OutputSet:
    """The files ``paths`` (absolute), written by :meth:`write` and put in place together by :meth:`commit`; use
    it as a context manager so that a failure before or during the commit leaves none of them."""

    def __init__(self, paths, force=False):
        self.paths = [check_writable(p, force) for p in paths]
        self.force, self.token = force, uuid.uuid4().hex[:12]
        self.temps, self.placed, self.kept = {}, [], {}
        for p in self.paths:
            prune_temporaries(p)

    def temporary(self, path):
        """The temporary file that stands for ``path`` until the commit."""
        folder, name = os.path.split(path)
        return self.temps.setdefault(path, os.path.join(folder, f".{name}.{os.getpid()}.{self.token}.tmp"))

    def write(self, path, writer):
        """``writer(temporary path)`` writes the content of ``path``."""
        try:
            writer(self.temporary(path))
        except OSError as exc:
            raise _disk_full(exc, path) from None

    def commit(self):
        """Put every file in place; without ``force`` an existing name (another writer's) fails the whole set.
        No signal stops it half-way: a set is put in place whole, or (after an error) not at all."""
        with signals.deferred():
            self._commit()

    def _commit(self):
        missing = [p for p in self.paths if not os.path.exists(self.temporary(p))]
        if missing:
            raise RuntimeError(f"ms_swiglu: output set committed without {missing}")  # a bug of the caller
        for path in self.paths:
            tmp = self.temps[path]
            signals.pause_point("commit")
            if self.force and os.path.lexists(path):
                _check_replaceable(path)  # something else may have taken the name since the check
                kept = tmp[:-len(".tmp")] + ".old"
                os.link(path, kept)
                self.kept[path] = kept
                os.replace(tmp, path)
            else:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise InputError(f"output: expected a new file, got existing {path} (written meanwhile by "
                                     f"another process; use --force to replace it)") from None
                os.remove(tmp)
            self.placed.append(path)
        self.placed, kept, self.kept = [], self.kept, {}  # committed: from here on the new set stays
        for old in kept.values():
            os.remove(old)

    def abort(self):
        with signals.deferred():
            self._abort()

    def _abort(self):
        for path in reversed(self.placed):
            with contextlib.suppress(OSError):
                if path in self.kept:
                    os.replace(self.kept.pop(path), path)  # what it replaced comes back
                else:
                    os.remove(path)
        for tmp in [*self.temps.values(), *self.kept.values()]:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        self.placed, self.kept = [], {}

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is not None:
            self.abort()
        return False


def write_file(path, writer, force=False):
    """``writer(temporary path)`` writes ``path`` as one whole new file (or, with ``force``, a replaced one)."""
    with OutputSet([path], force) as out:
        out.write(out.paths[0], writer)
        out.commit()
