"""A tiny PettingZoo ParallelEnv with two agent groups of different spaces, for
tests/test_multiagent_groups.py: ``hunter_0`` and ``hunter_1`` observe 3 numbers and have 2
actions, ``prey_0`` observes 5 and has 4; the prey terminates after ``PREY_STEPS`` steps,
the hunters are truncated after ``HUNTER_STEPS``."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

HUNTER_STEPS, PREY_STEPS = 6, 4


class TwoGroups(ParallelEnv):
    """Uniform observations; a hunter is rewarded 1 for the action ``obs[0] > 0``, the prey
    for ``argmax(obs[:4])``. ``masks``: each agent's ``info["action_mask"]`` (its own width)
    allows every action but ``hunter_1``'s action 1 at ``t == 1``. ``state()``: the three
    observations side by side (11 numbers)."""

    metadata = {"name": "two_groups_v0"}

    def __init__(self, masks: bool = False):
        self.possible_agents = ["hunter_0", "hunter_1", "prey_0"]
        self.masks = masks
        self.agents: list[str] = []
        self.rng = np.random.default_rng(0)
        self.t = 0
        self.o: dict = {}

    def observation_space(self, agent):
        return spaces.Box(-1.0, 1.0, (5,) if agent.startswith("prey") else (3,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(4 if agent.startswith("prey") else 2)

    @property
    def state_space(self):
        return spaces.Box(-1.0, 1.0, (11,), np.float32)

    def state(self):
        return np.concatenate([self.o.get(a, np.zeros(self.observation_space(a).shape,
                                                      np.float32))
                               for a in self.possible_agents])

    def _observe(self):
        self.o = {a: self.rng.uniform(-1, 1, self.observation_space(a).shape).astype(
            np.float32) for a in self.agents}
        return dict(self.o)

    def _infos(self, agents):
        if not self.masks:
            return {a: {} for a in agents}
        out = {}
        for a in agents:
            m = np.ones(self.action_space(a).n, np.int8)
            if a == "hunter_1" and self.t == 1:
                m[1] = 0
            out[a] = {"action_mask": m}
        return out

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        return self._observe(), self._infos(self.agents)

    def step(self, actions):
        self.t += 1
        rew = {}
        for a in self.agents:
            if not self.action_space(a).contains(int(actions[a])):
                raise ValueError(f"{a}: action {actions[a]} outside {self.action_space(a)}")
            o = self.o[a]
            good = int(np.argmax(o[:4])) if a.startswith("prey") else int(o[0] > 0)
            rew[a] = float(actions[a] == good)
        te = {a: a.startswith("prey") and self.t >= PREY_STEPS for a in self.agents}
        tr = {a: not a.startswith("prey") and self.t >= HUNTER_STEPS for a in self.agents}
        acting = list(self.agents)
        obs = self._observe()
        self.agents = [a for a in acting if not (te[a] or tr[a])]
        return obs, rew, te, tr, self._infos(acting)


def make_groups():
    return TwoGroups()


def make_groups_masked():
    return TwoGroups(masks=True)
