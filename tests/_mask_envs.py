"""Environments with action masks for tests/test_action_masks.py: a MultiDiscrete one whose
masks change per state, and variants that break the mask in one way each."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class MultiPick(gym.Env):
    """MultiDiscrete([5, 3]) actions; each step allows 2 of the 5 and 1 or 2 of the 3 (drawn
    from the env's generator, given by ``action_masks()``). A forbidden action raises;
    reward 1 when both entries are the largest allowed. Truncated after 12 steps."""

    def __init__(self):
        self.action_space = spaces.MultiDiscrete([5, 3])
        self.observation_space = spaces.Box(0.0, 1.0, (8,), np.float32)
        self.mask = np.zeros(8, bool)
        self.t = 0

    def _draw(self):
        rng = self.np_random
        self.mask = np.zeros(8, bool)
        self.mask[rng.choice(5, 2, replace=False)] = True
        self.mask[5 + rng.choice(3, int(rng.integers(1, 3)), replace=False)] = True

    def action_masks(self):
        return self.mask.copy()

    def _obs(self):
        return self.mask.astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return self._obs(), {}

    def step(self, action):
        a, b = (int(x) for x in np.asarray(action).reshape(-1))
        if not (self.mask[a] and self.mask[5 + b]):
            raise ValueError(f"action {a, b} is not allowed")
        best = (np.flatnonzero(self.mask[:5]).max(), np.flatnonzero(self.mask[5:]).max())
        r = float((a, b) == best)
        self.t += 1
        self._draw()
        return self._obs(), r, False, self.t >= 12, {}


class EmptyMask(MultiPick):
    """Its mask allows nothing in the second entry from the third step on."""

    def action_masks(self):
        m = self.mask.copy()
        if self.t >= 2:
            m[5:] = False
        return m


class ShortMask(MultiPick):
    """Its mask has 7 entries instead of 5 + 3."""

    def action_masks(self):
        return self.mask[:7].copy()


class LyingMask(MultiPick):
    """Its mask allows every action, but the env refuses the forbidden ones."""

    def action_masks(self):
        return np.ones(8, bool)


class DiscreteInfoMask(gym.Env):
    """Discrete(6) with ``start=1``; ``info["action_mask"]`` allows the actions whose index
    has the parity of the step; the observation is the step's parity. Episodes of 6 to 11
    steps (drawn at reset), reward 1 a step; a forbidden action raises."""

    def __init__(self):
        self.action_space = spaces.Discrete(6, start=1)
        self.observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
        self.t = 0

    def _out(self):
        m = (np.arange(6) % 2) == (self.t % 2)
        return np.array([self.t % 2], np.float32), {"action_mask": m}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.limit = 6 + int(self.np_random.integers(6))
        return self._out()

    def step(self, action):
        if (int(action) - 1) % 2 != self.t % 2:
            raise ValueError(f"action {action} is not allowed")
        self.t += 1
        obs, info = self._out()
        return obs, 1.0, False, self.t >= self.limit, info
