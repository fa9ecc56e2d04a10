"""The field machinery of every ppokit configuration (:class:`ppokit.TrainConfig`,
:class:`ppokit.llm.LLMConfig`): each field declares its help, bounds and allowed values
once, in its dataclass metadata (:func:`setting`), and this module derives from them what
both configurations need — typed parsing of ``--set KEY=VALUE`` text, the checks that name
the field, the help table, and the answer to an unknown key (did you mean, renamed and
deprecated names).

Metadata keys: ``help`` (one line, the ``--help`` text), ``bounds`` (``(low, high,
low_is_open)``: the field is an integer when both are ints, a finite number otherwise),
``choices`` (a tuple, or a :class:`~ppokit.core.registry.Registry` whose names are the
values), ``expected`` (how a field with its own rule is described in errors)."""

from __future__ import annotations

import dataclasses
import difflib
import json
import reprlib
import types
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, get_type_hints

from ppokit.cliutil import in_range
from ppokit.core.options import OPTION_TABLES
from ppokit.core.registry import IMPORT_HINT, Registry
from ppokit.errors import UsageError
from ppokit.plugins import names_checked

__all__ = ["setting", "Kind", "kind_of", "bounds_of", "choices_of", "brief", "fail",
           "range_text", "check_bounds", "check_choice", "check_fields", "parse_text",
           "resolve_key", "unknown_key_error", "parse_sets", "merge_values", "help_table",
           "default_of"]

Bounds = tuple[float, float, bool]


def setting(default: Any = dataclasses.MISSING, help: str = "", *,  # noqa: A002
            bounds: Bounds | None = None, choices: Any = None, expected: str | None = None,
            default_factory: Any = dataclasses.MISSING) -> Any:
    """A configuration field: its default and its metadata (module doc)."""
    meta: dict[str, Any] = {"help": help}
    for key, value in (("bounds", bounds), ("choices", choices), ("expected", expected)):
        if value is not None:
            meta[key] = value
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class Kind(NamedTuple):
    """A field's value type without ``None`` (int, float, bool, str, tuple, dict, ...) and
    whether ``None`` is allowed."""

    base: Any
    optional: bool


def kind_of(cls: type, name: str) -> Kind:
    t = get_type_hints(cls)[name]
    args = getattr(t, "__args__", ()) if isinstance(t, types.UnionType) else ()
    if args:
        rest = [a for a in args if a is not type(None)]
        return Kind(rest[0] if len(rest) == 1 else t, len(rest) < len(args))
    return Kind(getattr(t, "__origin__", None) or t, False)


def bounds_of(cls: type) -> dict[str, Bounds]:
    """``{field: (low, high, low_is_open)}`` of every bounded field of ``cls``."""
    return {f.name: f.metadata["bounds"] for f in dataclasses.fields(cls)
            if "bounds" in f.metadata}


def choices_of(cls: type) -> dict[str, Any]:
    """``{field: allowed values}`` of every field of ``cls`` with a closed set."""
    return {f.name: f.metadata["choices"] for f in dataclasses.fields(cls)
            if "choices" in f.metadata}


def default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


# ------------------------------------------------------------------ errors

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = 8
_repr.maxlong = 40


def brief(v: Any) -> str:
    """A short one-line repr of a user's value (long strings and lists are cut)."""
    return _repr.repr(v)


def fail(name: str, what: str, value: Any = None, *, show: bool = True):
    """Raise a :class:`UsageError` ``"name: what, got value"`` that records the field
    (``err.field``: a command names the flag that set it)."""
    err = UsageError(f"{name}: {what}, got {brief(value)}" if show else f"{name}: {what}")
    err.field = name
    raise err


# ------------------------------------------------------------------ checks

def _integer(bounds: Bounds) -> bool:
    lo, hi, _ = bounds
    return isinstance(lo, int) and isinstance(hi, int)


