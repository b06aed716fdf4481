"""The package's error for bad input. Anything else raised is a bug, and the CLI shows it as one."""


class InputError(ValueError):
    """Input that cannot be used, stated as what was expected and what was found (the CLI: exit 2, one line)."""
