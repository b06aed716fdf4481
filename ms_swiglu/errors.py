"""The package's errors for bad input. Anything else raised is a bug, and the CLI shows it as one (exit 1, the
traceback kept in a log file)."""
import argparse


class InputError(ValueError):
    """Input that cannot be used, stated as what was expected and what was found (the CLI: exit 2, one line)."""


class InputTypeError(InputError, TypeError):
    """Input of the wrong type (a TypeError too)."""


class CheckpointError(InputError):
    """A checkpoint that is missing, malformed, or disagrees with its config.json."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are :class:`InputError` s (one line, exit 2 in the CLI), not a usage dump."""

    def error(self, message):
        raise InputError(f"{self.prog}: {message}")
