"""Small pieces both command lines (``ppokit train`` and ``ppokit llm``) share."""

from __future__ import annotations

import argparse

from ppokit.errors import UsageError

__all__ = ["int_arg", "read_toml"]


def int_arg(text: str) -> int:
    """argparse type: an integer, written plainly or as ``1e5``."""
    try:
        v = float(text)
        if not v.is_integer():
            raise ValueError
        return int(v)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def load_toml(path: str, flag: str = "--config") -> dict:
    """A TOML file's whole content; every way it can be unreadable is a one-line
    :class:`UsageError` naming ``flag`` and the file."""
    import tomllib

    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise UsageError(f"{flag}: no such file {path!r}") from None
    except IsADirectoryError:
        raise UsageError(f"{flag}: {path!r} is a directory, expected a TOML file") from None
    except OSError as exc:
        raise UsageError(f"{flag}: cannot read {path!r} ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{flag}: {path!r} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{flag}: {path}: {exc}") from None


def read_toml(path: str, table: str) -> dict:
    """The values of a TOML file: its ``[table]`` when it has one, else the top level.
    Every way the file can be unreadable is a :class:`UsageError` naming ``--config``."""
    data = load_toml(path, "--config")
    section = data.get(table, data)
    if not isinstance(section, dict):
        raise UsageError(f"--config: {path}: {table!r} must be a table, got "
                         f"{type(section).__name__}")
    return dict(section)


def is_finite_number(v) -> bool:
    """A real int or float (not a bool) that is finite (a huge int counts as not)."""
    import math

    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int too large for a float
        return False


def in_range(v, integer: bool, lo: float, hi: float, lo_open: bool = False) -> bool:
    """Whether ``v`` is an int (``integer``) in ``[lo, hi]``, or a finite number in
    ``[lo, hi]`` (``(lo, hi]`` when ``lo_open``): the check both configurations use."""
    if integer:
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
    return is_finite_number(v) and (lo < v if lo_open else lo <= v) and v <= hi