def range_text(bounds: Bounds, optional: bool = False) -> str:
    lo, hi, lo_open = bounds
    if _integer(bounds):
        text = f"an integer in [{lo}, {hi}]"
    else:
        text = f"a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
    return text + (" or none" if optional else "")


def check_bounds(name: str, value: Any, bounds: Bounds, optional: bool = False,
                 text: str | None = None) -> None:
    if value is None and optional:
        return
    lo, hi, lo_open = bounds
    if not in_range(value, _integer(bounds), lo, hi, lo_open):
        fail(name, "expected " + (text or range_text(bounds, optional)), value)


def check_choice(name: str, value: Any, options: Any, hint: str = "") -> None:
    """``value`` is one of ``options``; a registry's name also passes unchecked while a
    run's own parts are read (:func:`ppokit.plugins.names_checked`: no import needed)."""
    registry = isinstance(options, Registry)
    if registry and isinstance(value, str) and value and not names_checked():
        return
    if isinstance(value, str) and value in options:
        return
    if registry and not hint:
        hint = f" ({IMPORT_HINT})"
    fail(name, f"expected one of {', '.join(options)}{hint}", value)


_TYPE_TEXT = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def type_text(f: dataclasses.Field, kind: Kind) -> str:
    if "expected" in f.metadata:
        return f.metadata["expected"]
    text = _TYPE_TEXT.get(kind.base, "a value")
    return text + (" or none" if kind.optional else "")


def check_fields(obj: Any, skip: tuple[str, ...] = (), texts: Mapping[str, str] = {}) -> None:
    """Every field of the dataclass instance ``obj`` with generic rules (bounds, choices,
    true/false, a string), each error naming the field; ``skip``: fields with their own
    rules; ``texts``: a bounded field's own wording of its range."""
    for f in dataclasses.fields(obj):
        if f.name in skip:
            continue
        v, kind, meta = getattr(obj, f.name), kind_of(type(obj), f.name), f.metadata
        if v is None and kind.optional:
            continue
        if "bounds" in meta:
            check_bounds(f.name, v, meta["bounds"], kind.optional, texts.get(f.name))
        elif kind.base is bool and not isinstance(v, bool):
            fail(f.name, "expected true or false", v)
        elif kind.base is str and not isinstance(v, str):
            fail(f.name, "expected " + type_text(f, kind), v)
        if "choices" in meta:
            check_choice(f.name, v, meta["choices"],
                         " (memory is recurrent = lstm)" if f.name == "policy"
                         and v == "lstm" else "")


# ------------------------------------------------------------------ text

_NONE = ("none", "null", "off", "")


