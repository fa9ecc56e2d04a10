"""The ``action-mask`` check of ``ppokit check --env``: an environment that gives action
masks (:mod:`ppokit.envs.masks`: an ``"action_mask"`` observation key, an
``action_masks()`` method or ``info["action_mask"]``) gives, in every state of a short
run, a mask of the right shape and values that allows at least one action (in every entry
of a MultiDiscrete), and accepts each allowed action it is given.

The run takes a uniformly drawn allowed action at each step (:func:`allowed_action`, also
what the probe of :mod:`.env_probe` acts with, so an environment that refuses forbidden
actions is not reported for refusing them).
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from ppokit.envs.masks import KINDS, env_mask, mask_kind
from ppokit.errors import UserCodeError

from .result import CheckResult, failed, passed, skipped

__all__ = ["mask_kind", "env_mask", "allowed_action", "check_action_masks", "MASK_STEPS"]

MASK_STEPS = 200
NAME, CRITERION = "action-mask", "every action mask has the action space's shape, allows an " \
    "action, and the env accepts the allowed actions"


def allowed_action(space, mask: np.ndarray | None, rng: np.random.Generator):
    """A uniformly drawn action of ``space`` (Discrete or MultiDiscrete) that ``mask``
    allows (any action without a mask), in the space's own values (``start`` added)."""
    if mask is None:
        return space.sample()
    if isinstance(space, spaces.Discrete):
        return space.dtype.type(int(space.start) + int(rng.choice(np.flatnonzero(mask))))
    nvec = np.asarray(space.nvec).reshape(-1)
    out, at = [], 0
    for k in nvec:
        out.append(int(rng.choice(np.flatnonzero(mask[at:at + int(k)]))))
        at += int(k)
    a = np.asarray(out).reshape(space.nvec.shape) + np.asarray(space.start)
    return a.astype(space.dtype)


def check_action_masks(env, seed: int = 0, steps: int = MASK_STEPS) -> CheckResult:
    """The ``action-mask`` check (module doc) on ``env``, from ``reset(seed=seed)``."""
    obs, info = env.reset(seed=seed)
    kind = mask_kind(env, obs, info)
    if kind is None:
        return skipped(NAME, CRITERION, "the environment gives no action masks")
    where = f"action masks from {KINDS[kind]}"
    space = env.action_space
    if not isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
        return failed(NAME, f"{where} with a {type(space).__name__} action space", CRITERION,
                      "masks apply to Discrete and MultiDiscrete actions",
                      "give no mask, or use a Discrete / MultiDiscrete action space")
    rng = np.random.default_rng(seed)
    for t in range(steps):
        try:
            mask = env_mask(env, kind, obs, info, "env")
        except UserCodeError as exc:
            return failed(NAME, f"a broken mask at step {t}", CRITERION, str(exc),
                          "return W booleans per state (W = n, or sum(nvec)), at least one "
                          "true in each entry", step=t)
        action = allowed_action(space, mask, rng)
        try:
            obs, _, term, trunc, info = env.step(action)
        except Exception as exc:  # noqa: BLE001 - the user's env refused an allowed action
            return failed(NAME, f"step {t} refused the allowed action {action!r}", CRITERION,
                          f"{type(exc).__name__}: {str(exc)[:160]}", "a mask may allow only "
                          "actions the env accepts in that state", step=t)
        if term or trunc:
            obs, info = env.reset()
    return passed(NAME, f"{steps} masks from {KINDS[kind]}, each allowing an action; every "
                  "allowed action taken was accepted", CRITERION)
