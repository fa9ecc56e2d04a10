"""Where a vector env's action masks come from, and the one check every mask passes.

An environment whose Discrete or MultiDiscrete actions are not all allowed in every state
says which are, in one of three ways ppokit reads (looked for in this order):

* ``obs``: a ``Dict`` observation with the key ``"action_mask"`` (PettingZoo's classic
  games): its entries are read from the flat observation vector
  (:class:`ppokit.envs.vec.FlattenDictObs`), and the multi-input encoder does not take
  that key as an input (:class:`ppokit.policies.encoders.MultiInputEncoder`);
* ``method``: an ``action_masks()`` method (sb3-contrib's convention, which its
  ``ActionMasker`` wrapper provides): on the vector env itself (``[N, W]``), else on each
  sub-environment through ``VectorEnv.call``;
* ``info``: ``info["action_mask"]`` of every reset and step.

A mask is ``W`` entries per environment, true (or 1) where the action is allowed, ``W`` as
:func:`ppokit.policies.masking.mask_width` says (MultiDiscrete: the heads' masks
concatenated). :meth:`MaskSource.read` returns ``[N, W]`` bool, after checking the shape,
the values (booleans or 0/1) and that every head allows at least one action; a mask that
fails is a :class:`ppokit.errors.UserCodeError` naming the environment, in one line.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from ppokit.errors import UserCodeError

__all__ = ["MASK_KEY", "MASK_METHOD", "MaskSource", "find_mask_source", "check_masks",
           "mask_columns", "mask_kind", "env_mask"]

MASK_KEY = "action_mask"
MASK_METHOD = "action_masks"
KINDS = {"obs": f'the observation\'s "{MASK_KEY}" key', "method": f"{MASK_METHOD}()",
         "info": f'info["{MASK_KEY}"]'}


def _segments(space) -> list[int]:
    if isinstance(space, spaces.MultiDiscrete):
        return [int(n) for n in np.asarray(space.nvec).reshape(-1)]
    return [int(space.n)]


def check_masks(m, n: int, space, label: str = "env", where: str = "action masks",
                dummy: np.ndarray | None = None) -> np.ndarray:
    """``m`` as ``[n, W]`` bool for ``space``'s actions, or a :class:`UserCodeError`
    (``label``: the environment, ``where``: the mask's source). Rows marked in ``dummy``
    (steps whose action the env ignores) may allow nothing: they become all true."""
    segs = _segments(space)
    width = sum(segs)
    try:
        a = np.asarray(m)
        a = a.reshape(n, width) if a.size == n * width and a.dtype != object else None
    except (TypeError, ValueError):
        a = None
    if a is None:
        got = getattr(np.asarray(m, dtype=object), "shape", "?")
        raise UserCodeError(f"{label}: {where}: expected {n} x {width} booleans (one per "
                            f"action of {_brief(space)}), got an array of shape {got}")
    if a.dtype != bool:
        if not (np.issubdtype(a.dtype, np.number) and np.isin(a, (0, 1)).all()):
            raise UserCodeError(f"{label}: {where}: expected booleans or 0/1, got values "
                                f"of {a.dtype} outside 0/1")
        a = a != 0
    ends = np.cumsum(segs)
    for head, (stop, k) in enumerate(zip(ends, segs)):
        empty = ~a[:, stop - k:stop].any(1)
        if dummy is not None and (empty & dummy).any():
            a = a.copy()  # (a row whose action is ignored: any action will do)
            a[empty & dummy, stop - k:stop] = True
            empty &= ~dummy
        if empty.any():
            which = f" (entry {head})" if len(segs) > 1 else ""
            raise UserCodeError(f"{label}: {where}: the mask of env {int(np.argmax(empty))} "
                                f"allows no action{which}; a mask must allow at least one "
                                "action in every state")
    return a


def _brief(space) -> str:
    return " ".join(repr(space).split())[:60]


def mask_columns(obs_space) -> tuple[int, int] | None:
    """``(start, stop)`` of the ``"action_mask"`` entries in the flat vector of a ``Dict``
    observation stored flat (sorted keys: :class:`ppokit.envs.vec.FlattenDictObs`)."""
    d = getattr(obs_space, "dict_space", None)
    if d is None or MASK_KEY not in d.spaces:
        return None
    start = 0
    for key in sorted(d.spaces):
        size = int(spaces.flatdim(d.spaces[key]))
        if key == MASK_KEY:
            return start, start + size
        start += size
    return None


class MaskSource:
    """Reads the action masks of a vector env's current observations (module doc).
    ``kind``: ``obs``, ``method`` or ``info``."""

    def __init__(self, env, kind: str, label: str = "env"):
        if kind not in KINDS:
            raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
        self.env, self.kind, self.label = env, kind, label
        self.space = env.single_action_space
        self.num_envs = env.num_envs
        self.cols = mask_columns(env.single_observation_space) if kind == "obs" else None

    @property
    def where(self) -> str:
        return f"action masks from {KINDS[self.kind]}"

    def read(self, obs, info: dict | None, dummy: np.ndarray | None = None) -> np.ndarray:
        """``[N, W]`` bool masks of the observations ``obs`` just returned with ``info``."""
        n = self.num_envs
        if self.kind == "obs":
            a, b = self.cols
            raw = np.asarray(obs).reshape(n, -1)[:, a:b]
        elif self.kind == "method":
            raw = _call_masks(self.env)
        else:
            info = info or {}
            if MASK_KEY not in info:
                raise UserCodeError(f"{self.label}: {self.where}: a step's info has no "
                                    f'"{MASK_KEY}" (it must come with every reset and step)')
            raw = info[MASK_KEY]
            have = info.get("_" + MASK_KEY)
            if have is not None and not np.all(np.asarray(have) | (
                    dummy if dummy is not None else False)):
                raise UserCodeError(f"{self.label}: {self.where}: missing for env "
                                    f"{int(np.argmin(have))} at a step")
        return check_masks(raw, n, self.space, self.label, self.where, dummy)


def _call_masks(env):
    """The sub-environments' ``action_masks()`` (the vector env's own when it has one)."""
    own = getattr(env, MASK_METHOD, None)
    if callable(own):
        return own()
    base = getattr(env, "unwrapped", env)
    own = getattr(base, MASK_METHOD, None)
    if callable(own):
        return own()
    return np.stack([np.asarray(m) for m in base.call(MASK_METHOD)])


def _has_method(env) -> bool:
    if callable(getattr(env, MASK_METHOD, None)):
        return True
    base = getattr(env, "unwrapped", env)
    if callable(getattr(base, MASK_METHOD, None)):
        return True
    subs = getattr(base, "envs", None)
    if subs:  # a sync vector env: its sub-environments are here
        try:
            return callable(subs[0].get_wrapper_attr(MASK_METHOD))
        except AttributeError:
            return False
    call = getattr(base, "call", None)
    if call is None:
        return False
    try:  # (asked without calling it: a failed call ends an async env's workers)
        return all(call("has_wrapper_attr", MASK_METHOD))
    except Exception:  # noqa: BLE001 - a vector env whose call cannot answer: no method
        return False


def find_mask_source(env, info: dict | None, label: str = "env") -> MaskSource | None:
    """The source of ``env``'s action masks (module doc), ``None`` when it gives none;
    ``info``: the info of the reset just done. An action space that takes no mask with an
    env that gives one is an error."""
    if mask_columns(env.single_observation_space) is not None:
        kind = "obs"
    elif _has_method(env):
        kind = "method"
    elif info and MASK_KEY in info:
        kind = "info"
        from .vec import keep_step_infos

        keep_step_infos(env)  # the lean sync vector env does not batch a step's infos
    else:
        return None
    if not isinstance(env.single_action_space, (spaces.Discrete, spaces.MultiDiscrete)):
        raise UserCodeError(f"{label}: it gives action masks ({KINDS[kind]}), but its "
                            f"action space is {_brief(env.single_action_space)}: masks apply "
                            "to Discrete and MultiDiscrete actions")
    return MaskSource(env, kind, label)


# --------------------------------------------------------------- one environment

def mask_kind(env, obs, info) -> str | None:
    """How ``env`` (one ``gymnasium.Env``) gives its masks, from a reset's ``obs`` and
    ``info``: ``obs``, ``method``, ``info`` or ``None``."""
    if isinstance(obs, dict) and MASK_KEY in obs:
        return "obs"
    try:
        if callable(env.get_wrapper_attr(MASK_METHOD)):
            return "method"
    except AttributeError:
        pass
    return "info" if isinstance(info, dict) and MASK_KEY in info else None


def env_mask(env, kind: str, obs, info, where: str = "env") -> np.ndarray:
    """The ``[W]`` bool mask of ``env``'s current state (checked: a
    :class:`UserCodeError` in one line when it is broken)."""
    if kind == "obs":
        raw = obs.get(MASK_KEY) if isinstance(obs, dict) else None
    elif kind == "method":
        raw = env.get_wrapper_attr(MASK_METHOD)()
    else:
        raw = info.get(MASK_KEY) if isinstance(info, dict) else None
    if raw is None:
        raise UserCodeError(f"{where}: action masks from {KINDS[kind]}: missing at a step")
    return check_masks(raw, 1, env.action_space, where, f"action masks from {KINDS[kind]}")[0]
