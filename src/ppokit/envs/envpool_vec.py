"""``vectorization = envpool``: the environments stepped by EnvPool (the ``envpool`` extra),
seen as a Gymnasium ``VectorEnv`` in ``NEXT_STEP`` auto-reset mode.

EnvPool steps a batch of C++ environments in its own threads. Its auto-reset convention
is Gymnasium's ``NEXT_STEP``: the step that ends an episode returns the real final
observation with ``terminated`` / ``truncated``; the *next* step of that env ignores its
action and returns the reset observation with reward 0 and both flags false. The collector
already handles that mode (:mod:`ppokit.rollout.collector`: the final observation's value
is the truncation's bootstrap, the following dummy row is ``valid = False``), so the same
two masks come out as with Gymnasium's vector envs.

EnvPool seeds its environments when it builds them, not on ``reset``; a
``reset(seed=s)`` with a new seed builds the pool again with ``seed=s`` (env ``i`` then
gets EnvPool's own seed derived from ``s`` and ``i``). Its environments are its own
C++ implementations: for CartPole-v1 the dynamics are Gymnasium's (tests/test_envpool.py
compares them step by step), but initial states come from EnvPool's generator, so a run
is not the same run as with ``vectorization = sync``. Evaluation (``ppokit eval``,
``eval_every``) plays Gymnasium's environment of the same id.

Atari games are not offered here: ppokit preprocesses them itself and reports their game
scores (:mod:`ppokit.envs.atari`); EnvPool's Atari preprocessing is another one.
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from ppokit.errors import UsageError

__all__ = ["EnvPoolVectorEnv", "make_envpool", "envpool_ids", "EXTRA_HINT"]

EXTRA_HINT = "pip install -e '.[envpool]'"


def _envpool():
    try:
        import envpool
    except ImportError:
        raise UsageError(f"vectorization: envpool needs the envpool extra: {EXTRA_HINT} "
                         "(envpool is not installed)") from None
    return envpool


def envpool_ids() -> list[str]:
    """The task ids EnvPool provides."""
    return list(_envpool().list_all_envs())


class EnvPoolVectorEnv(VectorEnv):
    """A Gymnasium ``VectorEnv`` over an EnvPool pool (module documentation)."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, task_id: str, num_envs: int, seed: int = 0,
                 env_kwargs: dict[str, Any] | None = None):
        self.task_id = task_id
        self.env_kwargs = dict(env_kwargs or {})
        self.num_envs = num_envs
        self.pool = None
        self.seed_ = None
        self._build(seed)
        self.single_observation_space = self.pool.observation_space
        self.single_action_space = self.pool.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space,
                                                              num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def _build(self, seed: int) -> None:
        envpool = _envpool()
        if self.pool is not None:
            self.pool.close()
        try:
            with warnings.catch_warnings():  # EnvPool's float64 Box bounds, cast by Gymnasium
                warnings.filterwarnings("ignore", message=".*precision lowered by casting")
                self.pool = envpool.make_gymnasium(self.task_id, num_envs=self.num_envs,
                                                   seed=int(seed), **self.env_kwargs)
        except (TypeError, ValueError, KeyError, AssertionError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UsageError(f"env_kwargs: EnvPool cannot build {self.task_id!r} with "
                             f"{self.env_kwargs} ({msg[:200]})") from None
        self.seed_ = int(seed)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None and seed != self.seed_:
            self._build(seed)
        obs, info = self.pool.reset()
        return obs, info

    def step(self, actions):
        obs, r, te, tr, info = self.pool.step(np.asarray(actions))
        return obs, np.asarray(r, np.float64), np.asarray(te, bool), np.asarray(tr, bool), info

    def close_extras(self, **kwargs) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def make_envpool(env_id: str, num_envs: int, autoreset: str,
                 env_kwargs: dict[str, Any] | None) -> EnvPoolVectorEnv:
    """The EnvPool vector env of ``env_id`` (an id EnvPool lists; not an Atari game)."""
    ids = envpool_ids()
    if env_id.startswith("ALE/") or env_id not in ids:
        why = ("Atari games use ppokit's own preprocessing (sync or async)"
               if env_id.startswith("ALE/") else "EnvPool does not provide it")
        raise UsageError(f"vectorization: envpool cannot run {env_id!r}: {why}")
    if autoreset not in ("auto", "next_step"):
        raise UsageError("autoreset_mode: EnvPool resets in next_step mode only; set "
                         "autoreset_mode=auto or next_step")
    return EnvPoolVectorEnv(env_id, num_envs, 0, env_kwargs)
