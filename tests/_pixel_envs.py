"""Small environments with image, dictionary observations and binary actions (tests)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class ImageChoice(gym.Env):
    """A 36x36 RGB image with a bright block on the left or the right half; the action
    names the side (reward 1 when right). Eight choices per episode: a random policy
    scores 4, one that reads the image 8. ``channels_first`` gives 3x36x36 images."""

    def __init__(self, channels_first: bool = False, dtype: str = "uint8"):
        shape = (3, 36, 36) if channels_first else (36, 36, 3)
        hi = 255 if dtype == "uint8" else 1.0
        self.observation_space = spaces.Box(0, hi, shape, dtype=np.dtype(dtype))
        self.action_space = spaces.Discrete(2)
        self.channels_first, self.hi = channels_first, hi

    def _obs(self):
        img = np.zeros((36, 36, 3), self.observation_space.dtype)
        cols = slice(2, 16) if self.side == 0 else slice(20, 34)
        img[10:26, cols, self.np_random.integers(3)] = self.hi
        return img.transpose(2, 0, 1) if self.channels_first else img

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.side = 0, int(self.np_random.integers(2))
        return self._obs(), {}

    def step(self, action):
        r = float(int(action) == self.side)
        self.t += 1
        self.side = int(self.np_random.integers(2))
        return self._obs(), r, self.t >= 8, False, {}


class DictGoal(gym.Env):
    """Dict observations: a goal (Discrete 3), a noise vector and a tiny image; the action
    must equal the goal. Eight steps: random 8/3, perfect 8."""

    def __init__(self):
        self.observation_space = spaces.Dict({
            "goal": spaces.Discrete(3),
            "noise": spaces.Box(-1, 1, (3,), np.float32),
            "img": spaces.Box(0, 255, (36, 36, 1), np.uint8),
        })
        self.action_space = spaces.Discrete(3)

    def _obs(self):
        return {"goal": self.goal, "noise": self.np_random.uniform(-1, 1, 3).astype(np.float32),
                "img": self.np_random.integers(0, 255, (36, 36, 1), dtype=np.uint8)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.goal = 0, int(self.np_random.integers(3))
        return self._obs(), {}

    def step(self, action):
        r = float(int(action) == self.goal)
        self.t += 1
        self.goal = int(self.np_random.integers(3))
        return self._obs(), r, self.t >= 8, False, {}


class CopyBits(gym.Env):
    """MultiBinary(4) actions: copy the observed target bits (observed as ±1). Reward: the
    share of bits right; eight steps: random 4, perfect 8."""

    def __init__(self):
        self.observation_space = spaces.Box(-1, 1, (4,), np.float32)
        self.action_space = spaces.MultiBinary(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.bits = 0, self.np_random.integers(0, 2, 4)
        return (2.0 * self.bits - 1).astype(np.float32), {}

    def step(self, action):
        r = float(np.mean(np.asarray(action) == self.bits))
        self.t += 1
        self.bits = self.np_random.integers(0, 2, 4)
        return (2.0 * self.bits - 1).astype(np.float32), r, self.t >= 8, False, {}
