"""Errors that the command line reports as one line with exit status 2 (no traceback)."""


class UsageError(ValueError):
    """Bad input from the user: a bad option value, an unknown name, a missing file."""
