"""Atari games (ALE ids such as ``ALE/Breakout-v5``) with the usual preprocessing.

ale-py ships the game ROMs and registers its ids with Gymnasium when imported
(:func:`register`, called by :func:`ppokit.envs.vec.check_env_id` the first time an id is not
found). For an ALE id, :func:`ppokit.envs.make_vec` builds every copy with
:func:`make_env`: ppokit's own wrappers, from the emulator up:

1. the ALE game itself with ``frameskip=1`` (the skipping is done by step 3) and
   ``obs_type="grayscale"`` (the emulator's own luminance of each frame). Sticky actions
   stay at the id's default — ``repeat_action_probability=0.25`` for the ``-v5`` ids, the
   ALE's recommended evaluation protocol — unless ``env_kwargs`` says otherwise (the
   ``-v4`` ids have 0);
2. :class:`NoopReset`: a new game begins with 1 to 30 (uniformly drawn) NOOP actions, so
   episodes do not all start in the same emulator state;
3. :class:`MaxAndSkip`: each agent step repeats its action on 4 frames and sums their
   rewards; the observation is the pixel-wise maximum of the last two frames (sprites that
   flicker between frames stay visible);
4. :class:`GameScore`: the score of the whole game (all lives, rewards unclipped) and its
   length in agent steps, put into ``info["game_score"]`` / ``info["game_length"]`` on the
   step where the game really ends (game over, or the ALE's limit of 108,000 frames);
5. :class:`EpisodicLife` (training only): the loss of a life ends the training episode
   (``terminated``: its value is not bootstrapped across it); the next reset continues the
   same game unless it is over;
6. :class:`FireAtLifeStart` (games whose action meanings include ``FIRE``): the wrapper
   presses FIRE for the agent at the start of every life — after a reset, and in full games
   (no episodic life) as the first action after a life is lost — so a game such as Breakout
   never stalls waiting for the ball to be launched;
7. :class:`Resize84`: 84×84 greyscale (``cv2.resize``, ``INTER_AREA``);
8. :class:`ClipRewardSign` (training only): each reward becomes its sign (−1, 0, 1);
9. :class:`FrameStack`: the last 4 frames, uint8, channel-first ``(4, 84, 84)``.

Evaluation (``ppokit eval``, evaluations during training, videos) builds the same stack
with ``training=False``: whole games, rewards unclipped — so its returns are game scores.
During training, the return ppokit reports (``episode_return_mean`` in metrics.jsonl, the
progress bar, the summary) is the :class:`GameScore` of the games that ended, not the sum
of the clipped rewards of one life the learner sees (docs/pixels.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from ppokit.errors import UsageError, extra_hint

__all__ = ["register", "is_atari_spec", "make_env", "env_fns", "NoopReset", "MaxAndSkip",
           "GameScore", "EpisodicLife", "FireAtLifeStart", "Resize84", "ClipRewardSign",
           "FrameStack", "NOOP_MAX", "SKIP", "SIZE", "STACK", "EXTRA_HINT"]

NOOP_MAX = 30
SKIP = 4
SIZE = 84
STACK = 4
EXTRA_HINT = extra_hint("atari")
_OWN_KWARGS = ("frameskip", "obs_type")  # set by the preprocessing, not by env_kwargs


def register() -> bool:
    """Register ale-py's ids with Gymnasium; ``False`` when ale-py is not installed."""
    try:
        import ale_py
    except ImportError:
        return False
    gym.register_envs(ale_py)
    return True


def is_atari_spec(spec: gym.envs.registration.EnvSpec) -> bool:
    """Whether ``spec`` is one of ale-py's games."""
    ep = spec.entry_point
    name = ep if isinstance(ep, str) else f"{getattr(ep, '__module__', '')}:"
    return name.startswith("ale_py")


def _lives(env: gym.Env) -> int:
    return int(env.unwrapped.ale.lives())


class NoopReset(gym.Wrapper):
    """A new game starts with 1..``noop_max`` NOOPs (drawn from the env's own generator, so
    ``reset(seed=...)`` decides them)."""

    def __init__(self, env: gym.Env, noop_max: int = NOOP_MAX):
        super().__init__(env)
        if env.unwrapped.get_action_meanings()[0] != "NOOP":
            raise ValueError("NoopReset: action 0 is not NOOP")
        self.noop_max = noop_max
        self.last_noops = 0

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.last_noops = int(self.unwrapped.np_random.integers(1, self.noop_max + 1))
        for _ in range(self.last_noops):
            obs, _, te, tr, info = self.env.step(0)
            if te or tr:
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """Each step repeats the action on ``skip`` frames (fewer when the game ends), sums the
    rewards and returns the pixel-wise maximum of the last two frames emulated."""

    def __init__(self, env: gym.Env, skip: int = SKIP):
        super().__init__(env)
        self.skip = skip
        self._last: np.ndarray | None = None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._last = obs
        return obs, info

    def step(self, action):
        total = 0.0
        prev = last = self._last
        for _ in range(self.skip):
            obs, r, te, tr, info = self.env.step(action)
            total += float(r)
            prev, last = last, obs
            if te or tr:
                break
        self._last = last
        return np.maximum(prev, last), total, te, tr, info


