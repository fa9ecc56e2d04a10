"""Gymnasium spaces as plain data: what a run directory records of its environment.

A checkpoint's ``state.json`` holds the observation and action spaces the policy was built
for (:func:`recorded_spaces`), so that a run can be loaded — its policy rebuilt, its
``predict`` checking observations — without the environment, which a run trained on a
factory or on a user's module cannot record. The spaces are written as JSON values and
read back by :func:`space_from_data`, which builds only the spaces it knows from numbers,
strings and lists: nothing is unpickled, imported or executed, and a value that is not
one of those spaces — or one larger than :data:`MAX_ELEMENTS` entries, or nested deeper
than :data:`MAX_DEPTH` — is refused with a message naming it.

The forms (one JSON object each)::

    {"type": "Box", "shape": [...], "dtype": "float32", "low": L, "high": H}
    {"type": "Discrete", "n": n, "start": s}
    {"type": "MultiDiscrete", "nvec": [...], "start": [...], "dtype": "int64"}
    {"type": "MultiBinary", "n": n or [...]}
    {"type": "Dict", "spaces": [[key, space], ...]}

A Box bound ``L`` / ``H`` is one number when every entry is the same, else nested lists of
the shape; non-finite entries are the strings ``"inf"``, ``"-inf"`` and ``"nan"`` (so the
file stays strict JSON). A Box may carry ``"dict_space"``: the ``Dict`` whose flattening
it is (:class:`ppokit.envs.vec.FlattenDictObs`), restored as that attribute.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = ["space_to_data", "space_from_data", "recorded_spaces", "spaces_from_state",
           "state_space_from_state",
           "SpaceDataError", "MAX_ELEMENTS", "MAX_DEPTH"]

MAX_ELEMENTS = 2**26  # entries of one Box / MultiDiscrete / MultiBinary read back
MAX_DEPTH = 8  # Dict nesting read back
_FLOAT_DTYPES = ("float16", "float32", "float64")
_INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_NONFINITE = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}


class SpaceDataError(ValueError):
    """Recorded space data that is not one of the forms of the module doc."""


def _bound(values: np.ndarray) -> Any:
    """One number when every entry is the same, else nested lists of the shape (integers
    for an integer dtype, exactly)."""
    number = int if _whole(values.dtype) else _number
    flat = values.reshape(-1)
    if flat.size and (np.all(flat == flat[0]) or np.all(np.isnan(flat.astype(float)))):
        return number(flat[0])
    return np.array([number(x) for x in flat], dtype=object).reshape(values.shape).tolist()


def _whole(dtype) -> bool:
    """Integer and boolean boxes: bounds written and read as integers, exactly."""
    return bool(np.issubdtype(dtype, np.integer) or dtype == np.bool_)


def _number(v) -> Any:
    v = float(v)
    if np.isfinite(v):
        return v
    return "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")


def space_to_data(space: spaces.Space) -> dict:
    """``space`` as JSON values (module doc); a space of another kind is a ValueError."""
    if isinstance(space, spaces.Box):
        out = {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
               "low": _bound(space.low), "high": _bound(space.high)}
        inner = getattr(space, "dict_space", None)
        if inner is not None:
            out["dict_space"] = space_to_data(inner)
        return out
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist(),
                "start": space.start.tolist(), "dtype": str(space.dtype)}
    if isinstance(space, spaces.MultiBinary):
        n = space.n
        return {"type": "MultiBinary",
                "n": int(n) if np.ndim(n) == 0 else [int(x) for x in np.ravel(n)]}
    if isinstance(space, spaces.Dict):
        return {"type": "Dict",
                "spaces": [[k, space_to_data(v)] for k, v in space.spaces.items()]}
    raise ValueError(f"cannot record a {type(space).__name__} space")


def _fail(where: str, what: str):
    raise SpaceDataError(f"{where}: {what}")


def _int(v, where: str, lo: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo):
        _fail(where, f"expected an integer{'' if lo is None else f' >= {lo}'}")
    return v


def _shape(v, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) > 32:
        _fail(where, "expected a list of at most 32 sizes")
    shape = tuple(_int(x, where, 0) for x in v)
    if int(np.prod(shape, dtype=np.float64)) > MAX_ELEMENTS:
        _fail(where, f"more than {MAX_ELEMENTS} entries")
    return shape


def _dtype(v, allowed: tuple[str, ...], where: str) -> np.dtype:
    if v not in allowed:
        _fail(where, f"expected one of {', '.join(allowed)}")
    return np.dtype(v)


def _values(v, shape: tuple[int, ...], where: str, integer: bool) -> np.ndarray:
    """One number for every entry, or nested lists of exactly ``shape``."""
    def scalar(x):
        if isinstance(x, str) and not integer and x in _NONFINITE:
            return _NONFINITE[x]
        if isinstance(x, bool) or not isinstance(x, (int, float)) or (
                integer and not isinstance(x, int)):
            _fail(where, "expected " + ("integers" if integer else "numbers"))
        return x

    if not isinstance(v, list):
        return np.full(shape, scalar(v), dtype=np.int64 if integer else np.float64)
    try:
        arr = np.array(v, dtype=object)
    except ValueError:
        arr = None
    if arr is None or arr.shape != shape:
        _fail(where, f"expected one number or nested lists of shape {list(shape)}")
    flat = [scalar(x) for x in arr.reshape(-1)]
    return np.array(flat, dtype=np.int64 if integer else np.float64).reshape(shape)


def _nested_shape(v) -> list:
    """The shape nested lists ``v`` claim (their first elements' lengths)."""
    shape = []
    while isinstance(v, list) and len(shape) <= 32:
        shape.append(len(v))
        v = v[0] if v else None
    return shape


def space_from_data(data: Any, where: str = "space", depth: int = 0) -> spaces.Space:
    """The space ``data`` describes (module doc); :class:`SpaceDataError` naming ``where``
    (and the entry) for anything else."""
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        _fail(where, "expected an object with a 'type'")
    kind = data["type"]
    try:
        if kind == "Box":
            shape = _shape(data.get("shape"), f"{where}.shape")
            dtype = _dtype(data.get("dtype"), _FLOAT_DTYPES + _INT_DTYPES + ("bool",),
                           f"{where}.dtype")
            integer = _whole(dtype)
            low = _values(data.get("low"), shape, f"{where}.low", integer)
            high = _values(data.get("high"), shape, f"{where}.high", integer)
            box = spaces.Box(low.astype(dtype), high.astype(dtype), shape, dtype)
            if "dict_space" in data:
                inner = space_from_data(data["dict_space"], f"{where}.dict_space", depth + 1)
                if not isinstance(inner, spaces.Dict):
                    _fail(f"{where}.dict_space", "expected a Dict")
                box.dict_space = inner
            return box
        if kind == "Discrete":
            n = _int(data.get("n"), f"{where}.n", 1)
            return spaces.Discrete(n, start=_int(data.get("start"), f"{where}.start"))
        if kind == "MultiDiscrete":
            shape = _shape(_nested_shape(data.get("nvec")), f"{where}.nvec")
            nvec = _values(data.get("nvec"), shape, f"{where}.nvec", True)
            start = _values(data.get("start"), shape, f"{where}.start", True)
            dtype = _dtype(data.get("dtype"), _INT_DTYPES, f"{where}.dtype")
            if (nvec < 1).any():
                _fail(f"{where}.nvec", "expected integers >= 1")
            return spaces.MultiDiscrete(nvec, dtype=dtype, start=start)
        if kind == "MultiBinary":
            n = data.get("n")
            if isinstance(n, list):
                return spaces.MultiBinary(list(_shape(n, f"{where}.n")))
            return spaces.MultiBinary(_int(n, f"{where}.n", 1))
        if kind == "Dict":
            if depth >= MAX_DEPTH:
                _fail(where, f"Dict spaces nested deeper than {MAX_DEPTH}")
            items = data.get("spaces")
            if not isinstance(items, list) or not all(
                    isinstance(it, list) and len(it) == 2 and isinstance(it[0], str)
                    for it in items):
                _fail(f"{where}.spaces", "expected a list of [key, space] pairs")
            keys = [k for k, _ in items]
            if len(set(keys)) != len(keys):
                _fail(f"{where}.spaces", "a key appears twice")
            return spaces.Dict({k: space_from_data(v, f"{where}.{k}", depth + 1)
                                for k, v in items})
    except SpaceDataError:
        raise
    except (ValueError, TypeError, AssertionError, OverflowError) as exc:
        _fail(where, f"not a valid {kind} ({type(exc).__name__}: "
                     f"{str(exc).splitlines()[0][:120] if str(exc) else ''})")
    _fail(f"{where}.type", f"unknown space type {kind[:40]!r}")
    raise AssertionError  # (unreachable: _fail raises)


def recorded_spaces(observation_space: spaces.Space, action_space: spaces.Space,
                    state_space: spaces.Space | None = None) -> dict | None:
    """The ``spaces`` entry of a checkpoint's state (``None`` if one of them has no data
    form: then loading the run builds its environment, as before spaces were recorded);
    ``state_space``: a centralised critic's global state (the entry ``"state"``)."""
    try:
        out = {"observation": space_to_data(observation_space),
               "action": space_to_data(action_space)}
        if state_space is not None:
            out["state"] = space_to_data(state_space)
        return out
    except ValueError:
        return None


def state_space_from_state(state: dict) -> spaces.Space | None:
    """The global state space a checkpoint recorded for a centralised critic, ``None``
    when it recorded none; :class:`SpaceDataError` for a malformed entry."""
    d = state.get("spaces")
    if not isinstance(d, dict) or d.get("state") is None:
        return None
    return space_from_data(d["state"], "spaces.state")


def spaces_from_state(state: dict) -> tuple[spaces.Space, spaces.Space] | None:
    """``(observation_space, action_space)`` a checkpoint recorded, ``None`` for one
    written before ppokit recorded them; :class:`SpaceDataError` for a malformed entry."""
    d = state.get("spaces")
    if d is None:
        return None
    if not isinstance(d, dict):
        _fail("spaces", "expected an object with 'observation' and 'action'")
    return (space_from_data(d.get("observation"), "spaces.observation"),
            space_from_data(d.get("action"), "spaces.action"))
