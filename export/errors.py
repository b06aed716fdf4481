"""The exporter's two errors: a request that cannot be exported (bad input, exit 2) and an export that does not
verify (a bug, exit 1). Nothing is left behind after either."""
from ms_swiglu.errors import InputError


class ExportError(InputError):
    """An export that cannot be made as asked (bad input); nothing is left behind."""


class VerificationError(RuntimeError):
    """An export that does not verify (a bug, not bad input); nothing is left behind."""