class GameScore(gym.Wrapper):
    """The score (unclipped rewards summed over all lives) and length (agent steps) of the
    game, in ``info["game_score"]`` and ``info["game_length"]`` of the step that ends it.
    Placed below :class:`EpisodicLife` and :class:`ClipRewardSign`, so it sees the real
    game."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.score, self.length = 0.0, 0

    def reset(self, **kwargs):
        self.score, self.length = 0.0, 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, r, te, tr, info = self.env.step(action)
        self.score += float(r)
        self.length += 1
        if te or tr:
            info = dict(info, game_score=self.score, game_length=self.length)
        return obs, r, te, tr, info


class EpisodicLife(gym.Wrapper):
    """(Training only.) Losing a life ends the episode (``terminated``); the following
    ``reset`` continues the same game with one NOOP step unless the game is over (then it
    is a real reset)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action):
        obs, r, te, tr, info = self.env.step(action)
        self.game_over = bool(te or tr)
        lives = _lives(self)
        if 0 < lives < self.lives:
            te = True
        self.lives = lives
        return obs, r, te, tr, info

    def reset(self, **kwargs):
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, te, tr, info = self.env.step(0)
            if te or tr:  # the game ended on that NOOP
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = _lives(self)
        return obs, info


class FireAtLifeStart(gym.Wrapper):
    """For games whose action meanings include FIRE: FIRE is pressed for the agent at the
    start of each life — one FIRE step inside ``reset``, and, when a life is lost within an
    episode (full games), the agent's next action is replaced by FIRE."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.fire = env.unwrapped.get_action_meanings().index("FIRE")
        self.lives = 0
        self._fire_next = False

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        obs, _, te, tr, info = self.env.step(self.fire)
        if te or tr:
            obs, info = self.env.reset(**kwargs)
        self.lives, self._fire_next = _lives(self), False
        return obs, info

    def step(self, action):
        if self._fire_next:
            action, self._fire_next = self.fire, False
        obs, r, te, tr, info = self.env.step(action)
        lives = _lives(self)
        if not (te or tr) and 0 < lives < self.lives:
            self._fire_next = True
        self.lives = lives
        return obs, r, te, tr, info


class Resize84(gym.ObservationWrapper):
    """A greyscale frame resized to ``size``×``size`` (area interpolation)."""

    def __init__(self, env: gym.Env, size: int = SIZE):
        super().__init__(env)
        import cv2

        self._cv2 = cv2
        self.size = size
        self.observation_space = gym.spaces.Box(0, 255, (size, size), np.uint8)

    def observation(self, obs):
        return self._cv2.resize(obs, (self.size, self.size),
                                interpolation=self._cv2.INTER_AREA)


class ClipRewardSign(gym.RewardWrapper):
    """(Training only.) The sign of each reward: −1, 0 or 1."""

    def reward(self, reward):
        return float(np.sign(reward))


class FrameStack(gym.Wrapper):
    """The last ``n`` frames, oldest first: ``(n, H, W)`` uint8. A reset fills the stack
    with the first frame."""

    def __init__(self, env: gym.Env, n: int = STACK):
        super().__init__(env)
        h, w = env.observation_space.shape
        self.frames = np.zeros((n, h, w), np.uint8)
        self.observation_space = gym.spaces.Box(0, 255, (n, h, w), np.uint8)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.frames[:] = obs
        return self.frames.copy(), info

    def step(self, action):
        obs, r, te, tr, info = self.env.step(action)
        self.frames[:-1] = self.frames[1:]
        self.frames[-1] = obs
        return self.frames.copy(), r, te, tr, info


def check_kwargs(env_kwargs: dict[str, Any], where: str = "env_kwargs") -> None:
    """Refuse the ALE arguments the preprocessing sets itself."""
    for k in _OWN_KWARGS:
        if k in env_kwargs:
            raise UsageError(f"{where}: {k!r} is set by ppokit's Atari preprocessing "
                             f"(frameskip 1 in the emulator, {SKIP} frames per agent step, "
                             "greyscale), not an environment argument")


def make_env(gid: str, *, training: bool = True, render_mode: str | None = None,
             **env_kwargs: Any) -> gym.Env:
    """One preprocessed ALE game (module documentation); ``training=False``: whole games
    and unclipped rewards (evaluation)."""
    check_kwargs(env_kwargs)
    register()  # (again in an async worker started by spawn, which has its own registry)
    env = gym.make(gid, frameskip=1, obs_type="grayscale", render_mode=render_mode,
                   disable_env_checker=True, **env_kwargs)
    env = NoopReset(env)
    env = MaxAndSkip(env)
    env = GameScore(env)
    if training:
        env = EpisodicLife(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireAtLifeStart(env)
    env = Resize84(env)
    if training:
        env = ClipRewardSign(env)
    return FrameStack(env)


def env_fns(gid: str, num_envs: int, *, training: bool,
            env_kwargs: dict[str, Any] | None = None) -> list[Callable[[], gym.Env]]:
    """``num_envs`` picklable constructors of :func:`make_env` (for sync or async vector
    envs)."""
    kw = dict(env_kwargs or {})
    check_kwargs(kw)
    return [functools.partial(make_env, gid, training=training, **kw)] * num_envs
