"""Outputs that appear whole or not at all, and never replace an existing one without ``force``.

One mechanism for every command. A set stages its new content under hidden names that carry the writer's pid
(``<prefix><pid>.<id>.tmp``), then :meth:`OutputSet.commit` puts every entry in place, no signal stopping it
half-way: a new name by ``os.link`` (which fails when the name exists, so that of two writers of one target
exactly one wins), a replaced regular file (``force`` only) by ``os.replace`` after it is kept as a hard link
(``.old``). A failure it can catch (an error, Ctrl-C) removes what it put in place and puts back what that
replaced. What killed writers leave is removed by the next writer of the same target (:func:`sweep`); what a
kill leaves is said by each caller (docs/cli.md, "what a crash leaves").

:class:`OutputSet` is a set of files, each staged beside its name (``.<name>.<pid>.<id>.tmp``);
:class:`FolderSet` is a set of entries of one folder (files and subfolders, e.g. an export's model file, kit
and manifest), staged in one hidden folder inside it, locked against a second set for the same folder, and
vouched for by a manifest that is removed first and put in place last.
"""
import contextlib
import errno
import fcntl
import json
import os
import shutil
import uuid

from ms_swiglu import paths, signals
from ms_swiglu.errors import InputError
from ms_swiglu.processes import alive


