"""Small tasks of ppokit's learning benchmark whose answer is known, for the policy types
the classic suites do not cover: a small image, an image with a flag beside it (a Dict
observation), and a MultiBinary action. Registered in ppokit's Gymnasium namespace when
``ppokit.envs`` is imported:

* ``ppokit/ImageSide-v0``: a 32×32 RGB image (uint8, ``H×W×C``) of dim noise with a
  bright 4×4 block somewhere in its left or right half, in one of the three colour planes;
  the action (Discrete 2) names the side. Eight choices an episode, each worth 1/8: a
  policy that reads the image scores 1.0, one that guesses 0.5. 32 pixels is below the
  Nature CNN's 36, so ``policy=auto`` gives it the small-image CNN.
* ``ppokit/ImageFlag-v0``: a Dict of the same image (``"image"``) and a flag
  (``"flag"``, Discrete 2); the right action is the side when the flag is 0 and the other
  side when it is 1. The image alone scores 0.5, as does the flag alone: only a policy
  that reads both reaches 1.0.
* ``ppokit/CopyBits-v0``: observe four target bits (as ±1), act with MultiBinary(4); the
  reward is the share of bits copied, eight steps: random 0.5, perfect 1.0 (per step
  1/8 of the share).

Each draws from the environment's own generator only, so seeding and exact resume work as
for Gymnasium's tasks.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["ImageSide", "ImageFlag", "CopyBits", "SIGHT_IDS", "register_sight"]

SIGHT_IDS = ("ppokit/ImageSide-v0", "ppokit/ImageFlag-v0", "ppokit/CopyBits-v0")
_CHOICES = 8  # decisions an episode


class ImageSide(gym.Env):
    """A bright block on the left or right of a ``size``×``size`` RGB image; name the side."""

    metadata = {"render_modes": []}

    def __init__(self, size: int = 32, block: int = 4):
        if size < 8 or not 1 <= block <= size // 2:
            raise ValueError(f"size, block: expected size >= 8 and 1 <= block <= size/2, got "
                             f"{size}, {block}")
        self.size, self.block = size, block
        self.observation_space = spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = spaces.Discrete(2)

    def _image(self) -> np.ndarray:
        n, b = self.size, self.block
        img = self.np_random.integers(0, 48, (n, n, 3), dtype=np.uint8)  # dim noise
        half = n // 2
        row = int(self.np_random.integers(0, n - b + 1))
        col = int(self.np_random.integers(0, half - b + 1)) + half * self.side
        img[row:row + b, col:col + b, int(self.np_random.integers(3))] = 255
        return img

    def _draw(self) -> None:
        self.side = int(self.np_random.integers(2))

    def _obs(self):
        return self._image()

    def _answer(self) -> int:
        return self.side

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self._answer()) / _CHOICES
        self.t += 1
        self._draw()
        return self._obs(), reward, self.t >= _CHOICES, False, {}


class ImageFlag(ImageSide):
    """The image of :class:`ImageSide` and a flag that swaps the right answer."""

    def __init__(self, size: int = 32, block: int = 4):
        super().__init__(size, block)
        self.observation_space = spaces.Dict({
            "image": spaces.Box(0, 255, (size, size, 3), np.uint8),
            "flag": spaces.Discrete(2),
        })

    def _draw(self) -> None:
        super()._draw()
        self.flag = int(self.np_random.integers(2))

    def _obs(self):
        return {"image": self._image(), "flag": self.flag}

    def _answer(self) -> int:
        return self.side ^ self.flag


class CopyBits(gym.Env):
    """Copy four observed bits with a MultiBinary(4) action."""

    metadata = {"render_modes": []}

    def __init__(self, bits: int = 4):
        self.bits = bits
        self.observation_space = spaces.Box(-1.0, 1.0, (bits,), np.float32)
        self.action_space = spaces.MultiBinary(bits)

    def _draw(self) -> None:
        self.target = self.np_random.integers(0, 2, self.bits)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return (2.0 * self.target - 1.0).astype(np.float32), {}

    def step(self, action):
        reward = float(np.mean(np.asarray(action).reshape(-1) == self.target)) / _CHOICES
        self.t += 1
        self._draw()
        return (2.0 * self.target - 1.0).astype(np.float32), reward, self.t >= _CHOICES, \
            False, {}


def register_sight() -> None:
    """Register :data:`SIGHT_IDS` with Gymnasium (once)."""
    if SIGHT_IDS[0] in gym.registry:
        return
    for env_id, cls in zip(SIGHT_IDS, ("ImageSide", "ImageFlag", "CopyBits")):
        gym.register(env_id, entry_point=f"ppokit.envs.sight:{cls}", reward_threshold=0.95)
