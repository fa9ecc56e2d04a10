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

Atari games (``ALE/Breakout-v5`` → EnvPool's ``Breakout-v5``) run with EnvPool's own
preprocessing in C++, set to what :mod:`ppokit.envs.atari` does in Python: sticky actions
0.25, 1–30 no-ops, 4-frame skip with a max over the last two, FIRE at reset, episodic life
and sign-clipped rewards (training), 84×84 grey by area interpolation, 4 stacked uint8
frames channel-first, 27,000 agent steps (108,000 frames) at most. The two are alike, not
identical (EnvPool's emulator seeding, resize, FIRE and no-op code), so a run on
EnvPool is not the same run as on ``sync``. :class:`EnvPoolAtari` adds the game score
ppokit reports for Atari (all lives, unclipped rewards: the sum of EnvPool's raw
``info["reward"]`` up to the step where ``info["terminated"]`` says the game is over, or
the step limit) as ``info["game_score"]`` / ``info["game_length"]``. Evaluation plays
ppokit's own wrappers (whole games), as for every Atari run.
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from ppokit.errors import UsageError, extra_hint

__all__ = ["EnvPoolVectorEnv", "EnvPoolAtari", "make_envpool", "envpool_ids",
           "ATARI_KWARGS", "EXTRA_HINT"]

EXTRA_HINT = extra_hint("envpool")


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

    defaults: dict[str, Any] = {}  # EnvPool options set before the user's env_kwargs

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
                                                   seed=int(seed),
                                                   **{**self.defaults, **self.env_kwargs})
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


# EnvPool's Atari options matching ppokit.envs.atari's training stack (module doc)
ATARI_KWARGS: dict[str, Any] = dict(
    episodic_life=True, reward_clip=True, repeat_action_probability=0.25, noop_max=30,
    frame_skip=4, stack_num=4, img_height=84, img_width=84, gray_scale=True,
    use_fire_reset=True, use_inter_area_resize=True, max_episode_steps=27_000)


class EnvPoolAtari(EnvPoolVectorEnv):
    """An EnvPool Atari pool that reports each game's score (module doc)."""

    game_scores = True
    defaults = ATARI_KWARGS

    def __init__(self, task_id: str, num_envs: int, seed: int = 0,
                 env_kwargs: dict[str, Any] | None = None):
        super().__init__(task_id, num_envs, seed, env_kwargs)
        self._score = np.zeros(num_envs)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self._score[:] = 0.0
        return super().reset(seed=seed, options=options)

    def step(self, actions):
        obs, r, te, tr, info = super().step(actions)
        # the raw reward: 0 on the reset row that follows an ended episode (NEXT_STEP)
        self._score += np.asarray(info["reward"], np.float64)
        over = (np.asarray(info["terminated"]) != 0) | tr
        if over.any():
            info = dict(info, game_score=np.where(over, self._score, 0.0),
                        _game_score=over,
                        game_length=np.where(over, np.asarray(info["elapsed_step"]), 0))
            self._score[over] = 0.0
        return obs, r, te, tr, info


def make_envpool(env_id: str, num_envs: int, autoreset: str,
                 env_kwargs: dict[str, Any] | None) -> EnvPoolVectorEnv:
    """The EnvPool vector env of ``env_id`` (an id EnvPool lists, or an ALE id of a game
    it has: :class:`EnvPoolAtari`)."""
    ids = envpool_ids()
    atari = env_id.startswith("ALE/")
    task = env_id.removeprefix("ALE/")
    if task not in ids:
        raise UsageError(f"vectorization: envpool cannot run {env_id!r}: EnvPool does not "
                         "provide it")
    if autoreset not in ("auto", "next_step"):
        raise UsageError("autoreset_mode: EnvPool resets in next_step mode only; set "
                         "autoreset_mode=auto or next_step")
    if atari:
        return EnvPoolAtari(task, num_envs, 0, env_kwargs)
    return EnvPoolVectorEnv(env_id, num_envs, 0, env_kwargs)
