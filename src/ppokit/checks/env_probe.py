"""A bounded run of a user's environment, recording what the environment checks read.

:func:`probe` steps one environment for at most ``steps`` steps or ``seconds`` seconds,
resetting it whenever an episode ends. The first half of the steps takes uniformly random
actions (``action_space.sample()``, seeded); the second half takes the actions ppokit's
freshly initialised policy would send: for a ``Box`` action space a standard normal draw
(the untrained Gaussian policy's mean is ≈ 0, its standard deviation 1) clipped to the
bounds, as the collector clips it; for every other action space the untrained policy is
≈ uniform, so the actions stay uniformly random.

What it records (:class:`Trace`): every episode's length, end flag and return; each
observation's leaves (a ``Dict``/``Tuple`` observation is split into its parts) as rows of
numbers when a leaf is small enough (at most :data:`MAX_FEATURES` numbers and not an
image), with the step index inside its episode and whether it was a terminal observation;
rewards; observations outside their declared space and non-finite values, with where they
first occurred; the keys of every ``info``; the time of each ``step`` and ``reset``; the
first exception ``reset`` or ``step`` raised; and what ``step`` did after the first episode
ended, before ``reset`` (three more steps).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import numpy as np
from gymnasium import spaces

from .env_masks import allowed_action, env_mask, mask_kind

__all__ = ["Leaf", "Episode", "Trace", "probe", "leaves_of", "AFTER_END_STEPS",
           "MAX_FEATURES"]

MAX_FEATURES = 256     # a leaf with more numbers (or an image) keeps summaries only
AFTER_END_STEPS = 3    # steps taken after the first episode ended, before its reset
MAX_EXAMPLES = 5       # examples of each kind of problem kept as evidence


@dataclass
class Leaf:
    """One part of the observation: ``path`` (``obs`` or ``obs['key']``), its space, and
    whether it is an image (ppokit's CNN input) or kept as rows of numbers."""

    path: str
    space: spaces.Space
    image: bool
    rows: list = field(default_factory=list)   # flattened float64 values per step
    keep_rows: bool = True


@dataclass
class Episode:
    length: int
    terminated: bool
    truncated: bool
    ret: float
    disc_ret: float     # discounted with GAMMA


GAMMA = 0.99


@dataclass
class Trace:
    """What :func:`probe` saw (see the module documentation)."""

    leaves: list[Leaf]
    steps: int = 0
    seconds: float = 0.0
    stopped_by: str = "steps"
    step_times: list[float] = field(default_factory=list)
    reset_times: list[float] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    t_index: list[int] = field(default_factory=list)      # step index in its episode
    terminal: list[bool] = field(default_factory=list)    # obs ended an episode (terminated)
    outside: list[tuple[int, str, str]] = field(default_factory=list)
    n_outside: int = 0
    dtype_only: list[tuple[int, str, str]] = field(default_factory=list)
    nonfinite: list[tuple[int, str]] = field(default_factory=list)
    n_nonfinite: int = 0
    info_keys: dict[str, str] = field(default_factory=dict)   # key -> where first seen
    unpicklable: list[tuple[str, str]] = field(default_factory=list)
    exception: tuple[str, int, str] | None = None   # (call, step, "raised Type: ...")
    after_end: dict | None = None


def leaves_of(space: spaces.Space, path: str = "obs") -> list[Leaf]:
    """The observation's parts in a fixed order (``Dict`` keys sorted as Gymnasium
    keeps them, ``Tuple`` by position)."""
    from ppokit.policies.encoders import is_image_space

    if isinstance(space, spaces.Dict):
        return [x for k, s in space.spaces.items() for x in leaves_of(s, f"{path}[{k!r}]")]
    if isinstance(space, spaces.Tuple):
        return [x for i, s in enumerate(space.spaces) for x in leaves_of(s, f"{path}[{i}]")]
    image = is_image_space(space)
    size = int(np.prod(space.shape)) if space.shape is not None else MAX_FEATURES + 1
    return [Leaf(path, space, image, keep_rows=not image and size <= MAX_FEATURES)]


def _parts(obs, space: spaces.Space):
    if isinstance(space, spaces.Dict):
        for k, s in space.spaces.items():
            yield from _parts(obs[k], s)
    elif isinstance(space, spaces.Tuple):
        for o, s in zip(obs, space.spaces):
            yield from _parts(o, s)
    else:
        yield obs


def _describe_outside(value, space: spaces.Space) -> tuple[str, bool] | None:
    """``(what is wrong, dtype only)`` for a value outside ``space``; None when inside."""
    if isinstance(space, spaces.Box):
        a = np.asarray(value)
        if a.shape != space.shape:
            return f"shape {a.shape}, declared {space.shape}", False
        if a.dtype.kind in "fc" and not np.isfinite(a).all():
            a = np.where(np.isfinite(a), a, 0)  # non-finite values are reported apart
        try:
            low = a < space.low
            high = a > space.high
        except TypeError:
            return f"values of dtype {a.dtype}", False
        if low.any() or high.any():
            i = int(np.flatnonzero((low | high).ravel())[0])
            v = float(a.ravel()[i])
            lo, hi = float(space.low.ravel()[i]), float(space.high.ravel()[i])
            where = f"[{i}]" if a.size > 1 else ""
            return f"value{where} = {v:.6g} outside [{lo:.6g}, {hi:.6g}]", False
        if not np.can_cast(a.dtype, space.dtype):
            return f"dtype {a.dtype}, declared {space.dtype}", True
        return None
    try:
        inside = space.contains(value)
    except Exception:  # noqa: BLE001 - a value the space cannot even compare
        inside = False
    return None if inside else (f"{_short(value)} not in {space}", False)


class _BadReturn(Exception):
    """``reset`` returned something other than ``(obs, info)``."""


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _nonfinite(value) -> bool:
    a = np.asarray(value)
    return a.dtype.kind in "fc" and not np.isfinite(a).all()


class _Recorder:
    def __init__(self, trace: Trace, space: spaces.Space):
        self.trace = trace
        self.space = space

    def obs(self, obs, step: int, t: int, terminal: bool, where: str) -> None:
        tr = self.trace
        try:
            parts = list(_parts(obs, self.space))
        except (KeyError, IndexError, TypeError):
            tr.n_outside += 1
            if len(tr.outside) < MAX_EXAMPLES:
                tr.outside.append((step, "obs", f"{where}: {_short(obs)} does not have the "
                                   f"structure of {self.space}"))
            for leaf in tr.leaves:
                leaf.keep_rows = False
            return
        for leaf, value in zip(tr.leaves, parts):
            bad = _describe_outside(value, leaf.space)
            if bad is not None:
                text, dtype_only = bad
                if dtype_only:
                    if len(tr.dtype_only) < MAX_EXAMPLES:
                        tr.dtype_only.append((step, leaf.path, text))
                else:
                    tr.n_outside += 1
                    if len(tr.outside) < MAX_EXAMPLES:
                        tr.outside.append((step, leaf.path, f"{where}: {text}"))
            if _nonfinite(value):
                tr.n_nonfinite += 1
                if len(tr.nonfinite) < MAX_EXAMPLES:
                    tr.nonfinite.append((step, f"{leaf.path} ({where})"))
            if leaf.keep_rows:
                a = np.asarray(value, dtype=np.float64).ravel()
                if leaf.rows and a.shape != leaf.rows[0].shape:
                    leaf.keep_rows = False
                    leaf.rows = []
                else:
                    leaf.rows.append(a)
        tr.t_index.append(t)
        tr.terminal.append(terminal)

    def info(self, info, where: str) -> None:
        import pickle

        tr = self.trace
        if not isinstance(info, dict):
            return
        for k in info:
            tr.info_keys.setdefault(str(k), where)
        if len(tr.unpicklable) < MAX_EXAMPLES:
            for k, v in info.items():
                try:
                    pickle.dumps(v)
                except Exception as exc:  # noqa: BLE001 - whatever pickling raises
                    if all(k != u for u, _ in tr.unpicklable):
                        tr.unpicklable.append((str(k), f"{type(exc).__name__} ({where})"))


def _error(exc: BaseException) -> str:
    msg = str(exc).splitlines()[0] if str(exc) else ""
    return f"raised {type(exc).__name__}{': ' + msg[:160] if msg else ''}"


def _policy_action(space: spaces.Space, rng: np.random.Generator):
    """What ppokit's untrained policy sends: N(0, 1) clipped to a Box's bounds."""
    if isinstance(space, spaces.Box):
        a = rng.standard_normal(space.shape)
        return np.clip(a, space.low, space.high).astype(space.dtype)
    return space.sample()


def _mask_or_none(env, kind: str | None, obs, info):
    """The current state's action mask, ``None`` without one or when it is broken (the
    ``action-mask`` check reports that)."""
    if kind is None:
        return None
    try:
        return env_mask(env, kind, obs, info)
    except Exception:  # noqa: BLE001 - reported by check_action_masks
        return None


def probe(env, *, steps: int = 5000, seconds: float = 30.0, seed: int = 0) -> Trace:
    """Step ``env`` (a ``gymnasium.Env``) as the module documentation says."""
    leaves = leaves_of(env.observation_space)
    trace = Trace(leaves)
    rec = _Recorder(trace, env.observation_space)
    act_space = copy.deepcopy(env.action_space)
    act_space.seed(seed)
    rng = np.random.default_rng(seed)
    t_start = time.perf_counter()

    def reset(s=None):
        t0 = time.perf_counter()
        out = env.reset(seed=s)
        trace.reset_times.append(time.perf_counter() - t0)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise _BadReturn(f"returned {_short(out)[:40]}, not (obs, info)")
        return out

    first = _reset_or_record(lambda: reset(seed), trace)
    if first is None:
        return trace
    obs, info = first
    rec.obs(obs, 0, 0, False, "reset")
    rec.info(info, "reset")
    kind = mask_kind(env, obs, info)  # an env with action masks is sent allowed actions
    t, ret, disc = 0, 0.0, 0.0
    while trace.steps < steps:
        if time.perf_counter() - t_start > seconds:
            trace.stopped_by = "seconds"
            break
        mask = _mask_or_none(env, kind, obs, info)
        if mask is not None:
            action = allowed_action(act_space, mask, rng)
        else:  # uniform actions for the first half, then a policy's (_policy_action)
            action = (act_space.sample() if trace.steps < steps // 2
                      else _policy_action(act_space, rng))
        t0 = time.perf_counter()
        try:
            out = env.step(action)
        except Exception as exc:  # noqa: BLE001
            trace.exception = ("step", trace.steps, _error(exc) + f" (step {t + 1} of its "
                               f"episode, action {_short(action)})")
            break
        trace.step_times.append(time.perf_counter() - t0)
        if not (isinstance(out, tuple) and len(out) == 5):
            trace.exception = ("step", trace.steps, "returned " + _short(out)[:40] + ", not "
                               "(obs, reward, terminated, truncated, info)")
            break
        obs, r, term, trunc, info = out
        trace.steps += 1
        t += 1
        r = _reward(r, trace, t)
        ret += r
        disc += GAMMA ** (t - 1) * r
        ended = bool(term) or bool(trunc)
        rec.obs(obs, trace.steps, t, bool(term), "step")
        rec.info(info, "step")
        if not ended:
            continue
        trace.episodes.append(Episode(t, bool(term), bool(trunc), ret, disc))
        if trace.after_end is None:
            trace.after_end = _after_end(env, act_space, bool(term))
        again = _reset_or_record(reset, trace)
        if again is None:
            break
        obs, info = again
        rec.obs(obs, trace.steps, 0, False, "reset")
        rec.info(info, "reset")
        t, ret, disc = 0, 0.0, 0.0
    trace.seconds = time.perf_counter() - t_start
    return trace


def _reset_or_record(reset, trace: Trace):
    """``reset()``'s ``(obs, info)``, or None with what went wrong recorded in ``trace``
    (a return that is not that pair, or the environment's exception)."""
    try:
        return reset()
    except _BadReturn as exc:
        trace.exception = ("reset", trace.steps, str(exc))
    except Exception as exc:  # noqa: BLE001 - the user's env raised: a finding
        trace.exception = ("reset", trace.steps, _error(exc))
    return None


def _reward(r, trace: Trace, t: int) -> float:
    """A step's reward as a float (NaN where it is none), recorded in ``trace``; a
    non-finite one counted, with the first few as examples."""
    try:
        r = float(r)
    except (TypeError, ValueError):
        r = float("nan")
    if not np.isfinite(r):
        trace.n_nonfinite += 1
        if len(trace.nonfinite) < MAX_EXAMPLES:
            trace.nonfinite.append((trace.steps, f"reward = {r} (step {t} of its "
                                    "episode)"))
    trace.rewards.append(r)
    return r


def _after_end(env, act_space, terminated: bool) -> dict:
    """Three more steps after an episode ended, before ``reset``: what came back."""
    out = {"ended_by": "terminated" if terminated else "truncated", "steps": []}
    for _ in range(AFTER_END_STEPS):
        try:
            _, r, term, trunc, _ = env.step(act_space.sample())
        except Exception as exc:  # noqa: BLE001 - refusing is a good answer
            out["raised"] = _error(exc)
            break
        out["steps"].append((bool(term), bool(trunc), float(r) if np.isscalar(r) else r))
    return out
