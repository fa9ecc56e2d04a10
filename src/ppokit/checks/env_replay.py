"""Checks that replay an environment from a seed: the same seed and actions give the same
episode (``check_determinism``), and reset's ``options`` are accepted and replayable
(``check_reset_options``). Part of ``ppokit check``'s environment checks."""

from __future__ import annotations

import numpy as np

from .result import CheckResult, failed, passed, skipped, warned

__all__ = ["DETERMINISM_STEPS", "check_determinism", "check_reset_options"]

DETERMINISM_STEPS = 200


def _rollout(env, seed, actions, options=None) -> list:
    out = []
    obs, _ = env.reset(seed=seed, options=options)
    out.append(("reset", obs))
    for a in actions:
        obs, r, term, trunc, _ = env.step(a)
        out.append((obs, float(r), bool(term), bool(trunc)))
        if term or trunc:
            break
    return out


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape:
        return False
    if x.dtype.kind in "fc" and y.dtype.kind in "fc":
        return bool(np.array_equal(x, y, equal_nan=True))
    return bool(np.array_equal(x, y))


def _first_difference(a: list, b: list) -> str | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if not _same(x, y):
            what = "the reset observation" if i == 0 else (
                "observation" if not _same(x[0], y[0]) else
                "reward" if x[1] != y[1] else "terminated/truncated")
            return f"step {i}: {what}" if i else what
    if len(a) != len(b):
        return f"episode length {len(a) - 1} vs {len(b) - 1}"
    return None


def check_determinism(env, seed: int = 0, steps: int = DETERMINISM_STEPS) -> CheckResult:
    """Two runs of at most ``steps`` steps from ``reset(seed=seed)`` with the same actions;
    one from ``seed + 1``."""
    import copy

    name = "seed-determinism"
    crit = "same seed + actions: same trajectory; another seed: a different one"
    space = copy.deepcopy(env.action_space)
    space.seed(seed + 1)
    actions = [space.sample() for _ in range(steps)]
    try:
        a = _rollout(env, seed, actions)
        b = _rollout(env, seed, actions)
        c = _rollout(env, seed + 1, actions)
    except Exception as exc:  # noqa: BLE001 - reported by env-exception / env-api too
        return skipped(name, crit, f"the env raised ({type(exc).__name__}) while replaying")
    diff = _first_difference(a, b)
    if diff is not None:
        return failed(name, f"seed {seed} twice: differs at {diff}", crit,
                     f"reset(seed={seed}) and the same {len(actions)} actions gave two "
                     f"different trajectories (first difference: {diff}): results cannot "
                     "be reproduced and a resumed run is not the run", "draw every random "
                     "number from self.np_random (seeded by super().reset(seed=seed)), not "
                     "from random / np.random / time", first_difference=diff)
    if _first_difference(a, c) is None:
        return warned(name, f"seeds {seed} and {seed + 1}: identical {len(a) - 1} steps",
                     crit, "a different seed gave the same trajectory: the env ignores its "
                     "seed, so every environment copy and every run sees the same episodes "
                     "(fine only if the env is meant to be deterministic)",
                     "call super().reset(seed=seed) and draw the start state (and any "
                     "noise) from self.np_random", steps=len(a) - 1)
    return passed(name, f"{len(a) - 1} steps replayed exactly; seed {seed + 1} differs", crit,
               steps=len(a) - 1)


def check_reset_options(env, seed: int = 0, replays: bool = True) -> CheckResult:
    """``replays``: whether the env replays a seed (seed-determinism); without that, two
    starts cannot be compared."""
    name = "reset-options"
    crit = "reset(seed=s, options={}) starts where reset(seed=s) does"
    if not replays:
        return skipped(name, crit, "the env does not replay a seed (seed-determinism), so "
                     "two starts cannot be compared")
    try:
        o1, _ = env.reset(seed=seed)
        o2, _ = env.reset(seed=seed, options={})
    except Exception as exc:  # noqa: BLE001
        return failed(name, f"reset(options={{}}) raised {type(exc).__name__}", crit,
                     f"reset(seed={seed}, options={{}}) raised {type(exc).__name__}: vector "
                     "envs and wrappers pass options through", "treat options=None and an "
                     "empty dict alike (options = options or {})")
    if not _same(o1, o2):
        return failed(name, "different first observations", crit,
                     f"reset(seed={seed}, options={{}}) and reset(seed={seed}) start from "
                     "different observations: an empty options dict changes the episode",
                     "treat options=None and an empty dict alike (options = options or {})")
    return passed(name, "same first observation", crit)
