"""Small environments with image, dictionary observations and binary actions (tests)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class ImageChoice(gym.Env):
    """A 36x36 RGB image (``size``) with a bright block on the left or the right half; the
    action names the side (reward 1 when right). Eight choices per episode: a random
    policy scores 4, one that reads the image 8. ``channels_first`` gives 3x36x36 images;
    ``dtype`` bool gives object planes (as MinAtar's)."""

    def __init__(self, channels_first: bool = False, dtype: str = "uint8", size: int = 36):
        shape = (3, size, size) if channels_first else (size, size, 3)
        hi = {"uint8": 255, "bool": 1}.get(dtype, 1.0)
        self.observation_space = spaces.Box(0, hi, shape, dtype=np.dtype(dtype))
        self.action_space = spaces.Discrete(2)
        self.channels_first, self.hi, self.size = channels_first, hi, size

    def _obs(self):
        n = self.size
        img = np.zeros((n, n, 3), self.observation_space.dtype)
        cut = [round(f * n / 36) for f in (10, 26, 2, 16, 20, 34)]
        cols = slice(cut[2], cut[3]) if self.side == 0 else slice(cut[4], cut[5])
        img[cut[0]:cut[1], cols, self.np_random.integers(3)] = self.hi
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
    """Dict observations: a goal (Discrete 3), a noise vector and a tiny image
    (``img_size`` square); the action must equal the goal. Eight steps: random 8/3,
    perfect 8."""

    def __init__(self, img_size: int = 36):
        self.img_size = img_size
        self.observation_space = spaces.Dict({
            "goal": spaces.Discrete(3),
            "noise": spaces.Box(-1, 1, (3,), np.float32),
            "img": spaces.Box(0, 255, (img_size, img_size, 1), np.uint8),
        })
        self.action_space = spaces.Discrete(3)

    def _obs(self):
        n = self.img_size
        return {"goal": self.goal, "noise": self.np_random.uniform(-1, 1, 3).astype(np.float32),
                "img": self.np_random.integers(0, 255, (n, n, 1), dtype=np.uint8)}

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