def _writable_folder(folder, label, what):
    """Refuse a missing folder (``what`` names it) or one nothing can be written to."""
    if not os.path.isdir(folder):
        raise InputError(f"{label}: expected an existing {what}, found none at {folder}")
    probe = os.path.join(folder, f".ms_swiglu-probe.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:  # a real write: access() says yes to root even where nothing can be written
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.remove(probe)
    except OSError as exc:
        raise InputError(f"{label}: expected a writable folder, got {folder} ({exc.strerror})") from None


def check_writable(path, force):
    """``path`` absolute, after checking that its folder exists and is writable and that it is new (or ``force``
    and a regular file: nothing else, not a device, a FIFO or a symlink, is ever replaced)."""
    if not path:
        raise InputError("output: expected a file name, got an empty string")
    path = os.path.abspath(path)
    _writable_folder(os.path.dirname(path), "output", f"folder for {path}")
    if os.path.isdir(path):
        raise InputError(f"output: expected a file name, got the folder {path}")
    _check_replaceable(path)
    if os.path.lexists(path) and not force:
        raise InputError(f"output: expected a new file, got existing {path} (use --force to replace it)")
    return path


def check_folder(folder, label):
    """An output folder's name: a folder or a new name, not a file, and not a symbolic link (a set would land
    elsewhere than the name says, and with --force replace there); its parents may be links."""
    folder = os.path.abspath(folder)
    if os.path.islink(folder):
        raise InputError(f"{label}: expected a folder that is not a symbolic link, got {folder} -> "
                         f"{os.path.realpath(folder)} (name the target itself to write there)")
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise InputError(f"{label}: expected a folder, got a file {folder}")
    return folder


def _check_replaceable(path):
    found = paths.kind(path, follow=False)
    if found not in (None, "a regular file"):
        raise InputError(f"output: expected a new name or a regular file, got {found} at {path} (only regular "
                         f"files are replaced)")


def disk_full(exc, path):
    """An OSError of a write as the full-disk error it is (NumPy's own says only how much it wrote)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return OSError(exc.errno, os.strerror(exc.errno), path)
    with contextlib.suppress(OSError):
        vfs = os.statvfs(os.path.dirname(path))
        if vfs.f_bavail * vfs.f_frsize < (1 << 20):
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    return exc


def _remove(path):
    """Remove a file, a symlink or a whole folder (never what a symlink points to); gone already is fine."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def sweep(folder, prefix):
    """Remove the leftovers of killed writers from ``folder``: the entries ``<prefix><pid>.<id>.tmp`` and
    ``.old`` (files or folders) whose process is gone. A running writer's are kept."""
    for entry in os.listdir(folder):
        if not (entry.startswith(prefix) and entry.endswith((".tmp", ".old"))):
            continue
        pid = entry[len(prefix):].split(".")[0]
        if pid.isdigit() and not alive(int(pid)):
            with contextlib.suppress(OSError):
                _remove(os.path.join(folder, entry))


class OutputSet:
    """The files ``paths`` (absolute), written by :meth:`write` and put in place together by :meth:`commit`; use
    it as a context manager so that a failure before or during the commit leaves none of them."""

    label = "output"  # what errors name the target by
    marker = None  # the entry that vouches for the whole set: removed first, put in place last (FolderSet)
    subfolders = frozenset()  # entries that are folders (FolderSet); every other entry is a regular file

    def __init__(self, paths, force=False):
        self._start(force)
        self.paths = [check_writable(p, force) for p in paths]
        for p in self.paths:
            folder, name = os.path.split(p)
            sweep(folder, f".{name}.")

    def _start(self, force):
        self.force, self.token = force, uuid.uuid4().hex[:12]
        self.temps, self.placed, self.kept, self.earlier = {}, [], {}, []

    def _scratch(self, folder, prefix, kind):
        """The hidden name in ``folder`` where this writer stages (``tmp``) or keeps (``old``) an entry."""
        return os.path.join(folder, f"{prefix}{os.getpid()}.{self.token}.{kind}")

    def _staged(self, path, kind):
        folder, name = os.path.split(path)
        return self._scratch(folder, f".{name}.", kind)

    def _scratches(self):
        """Every hidden name of this writer, for the clean-up."""
        return {self._staged(p, kind) for p in self.paths for kind in ("tmp", "old")}

    def _check_kind(self, path):
        _check_replaceable(path)

    def temporary(self, path):
        """The temporary file that stands for ``path`` until the commit."""
        return self.temps.setdefault(path, self._staged(path, "tmp"))

    def write(self, path, writer):
        """``writer(temporary path)`` writes the content of ``path``."""
        try:
            writer(self.temporary(path))
        except OSError as exc:
            raise disk_full(exc, path) from None

    def commit(self):
        """Put every entry in place; without ``force`` an existing name (another writer's) fails the whole set.
        No signal stops it half-way: a set is put in place whole, or (after an error) not at all."""
        with signals.deferred():
            self._commit()

    def _commit(self):
        missing = [p for p in self.paths if not os.path.lexists(self.temporary(p))]
        if missing:
            raise RuntimeError(f"ms_swiglu: output set committed without {missing}")  # a bug of the caller
        if self.force:  # the earlier marker first: from then on the folder no longer looks like a whole set
            for path in [self.marker, *self.earlier]:
                if path and os.path.lexists(path):
                    self._keep(path, stays=False)
        for path in sorted(self.paths, key=lambda p: p == self.marker):  # the new marker comes last
            self._place(path)
        self.placed, self.kept = [], {}  # committed: from here on the new set stays
        for scratch in self._scratches():
            _remove(scratch)

    def _place(self, path):
        signals.pause_point("commit")
        tmp = self.temps[path]
        if self.force and os.path.lexists(path):
            self._keep(path, stays=path not in self.subfolders)
            os.replace(tmp, path)
        else:
            try:
                if path not in self.subfolders:
                    os.link(tmp, path)
                elif os.path.lexists(path):  # a folder cannot be linked; the lock keeps other sets out
                    raise FileExistsError(path)
                else:
                    os.rename(tmp, path)
            except FileExistsError:
                what = "folder" if path in self.subfolders else "file"
                raise InputError(f"{self.label}: expected a new {what}, got existing {path} "
                                 f"(written meanwhile by another process; use --force to replace it)") from None
            _remove(tmp)
        self.placed.append(path)

    def _keep(self, path, stays):
        """Set what ``path`` holds aside until the commit ends; a regular file that ``stays`` (it is about to be
        replaced) is hard-linked, so that its name holds the earlier or the new content at every moment."""
        self._check_kind(path)  # something else may have taken the name since the check
        kept = self._staged(path, "old")
        os.makedirs(os.path.dirname(kept), exist_ok=True)
        (os.link if stays else os.rename)(path, kept)
        self.kept[path] = kept

    def abort(self):
        with signals.deferred():
            self._abort()

    def _abort(self):
        for path in reversed(self.placed):
            if path not in self.kept or path in self.subfolders:
                with contextlib.suppress(OSError):
                    _remove(path)
        for path, kept in self.kept.items():
            with contextlib.suppress(OSError):
                os.replace(kept, path)  # what it replaced comes back
        for scratch in self._scratches():
            with contextlib.suppress(OSError):
                _remove(scratch)
        self.placed, self.kept = [], {}

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        self.abort()  # no commit (an error, or none called): nothing of the set stays; after one: no-op
        return False


class FolderSet(OutputSet):
    """The entries ``names`` of the folder ``folder`` (created if missing; a name that ends in ``/`` is a
    subfolder), built in the hidden folder :attr:`stage` inside it and put in place together by :meth:`commit`.

    A lock on the folder (``.ms_swiglu-<noun>-lock``) makes a second set for it refuse at once instead of racing.
    ``manifest``, one of ``names``, lists the set's files (a JSON object whose ``files`` keys are paths relative
    to the folder): with ``force`` what an earlier manifest lists goes too, and nothing else of the folder is
    touched. ``label`` and ``noun`` name the folder and the set in errors (``--output-dir``, ``export``)."""

    def __init__(self, folder, names, force=False, *, label, noun, manifest=None):
        self._start(force)
        self.label, self.noun, self.prefix = label, noun, f".ms_swiglu-{noun}-"
        self.folder = os.path.abspath(folder)
        self.paths = [os.path.join(self.folder, n.rstrip("/")) for n in names]
        self.subfolders = {os.path.join(self.folder, n.rstrip("/")) for n in names if n.endswith("/")}
        self.marker = manifest and os.path.join(self.folder, manifest)
        check_folder(self.folder, label)
        parent = self.folder if os.path.isdir(self.folder) else os.path.dirname(self.folder)
        _writable_folder(parent, label, "parent folder")
        self._lock()
        try:
            self._check()
            sweep(self.folder, self.prefix)
            os.mkdir(self.stage)
        except BaseException:
            self._unlock()
            raise

    @property
    def stage(self):
        """The folder the entries are written into, under their own names, until the commit."""
        return self._scratch(self.folder, self.prefix, "tmp")

    def _staged(self, path, kind):
        return os.path.join(self._scratch(self.folder, self.prefix, kind), os.path.basename(path))

    def _scratches(self):
        return {self._scratch(self.folder, self.prefix, kind) for kind in ("tmp", "old")}

    def _check_kind(self, path):
        """An entry's name is free or holds what an earlier set put there (a regular file, or a folder)."""
        want = "a folder" if path in self.subfolders else "a regular file"
        found = paths.kind(path, follow=False)
        if found not in (None, want):
            raise InputError(f"{self.label}: expected {path} to be an earlier {self.noun}'s {want[2:]}, got "
                             f"{found}; move it away")

    def _check(self):
        """Under the lock: the entries' names, and with ``force`` the earlier manifest's, hold nothing else."""
        for path in self.paths:
            self._check_kind(path)
        existing = [os.path.basename(p) for p in self.paths if os.path.lexists(p)]
        if existing and not self.force:
            raise InputError(f"{self.label}: expected no earlier {self.noun} in {self.folder}, found "
                             f"{', '.join(existing)} (use --force to replace them)")
        if self.force and self.marker:
            self.earlier = self._listed()
            for path in self.earlier:
                self._check_kind(path)

    def _listed(self):
        """The top-level entries an earlier manifest lists, besides this set's own (one with files under it
        is a folder); none when there is no readable manifest."""
        try:
            with open(self.marker) as f:
                files = json.load(f)["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return []
        listed = []
        for name in files if isinstance(files, dict) else ():
            top, sep, _ = str(name).partition("/")
            path = os.path.join(self.folder, top)
            if top not in ("", ".", "..") and path not in self.paths:
                if sep:
                    self.subfolders.add(path)
                if path not in listed:
                    listed.append(path)
        return listed

    def _lock(self):
        """Take the folder's lock (creating the folder if missing), or refuse: another set holds it."""
        self.created = not os.path.isdir(self.folder)
        os.makedirs(self.folder, exist_ok=True)
        self.lock = os.path.join(self.folder, f"{self.prefix}lock")
        fd = os.open(self.lock, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InputError(f"{self.label}: expected no other {self.noun} writing to {self.folder}, found one "
                             f"(its lock {self.lock} is held)") from None
        try:
            ours = os.fstat(fd).st_ino == os.stat(self.lock).st_ino
        except FileNotFoundError:
            ours = False
        if not ours:  # its holder removed it as we opened it: that set is ending, a third may be starting
            os.close(fd)
            raise InputError(f"{self.label}: expected no other {self.noun} writing to {self.folder}, found one "
                             f"finishing")
        self.lock_fd = fd

    def _unlock(self):
        """Release the lock; a folder the set created goes again if it stayed empty."""
        with contextlib.suppress(OSError):
            os.remove(self.lock)  # before closing: a writer that opened it meanwhile sees it gone
        os.close(self.lock_fd)
        if self.created:
            with contextlib.suppress(OSError):
                os.rmdir(self.folder)  # fails when anything is in it

    def __exit__(self, kind, exc, tb):
        try:
            return super().__exit__(kind, exc, tb)
        finally:
            self._unlock()


def write_file(path, writer, force=False):
    """``writer(temporary path)`` writes ``path`` as one whole new file (or, with ``force``, a replaced one)."""
    with OutputSet([path], force) as out:
        out.write(out.paths[0], writer)
        out.commit()
