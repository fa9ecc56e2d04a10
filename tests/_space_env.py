"""An environment over any action space that refuses an action its space does not contain
(tests of ppokit.policies.actions: training, predict, evaluation, Ray actors)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class SpaceEnv(gym.Env):
    """Observations: a Box of 3 floats. Actions: ``space``, checked with
    ``space.contains`` at every step (a ``ValueError`` naming the action otherwise).
    Reward: minus the absolute value of the action's first entry; episodes last 6
    steps."""

    def __init__(self, space: gym.Space):
        self.action_space = space
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} ({type(action).__name__}, "
                             f"{getattr(action, 'dtype', None)}) is not in {self.action_space}")
        self.t += 1
        first = float(np.ravel(np.asarray(action, np.float64))[0])
        obs = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        return obs, -abs(first), False, self.t >= 6, {}


def factory(space: gym.Space):
    """``() -> SpaceEnv(space)``."""
    def make():
        return SpaceEnv(space)
    return make