def parse_text(cls: type, name: str, text: str) -> Any:
    """``text`` (from ``--set`` or a flag) as a value of field ``name``'s type: booleans
    as true/false/yes/no/on/off/1/0, integers also as 1e5, ``none`` for an optional
    field, lists of integers as ``64,64`` or ``[64, 64]``, tables as JSON."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    kind = kind_of(cls, name)
    s = text.strip()
    if kind.optional and s.lower() in _NONE:
        return None
    try:
        if kind.base is bool:
            low = s.lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if kind.base is int:
            try:
                return int(s)
            except ValueError:
                v = float(s)  # 1e5
                if not v.is_integer():
                    raise
                return int(v)
        if kind.base is float:
            return float(s)
        if kind.base is dict:
            try:
                return json.loads(s)
            except RecursionError:
                raise ValueError from None
        if kind.base is tuple:
            return tuple(int(x) for x in s.strip("[]()").replace(" ", "").split(",") if x)
        return s
    except (ValueError, OverflowError):
        fail(name, "expected " + type_text(f, kind), text)


def resolve_key(key: Any, keys: list[str], where: str = "", *,
                aliases: Mapping[str, str] = {}, renamed: Mapping[str, str] = {},
                refused: Mapping[str, str] = {}, deprecated: Mapping[str, str] = {},
                log: Callable[[str], None] | None = None, deprecation_note: Mapping[str, str]
                = {}, refused_by: str = "another library") -> str:
    """The configuration key ``key`` stands for: itself; the key another library's name
    in ``renamed`` means (accepted as it is); a ``deprecated`` name (said through ``log``,
    returned as it is for the caller to rename). A name in ``refused`` is an error saying
    what to use instead; any other an error with the closest key (``aliases``: other
    libraries' names for a key) and the valid keys."""
    if isinstance(key, str):
        if key in keys:
            return key
        if key in renamed:
            return renamed[key]
        if key in refused:
            fail(key, f"{refused_by}'s name, with no one-to-one ppokit key: "
                 f"{refused[key]}", show=False)
        if key in deprecated:
            if log is not None:
                log(f"{where}: '{key}' is deprecated; use '{deprecated[key]}'"
                    + deprecation_note.get(key, ""))
            return key
    raise unknown_key_error(key, keys, where, aliases)


def unknown_key_error(key: Any, keys: list[str], where: str = "",
                      aliases: Mapping[str, str] = {}) -> UsageError:
    """The error for ``key``, which is none of ``keys``: the closest key (``aliases``:
    other libraries' names for a key) and the valid ones."""
    hint = _suggest(key, keys, aliases)
    msg = f"{where + ': ' if where else ''}unknown key {brief(key)}"
    if hint:
        msg += f"; did you mean {hint!r}?"
    return UsageError(msg + f" (valid keys: {', '.join(keys)})")


def _suggest(key: Any, keys: list[str], aliases: Mapping[str, str]) -> str | None:
    if not isinstance(key, str):
        return None
    k = key.strip().lower().replace("-", "_")
    if k in keys:
        return k
    if k in aliases:
        return aliases[k]
    close = difflib.get_close_matches(k, keys, n=1, cutoff=0.6)
    return close[0] if close else None


def parse_sets(items: list[str], parse: Callable[[str, str], tuple[str, Any]]
               ) -> dict[str, Any]:
    """``["KEY=VALUE", ...]`` as ``{key: value}``; ``parse(key, text)`` gives the key it
    stands for and the typed value. ``TABLE.NAME=VALUE`` sets one option of an option
    table (``loss_options.beta=0.3``; :data:`ppokit.core.options.OPTION_TABLES`), kept as
    text for the configuration to read as the option's declared type."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--set: expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        table, dot, name = k.strip().partition(".")
        if dot and table in OPTION_TABLES:
            if not name.isidentifier():
                raise UsageError(f"--set: expected {table}.NAME=VALUE with NAME an option's "
                                 f"name, got {item!r}")
            merge_values(out, {table: {name: v.strip()}})
            continue
        key, value = parse(k.strip(), v)
        out[key] = value
    return out


def merge_values(into: dict[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """``into`` updated with ``values`` (a later layer of a configuration: presets < file <
    ``--set`` < flags), an option table merged option by option."""
    for k, v in values.items():
        old = into.get(k)
        if k in OPTION_TABLES and isinstance(v, Mapping) and isinstance(old, Mapping):
            into[k] = {**old, **v}
        else:
            into[k] = v
    return into


def _show(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, tuple):
        return ",".join(map(str, v))
    if isinstance(v, dict):
        return "{}" if not v else str(v)
    return str(v)


def help_table(cls: type, title: str, shown: Callable[[dataclasses.Field], str] | None = None
               ) -> list[str]:
    """``title`` and a line per field: ``name = default  help [range]`` (``shown(f)``: the
    default as text where it is not the field's own value, e.g. "preset")."""
    lines = [title]
    for f in dataclasses.fields(cls):
        default = shown(f) if shown is not None else None
        if default is None:
            default = _show(default_of(f))
        bound = ""
        if "bounds" in f.metadata:
            bound = " " + range_text(f.metadata["bounds"]).removeprefix(
                "a finite number in ").removeprefix("an integer in ")
        lines.append(f"  {f.name + ' = ' + default:<34} {f.metadata.get('help', '')}{bound}")
    return lines
