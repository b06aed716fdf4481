"""A one-line progress bar on stderr where it is a terminal (a log or a pipe gets none: an error there is one
line), which an error message ends first so that the two never share a line."""
import sys

_open = False  # a bar line is on the terminal without its newline


def progress(label, done, total, unit, width=30):
    """Draw the bar; it ends with a newline when done == total."""
    global _open
    if not sys.stderr.isatty():
        return
    filled = width * done // total if total else width
    sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {unit}")
    _open = done != total
    sys.stderr.write("" if _open else "\n")
    sys.stderr.flush()


def end_line():
    """End a bar that is still open (before an error line)."""
    global _open
    if _open:
        sys.stderr.write("\n")
        _open = False
