"""What a path is, for the checks that come before a file is opened: an input must be a regular file (a FIFO
would block ``open`` for ever), and an output may replace only a regular file."""
import errno
import os
import stat

from ms_swiglu.errors import InputError

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind(path, follow=True):
    """``"a regular file"``, ``"a folder"``, ``"a FIFO"``, ..., ``"a symlink loop"``, ``"a broken symlink"``,
    or None where nothing is; ``follow=False`` names a symlink itself ``"a symlink"``."""
    try:
        mode = (os.stat if follow else os.lstat)(path).st_mode
    except FileNotFoundError:
        return "a broken symlink" if os.path.islink(path) else None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop"
        raise InputError(f"{path}: expected a readable path, got {exc.strerror}") from None
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def input_file(path, what):
    """``path`` if it is a regular file (through symlinks); else InputError naming ``what``, the path and what
    is there. A missing file is left to the caller's own message (it is often a choice between names)."""
    found = kind(path)
    if found not in (None, "a regular file"):
        raise InputError(f"{what}: expected a regular file, got {found} at {path}")
    return path
