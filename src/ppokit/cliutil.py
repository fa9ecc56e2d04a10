"""Small pieces both command lines (``ppokit train`` and ``ppokit llm``) share."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from typing import Any

from ppokit.errors import UsageError

__all__ = ["int_arg", "read_toml", "load_toml", "to_toml", "log_every"]


def int_arg(text: str) -> int:
    """argparse type: an integer, written plainly or as ``1e5``."""
    try:
        return int(text)  # exact, however large (a range check names the flag)
    except ValueError:
        pass
    try:
        v = float(text)
        if not v.is_integer():
            raise ValueError
        return int(v)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def load_toml(path: str, flag: str = "--config") -> dict:
    """A TOML file's whole content; every way it can be unreadable is a one-line
    :class:`UsageError` naming ``flag`` and the file. The file is read with the rules of
    :func:`ppokit.io.atomic.read_named_file` (a regular file, at most 16 MiB: a FIFO or a
    device is refused, never read) and its tables and lists may nest at most
    :data:`ppokit.io.atomic.MAX_NESTING` deep."""
    import tomllib

    from ppokit.io.atomic import MAX_NESTING, MAX_SMALL_FILE, check_nesting, read_named_file

    data = read_named_file(path, flag, MAX_SMALL_FILE, "TOML file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{flag}: {path!r} is not UTF-8 text") from None
    try:
        doc = tomllib.loads(text)
    except RecursionError:
        raise UsageError(f"{flag}: {path}: lists and tables nested more than {MAX_NESTING} "
                         "deep") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{flag}: {path}: {exc}") from None
    check_nesting(doc, f"{flag}: {path}")
    return doc


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


def _toml_value(v: Any) -> str:
    if v is None:
        return '"none"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def to_toml(values: dict[str, Any], header: str = "") -> str:
    """``values`` as TOML text (``None`` as ``"none"``, which every optional key reads
    back as None), each line of ``header`` a comment above them."""
    lines = [f"# {h}" for h in header.splitlines()]
    lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def parse_env_kwargs(text: str | None, flag: str = "--env-kwargs") -> dict | None:
    """``--env-kwargs``: a JSON object (``None`` when not given)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise UsageError(f"{flag}: expected a JSON object such as '{{\"size\": 8}}', "
                         f"got {text[:60]!r}")
    return value


def check_callbacks(callbacks: Any, shape: str = "(metrics, agent) -> bool | None"
                    ) -> tuple[Callable, ...]:
    """``callbacks`` as a tuple of functions (one function alone is allowed); anything else
    is a :class:`UsageError` naming the argument and the expected ``shape``."""
    if callable(callbacks):
        callbacks = (callbacks,)
    if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Iterable):
        raise UsageError(f"callbacks: expected a sequence of functions {shape}, got "
                         f"{type(callbacks).__name__}")
    out = tuple(callbacks)
    for cb in out:
        if not callable(cb):
            raise UsageError(f"callbacks: expected functions, got {type(cb).__name__}")
    return out


LOG_EVERY_S = 30.0


def log_every() -> float:
    """Seconds between two plain progress lines off a terminal (both trainers):
    ``PPOKIT_LOG_EVERY`` when it is a number > 0, else 30."""
    import math
    import os

    try:
        v = float(os.environ.get("PPOKIT_LOG_EVERY", ""))
    except ValueError:
        return LOG_EVERY_S
    return v if 0 < v and math.isfinite(v) else LOG_EVERY_S
