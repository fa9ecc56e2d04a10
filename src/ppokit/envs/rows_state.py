"""A multi-agent vector env's state as plain data (:class:`ppokit.envs.multiagent.AgentRows`
and its PettingZoo envs): what the environment checkpoint holds for exact resume, JSON
with numbers, strings, arrays, lists, tables and generators only, so reading it back
executes nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from gymnasium import spaces

if TYPE_CHECKING:
    from .multiagent import AgentRows

__all__ = ["rows_state", "load_rows_state"]


def _plain(v, depth: int = 0):
    """``v`` as JSON-able data, or raise ``TypeError`` (numpy arrays, scalars, strings,
    lists and tables of them, a numpy generator)."""
    if depth > 8:
        raise TypeError("too deep")
    if isinstance(v, (bool, int, float, str, type(None))):
        return v
    if isinstance(v, np.ndarray) and v.dtype != object:
        return {"__nd__": str(v.dtype), "shape": list(v.shape), "data": v.ravel().tolist()}
    if isinstance(v, np.generic) and not isinstance(v, np.object_):
        return {"__np__": str(v.dtype), "v": v.item()}
    if isinstance(v, np.random.Generator):
        return {"__rng__": v.bit_generator.state}
    if isinstance(v, (list, tuple)):
        return {"__list__": [_plain(x, depth + 1) for x in v]}
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {"__dict__": {k: _plain(x, depth + 1) for k, x in v.items()}}
    raise TypeError(type(v).__name__)


def _unplain(v):
    if not isinstance(v, dict):
        return v
    if "__list__" in v:
        return [_unplain(x) for x in v["__list__"]]
    if "__dict__" in v:
        return {k: _unplain(x) for k, x in v["__dict__"].items()}
    if "__rng__" in v:
        g = np.random.default_rng()
        g.bit_generator.state = v["__rng__"]
        return g
    if "__nd__" in v:
        return np.asarray(v["data"], dtype=v["__nd__"]).reshape(v["shape"])
    return np.dtype(v["__np__"]).type(v["v"])


def _static(v) -> bool:
    """Spaces (and tables of them) and methods: rebuilt by the constructor, not state."""
    if isinstance(v, spaces.Space) or callable(v):
        return True
    return isinstance(v, dict) and bool(v) and all(isinstance(x, spaces.Space)
                                                  for x in v.values())


def rows_state(env: AgentRows) -> dict | None:
    """A JSON-able snapshot of ``env`` and its PettingZoo envs, or ``None`` when an env
    holds anything but plain data (numbers, strings, arrays, lists, tables, a generator)."""
    try:
        subs = [{k: _plain(v) for k, v in vars(e).items() if not _static(v)}
                for e in env.envs]
        return {"kind": "agents", "live": _plain(env.live), "over": _plain(env.over),
                "obs": _plain(env._obs), "masks": _plain(env._masks), "envs": subs,
                "returns": _plain(env.returns), "finished": _plain(env.finished),
                "states": _plain(env._states)}
    except TypeError:
        return None


def load_rows_state(env: AgentRows, state: dict) -> None:
    """Put a :func:`rows_state` snapshot back into ``env`` (built by the same
    configuration)."""
    env.live = _unplain(state["live"])
    env.over = _unplain(state["over"])
    env._obs = _unplain(state["obs"])
    env._masks = _unplain(state["masks"])
    env.returns = _unplain(state["returns"])
    env.finished = [(int(i), float(r)) for i, r in _unplain(state["finished"])]
    env._states = _unplain(state.get("states"))
    for e, s in zip(env.envs, state["envs"], strict=True):
        for k, v in s.items():
            setattr(e, k, _unplain(v))
