"""The planted failures of ``python -m bench.diagnostics``: environments and reward
functions with one known bug each (and two healthy environments it needs), named on the
command line as ``bench._diagnostics_plants:NAME``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ppokit.llm.inputs.task import reverse_score

# ----------------------------------------------------------------------------- environments


class SolvedEarly(gym.Env):
    """Healthy: say the bit shown, 20 times; 20/20 is the maximum and a policy learns it in
    a few iterations, then sits there deterministic."""

    observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.bit = int(self.np_random.integers(2))
        return self._obs(), {}

    def _obs(self):
        o = np.zeros(2, np.float32)
        o[self.bit] = 1.0
        return o

    def step(self, action):
        r = float(int(action) == self.bit)
        self.t += 1
        self.bit = int(self.np_random.integers(2))
        return self._obs(), r, False, self.t >= 20, {}


class ActionIndependent(SolvedEarly):
    """Bug: the reward is a coin flip whatever the action (return-flat)."""

    def step(self, action):
        obs, _, term, trunc, info = super().step(action)
        return obs, float(self.np_random.integers(2)), term, trunc, info


class TimeLimitTerminated(SolvedEarly):
    """Bug: the episode's time limit reported as termination (time-limit-terminated)."""

    def step(self, action):
        obs, r, _, trunc, info = super().step(action)
        return obs, r, trunc, False, info


class HugeReward(SolvedEarly):
    """Bug: rewards on a scale of 10⁵ per step, unnormalised (reward-scale)."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, 1e5 * (r + float(self.np_random.normal())), term, trunc, info


for _name in ("SolvedEarly", "ActionIndependent", "TimeLimitTerminated", "HugeReward"):
    if f"{_name}-v0" not in gym.registry:
        gym.register(f"{_name}-v0", entry_point=f"{__name__}:{_name}")

# ----------------------------------------------------------------------------- rewards


def length_bonus(prompts, completions, **kw):
    """Bug: pays 0.1 per character on top of nothing (length-explosion)."""
    return [0.1 * len(c) for c in completions]


def bang_bonus(prompts, completions, **kw):
    """Bug: a format bonus for every '9' written, summed with the task's score: the
    format is bought, the task's own score falls (reward-hacking)."""
    return [0.3 * c.count("9") for c in completions]


def ignores_completion(prompts, completions, **kw):
    """Bug: scores the prompt, never the completion (lm-reward-constant / every group
    all-equal)."""
    return [float(len(p) % 2) for p in prompts]


def constant(prompts, completions, **kw):
    """Bug: one value for everything (lm-reward-constant)."""
    return [0.5 for _ in completions]


def never_earned(prompts, completions, **kw):
    """Bug: a target no completion reaches: every group all-equal (zero-spread-groups)."""
    return [1.0 if len(c) > 500 else 0.0 for c in completions]


def reverse(prompts, completions, **kw):
    """Healthy: the reverse task's own score."""
    return reverse_score(prompts, completions)


def calc(expression: str) -> int:
    """Bug: the agent's calculator (its name, ``calc``, is the one the warm start teaches)
    raises on every call (tool-failures)."""
    raise RuntimeError("the calculator is broken")
