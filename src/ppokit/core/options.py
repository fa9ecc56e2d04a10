"""The options of a registered part: hyperparameters a policy loss or an advantage estimator
declares with its registration (``options={"beta": 0.1}``), set by the configuration's
``loss_options`` / ``advantage_options`` tables and handed to the part as a read-only
mapping (``spec.options`` of the update's :class:`ppokit.engine.UpdateSpec`,
``AdvantageSpec.options``).

An option's type is its default's: ``bool``, ``int``, ``float`` or ``str``. A value of the
configuration is held to it — an integer is a number for a ``float`` option, a text (what
``--set loss_options.beta=0.3`` gives) is read as the type — and anything else, or an
option the selected part does not declare, is an error naming it (``loss_options.beta``)
with the declared options listed."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from ppokit.errors import UsageError

__all__ = ["Options", "EMPTY", "OPTION_TABLES", "declare", "resolve", "typed"]

# the configuration's option tables: field -> (the field naming the part, the part's kind)
OPTION_TABLES = {"loss_options": ("policy_loss", "policy loss"),
                 "advantage_options": ("advantage_estimator", "advantage estimator")}
_TYPES = (bool, int, float, str)
_TYPE_TEXT = {bool: "true or false", int: "an integer", float: "a finite number",
              str: "a string"}


class Options(Mapping):
    """A read-only, hashable, picklable ``{name: value}`` of scalars."""

    __slots__ = ("_d",)

    def __init__(self, values: Mapping[str, Any] | None = None):
        object.__setattr__(self, "_d", dict(values or {}))

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._d.items())))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("options are read-only")

    def __reduce__(self):
        return (Options, (self._d,))

    def __repr__(self) -> str:
        return f"Options({self._d!r})"


EMPTY = Options()


def declare(kind: str, name: str, options: Mapping[str, Any] | None) -> Options:
    """The checked declaration ``options`` of the part ``name``: identifiers mapped to
    defaults of type bool, int, float or str (a ValueError naming the option otherwise)."""
    if options is None:
        return EMPTY
    if not isinstance(options, Mapping):
        raise ValueError(f"{kind} {name!r}: options: expected a dict of name: default, got "
                         f"{type(options).__name__}")
    for key, default in options.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"{kind} {name!r}: an option's name is an identifier, got "
                             f"{key!r}")
        if type(default) not in _TYPES or (isinstance(default, float)
                                           and not math.isfinite(default)):
            raise ValueError(f"{kind} {name!r}: option {key!r}: a default of type bool, "
                             f"int, float or str (the option's type is its default's), got "
                             f"{default!r}")
    return Options(options)


def _fail(field: str, what: str) -> UsageError:
    err = UsageError(f"{field}: {what}")
    err.field = field.partition(".")[0]
    return err


def typed(field: str, value: Any, default: Any) -> Any:
    """``value`` as the type of ``default`` (a text read as it, an integer as a number);
    a :class:`UsageError` naming ``field`` when it is not one."""
    kind = type(default)
    if isinstance(value, str) and kind is not str:
        value = _read(value.strip(), kind)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    ok = type(value) is kind and not (kind is float and not math.isfinite(value))
    if not ok:
        raise _fail(field, f"expected {_TYPE_TEXT[kind]} (the type of its default "
                    f"{default!r}), got {value!r}")
    return value


def _read(text: str, kind: type) -> Any:
    """``text`` as ``kind`` (bool, int or float), or the text itself when it is not one."""
    if kind is bool:
        low = text.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        return False if low in ("false", "0", "no", "off") else text
    try:
        if kind is int:
            v = float(text) if any(c in text for c in ".eE") else int(text)
            return int(v) if isinstance(v, float) and v.is_integer() else v
        return float(text)
    except (ValueError, OverflowError):
        return text


def resolve(field: str, kind: str, name: str, declared: Mapping[str, Any],
            given: Any) -> Options:
    """The options the part ``name`` (a ``kind``) runs with: its ``declared`` defaults,
    replaced by the configuration's ``given`` table (field ``field``), each of its
    default's type. An option not declared is a :class:`UsageError` listing the declared
    ones."""
    if given is None:
        given = {}
    if not isinstance(given, Mapping):
        raise _fail(field, f"expected a table of option: value, got {given!r}")
    out = dict(declared)
    for key, value in given.items():
        if key not in declared:
            known = (f"its options: {', '.join(declared)}" if declared
                     else "it declares no options")
            raise _fail(f"{field}.{key}" if isinstance(key, str) else field,
                        f"not an option of the {kind} {name!r} ({known})")
        out[key] = typed(f"{field}.{key}", value, declared[key])
    return Options(out)
