"""A tiny PettingZoo ParallelEnv for tests/test_multiagent.py and the resume test: two
agents; ``b`` terminates after ``B_STEPS`` steps, ``a`` is truncated after ``A_STEPS``."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

A_STEPS, B_STEPS = 4, 2


class Pair(ParallelEnv):
    """Observation ``[t / 4, own index, noise]``; reward 1 for agent ``a`` choosing action
    1 and for ``b`` choosing 0 (``b``'s reward 10 on its last step). ``masks``: each
    agent's ``info["action_mask"]`` allows both actions, except ``b`` at ``t == 1``
    (only action 0)."""

    metadata = {"name": "pair_v0"}

    def __init__(self, masks: bool = False):
        self.possible_agents = ["a", "b"]
        self.masks = masks
        self.observation_spaces = {a: spaces.Box(-1.0, 2.0, (3,), np.float32)
                                   for a in self.possible_agents}
        self.action_spaces = {a: spaces.Discrete(2) for a in self.possible_agents}
        self.agents: list[str] = []
        self.t = 0
        self.rng = np.random.default_rng(0)

    def observation_space(self, agent):
        return self.observation_spaces[agent]

    def action_space(self, agent):
        return self.action_spaces[agent]

    def _obs(self):
        return {a: np.array([self.t / 4, self.possible_agents.index(a),
                             self.rng.uniform(-1, 1)], np.float32) for a in self.agents}

    def _infos(self):
        if not self.masks:
            return {a: {} for a in self.agents}
        return {a: {"action_mask": np.array([1, int(not (a == "b" and self.t == 1))],
                                            np.int8)} for a in self.agents}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t = 0
        return self._obs(), self._infos()

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.t += 1
        rew = {"a": float(actions["a"] == 1)} if "a" in self.agents else {}
        if "b" in self.agents:
            rew["b"] = float(actions["b"] == 0) * (10.0 if self.t == B_STEPS else 1.0)
        te = {a: a == "b" and self.t >= B_STEPS for a in self.agents}
        tr = {a: a == "a" and self.t >= A_STEPS for a in self.agents}
        obs, infos = self._obs(), self._infos()
        self.agents = [a for a in self.agents if not (te[a] or tr[a])]
        return obs, rew, te, tr, infos


def make_pair():
    return Pair()


def make_pair_masked():
    return Pair(masks=True)


class StatePair(Pair):
    """:class:`Pair` with a global state (PettingZoo's ``state_space`` / ``state()``):
    ``[t / 4, a playing, b playing, the last observation's noise of a, of b]``."""

    metadata = {"name": "state_pair_v0"}
    state_space = spaces.Box(-1.0, 2.0, (5,), np.float32)

    def _obs(self):
        obs = super()._obs()
        self.noise = [float(obs[a][2]) if a in obs else 0.0 for a in self.possible_agents]
        return obs

    def state(self):
        live = [float(a in self.agents) for a in self.possible_agents]
        return np.array([self.t / 4, *live, *self.noise], np.float32)


def make_state_pair_masked():
    return StatePair(masks=True)
