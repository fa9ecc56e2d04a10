"""Environments for ``ppokit check --env``: clean ones (a vector walk, a Dict, an image)
that every check must pass, and variants of the walk with one planted bug each."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Walk(gym.Env):
    """A clean env: a 3-D random walk pushed by the action (Discrete 2), reward −|x₀|·0.1
    + 1, terminated when |x₀| leaves 3 (a state of the task: terminal observations lie
    beyond every ordinary one), truncated after ``limit`` steps. After an episode ended,
    ``step`` keeps reporting the end until ``reset``."""

    limit = 120

    def __init__(self):
        self.observation_space = spaces.Box(-10, 10, (3,), np.float32)
        self.action_space = self._action_space()

    def _action_space(self) -> spaces.Space:
        return spaces.Discrete(2)

    def _push(self, action) -> float:
        return 0.15 * (2 * int(action) - 1)

    def _start(self) -> np.ndarray:
        return self.np_random.uniform(-0.5, 0.5, 3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.x, self.ended = 0, self._start(), None
        return self._obs(), {}

    def _obs(self):
        return np.clip(self.x, -10, 10).astype(np.float32)

    def _ends(self) -> tuple[bool, bool]:
        return bool(abs(self.x[0]) > 3), self.t >= self.limit

    def _reward(self) -> float:
        return 1.0 - 0.1 * abs(float(self.x[0]))

    def step(self, action):
        if self.ended is not None:
            return self._obs(), 0.0, *self.ended, {}
        self.t += 1
        self.x = self.x + self.np_random.normal(0, 0.3, 3)
        self.x[0] += self._push(action)
        term, trunc = self._ends()
        if term or trunc:
            self.ended = (term, trunc)
        return self._obs(), self._reward(), term, trunc, {}


class CleanDict(gym.Env):
    """Dict observations (a 2-D position in [−1, 1]², a Discrete goal, a small image),
    Discrete(4) moves; terminated when the position reaches the goal's corner region,
    truncated after 60 steps; the end is reported again until ``reset``."""

    CORNERS = np.array([[1, 1], [1, -1], [-1, 1], [-1, -1]], dtype=np.float64)

    def __init__(self):
        self.observation_space = spaces.Dict({
            "pos": spaces.Box(-1, 1, (2,), np.float32),
            "goal": spaces.Discrete(4),
            "img": spaces.Box(0, 255, (36, 36, 1), np.uint8)})
        self.action_space = spaces.Discrete(4)

    def _obs(self):
        img = np.zeros((36, 36, 1), np.uint8)
        r, c = ((self.pos + 1) * 17.5).astype(int)
        img[r, c, 0] = 255
        return {"pos": self.pos.astype(np.float32), "goal": self.goal, "img": img}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.goal, self.ended = 0, int(self.np_random.integers(4)), None
        self.pos = self.np_random.uniform(-0.3, 0.3, 2)
        return self._obs(), {}

    def step(self, action):
        if self.ended is not None:
            return self._obs(), 0.0, *self.ended, {}
        self.t += 1
        move = self.CORNERS[int(action)] * 0.15 + self.np_random.normal(0, 0.05, 2)
        self.pos = np.clip(self.pos + move, -1, 1)
        term = bool(np.all(np.abs(self.pos - self.CORNERS[self.goal]) < 0.1))
        if term or self.t >= 60:
            self.ended = (term, self.t >= 60)
        return self._obs(), float(term) - 0.01, term, self.t >= 60, {}


class CleanImage(gym.Env):
    """84x84x3 uint8 frames of a ball falling (1–3 rows a step) towards a paddle
    (Discrete 3: left, stay, right); terminated when the ball passes the paddle,
    truncated after 200 steps."""

    def __init__(self):
        self.observation_space = spaces.Box(0, 255, (84, 84, 3), np.uint8)
        self.action_space = spaces.Discrete(3)

    def _obs(self):
        img = np.zeros((84, 84, 3), np.uint8)
        img[int(self.ball[0]), int(self.ball[1])] = 255
        img[80, max(0, self.paddle - 6):self.paddle + 6, 1] = 255
        return img

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.paddle = 0, 42
        self._serve()
        return self._obs(), {}

    def _serve(self):
        self.ball = np.array([0.0, float(self.np_random.integers(4, 80))])
        self.speed = float(self.np_random.integers(1, 4))

    def step(self, action):
        self.t += 1
        self.paddle = int(np.clip(self.paddle + 3 * (int(action) - 1), 6, 78))
        self.ball[0] += self.speed
        reward, term = 0.0, False
        if self.ball[0] >= 80:
            if abs(self.ball[1] - self.paddle) <= 6:
                reward = 1.0
                self._serve()
            else:
                term = True
        self.ball[0] = min(self.ball[0], 83)
        return self._obs(), reward, term, self.t >= 200, {}


# ---------------------------------------------------------------------------- planted bugs

class TimeLimitAsTermination(Walk):
    """Bug: the time limit is reported as terminated=True (and nothing else ends it)."""

    def _ends(self):
        return self.t >= 50, False


class CrashOrTimeLimit(Walk):
    """Bug: ``terminated = crashed or t >= 80`` — a crash and a time limit alike."""

    def _ends(self):
        return bool(abs(self.x[0]) > 3) or self.t >= 80, False


class HiddenTimer(Walk):
    """Bug: episodes end at a random hidden time (20–80 steps) as terminated=True; a
    restoring force keeps the walk near 0, so terminal observations look like any
    other."""

    def reset(self, *, seed=None, options=None):
        out = super().reset(seed=seed, options=options)
        self.deadline = int(self.np_random.integers(20, 80))
        return out

    def step(self, action):
        if self.ended is None:
            self.x = 0.9 * self.x
        return super().step(action)

    def _ends(self):
        return self.t >= self.deadline, False


class ObsOutOfBounds(Walk):
    """Bug: declares observations in [−1, 1]³, but the walk goes past 1."""

    def __init__(self):
        super().__init__()
        self.observation_space = spaces.Box(-1, 1, (3,), np.float32)


class NaNAfterRareEvent(Walk):
    """Bug: once in a while (probability 0.002 a step) a NaN comes out of the physics."""

    def _obs(self):
        o = super()._obs()
        if self.np_random.random() < 0.002:
            o[1] = np.nan
        return o


class InfiniteReward(Walk):
    """Bug: a division by a distance that can be 0 — an infinite reward at the centre."""

    def _reward(self):
        d = round(abs(float(self.x[0])), 1)
        return 1.0 / d if d else float("inf")


class LargeScales(Walk):
    """Bug (of scale): positions in centimetres ×100, rewards in the tens of thousands."""

    def __init__(self):
        super().__init__()
        self.observation_space = spaces.Box(-1e5, 1e5, (3,), np.float32)

    def _obs(self):
        return (np.clip(self.x, -10, 10) * 1e4).astype(np.float32)

    def _reward(self):
        return 1e4 * super()._reward()


class UnseededStart(Walk):
    """Bug: the start state comes from numpy's global generator, not self.np_random."""

    def _start(self):
        return np.random.uniform(-0.5, 0.5, 3)  # noqa: NPY002 - the planted bug


