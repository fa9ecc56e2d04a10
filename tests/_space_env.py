"""An environment over any action space that refuses an action its space does not contain
(tests of ppokit.policies.actions: training, predict, evaluation, Ray actors), and a
hypothesis strategy of the action spaces ppokit accepts (shapes, starts, dtypes)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from hypothesis import strategies as st


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


@st.composite
def shapes(draw, scalar: bool = False):
    dims = draw(st.integers(0 if scalar else 1, 2))
    return tuple(draw(st.lists(st.integers(1, 3), min_size=dims, max_size=dims)))


@st.composite
def action_spaces(draw):
    kind = draw(st.sampled_from(["discrete", "multidiscrete", "multibinary", "box"]))
    if kind == "discrete":
        return spaces.Discrete(draw(st.integers(1, 5)), start=draw(st.integers(-5, 5)))
    if kind == "multidiscrete":
        shape = draw(shapes())
        n = int(np.prod(shape))
        nvec = np.array(draw(st.lists(st.integers(1, 4), min_size=n, max_size=n)))
        start = np.array(draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n)))
        return spaces.MultiDiscrete(nvec.reshape(shape), start=start.reshape(shape))
    if kind == "multibinary":
        shape = draw(shapes())
        return spaces.MultiBinary(shape[0] if len(shape) == 1 and draw(st.booleans())
                                  else shape)
    shape = draw(shapes(scalar=True))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    n = int(np.prod(shape))
    low = np.array(draw(st.lists(st.floats(-3, 0.5), min_size=n, max_size=n)))
    width = np.array(draw(st.lists(st.floats(0, 2), min_size=n, max_size=n)))
    return spaces.Box(low.reshape(shape).astype(dtype), (low + width).reshape(shape).astype(dtype),
                      dtype=dtype)