class IgnoresSeed(Walk):
    """Bug: a fixed start and a generator re-seeded with 7 at every reset: the seed
    changes nothing."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.np_random = np.random.default_rng(7)   # overrides the seeded generator
        self.x = np.zeros(3)
        return self._obs(), {}


class OptionsChangeStart(Walk):
    """Bug: ``if options is not None`` — an empty dict takes the custom-start branch."""

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        if options is not None:
            self.x = np.asarray(options.get("start", [2.0, 2.0, 2.0]), dtype=np.float64)
            obs = self._obs()
        return obs, info


class EpisodeInInfo(Walk):
    """Bug: the env writes its own ``info["episode"]``, the key vector wrappers fill."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, r, term, trunc, {"episode": {"r": r}}


class UnpicklableInfo(Walk):
    """Bug: a callback in ``info``: async vector envs cannot send it between processes."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, r, term, trunc, {"log": lambda: self.t}


class ContinuousWalk(Walk):
    """The walk with a Box(−1, 1) action (clean)."""

    low, high = -1.0, 1.0

    def _action_space(self):
        return spaces.Box(self.low, self.high, (1,), np.float32)

    def _push(self, action):
        a = float(np.asarray(action).ravel()[0])
        return 0.15 * (a - (self.low + self.high) / 2) / ((self.high - self.low) / 2)


class HugeActions(ContinuousWalk):
    """Bug: actions declared in [−10⁶, 10⁶]."""

    low, high = -1e6, 1e6


class OffsetActions(ContinuousWalk):
    """Bug: actions in [100, 200] (a thrust in newtons): 0 is far outside."""

    low, high = 100.0, 200.0


class WideActions(ContinuousWalk):
    """Actions in [−50, 50]: an initial N(0, 1) explores 4 % of them."""

    low, high = -50.0, 50.0


class NarrowActions(ContinuousWalk):
    """Actions in [−0.01, 0.01]: nearly every N(0, 1) draw is clipped."""

    low, high = -0.01, 0.01


class UnboundedActions(ContinuousWalk):
    """Bug: an unbounded action space."""

    low, high = -np.inf, np.inf

    def _push(self, action):
        return 0.15 * float(np.clip(np.asarray(action).ravel()[0], -1, 1))


class GoesOnAfterEnd(Walk):
    """Bug: ``step`` after the end quietly starts a new episode inside the env."""

    def step(self, action):
        if self.ended is not None:
            self.t, self.x, self.ended = 0, self._start(), None
        return super().step(action)


class SlowStep(Walk):
    """A step that takes 20 ms (a heavy simulator)."""

    def step(self, action):
        time.sleep(0.02)
        return super().step(action)


class RaisesRarely(Walk):
    """Bug: an index error in a rare state (|x₁| > 1.5)."""

    def step(self, action):
        out = super().step(action)
        if abs(self.x[1]) > 1.5:
            raise IndexError("list index out of range")
        return out


class OldApiStep(Walk):
    """Bug: gym < 0.26's step, ``(obs, reward, done, info)``."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, r, term or trunc, info
