"""Agent groups of a PettingZoo environment (``agent_groups``, docs/multiagent.md): which
agents share a policy, and the rows' common observation and action spaces when the groups'
spaces differ.

``agent_groups`` names how agents are grouped:

* ``shared`` (the default): no groups, one policy for all agents (they need the same
  spaces; :class:`ppokit.envs.multiagent.AgentRows` handles it alone);
* ``prefix``: PettingZoo's naming convention, the agent's name up to its last ``_``
  (``adversary_0``, ``adversary_1`` → ``adversary``; ``agent_0`` → ``agent``; a name
  without ``_`` is its own group);
* ``agent``: every agent its own group.

Groups are numbered in the order their first agent comes in ``possible_agents``. The
agents of one group need the same observation and action spaces; groups may differ:

* observations (flat ``Box``\\ es, read flattened) are padded with zeros to the widest
  group's size ``D``; a row's observation is then ``[padded observation (D), agent one-hot
  (with agent_id), group index]`` — the group index, a float, last. That entry tells the
  grouped policy (:mod:`ppokit.policies.grouped`) which weights the row goes through, at
  every place the policy reads an observation (acting, the rollout and the update's
  minibatches, evaluation), and its bound (``G - 1``) records the number of groups in the
  observation space a checkpoint keeps;
* ``Discrete`` actions of different counts become ``Discrete(n_max)``; each row's action
  mask (``info["action_mask"]``, :mod:`ppokit.envs.masks`) allows only its own group's
  ``n_g`` actions (and, within them, what the agent's own mask allows), so the padded
  actions are never sampled and have probability exactly 0. Other action spaces must be
  the same for every group.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from ppokit.errors import UsageError

__all__ = ["GROUP_MODES", "AgentGroups", "group_name"]

GROUP_MODES = ("shared", "prefix", "agent")


def group_name(agent: Any, mode: str) -> str:
    """The group of the agent named ``agent`` under ``mode`` (module doc)."""
    name = str(agent)
    if mode == "prefix" and "_" in name:
        return name.rsplit("_", 1)[0]
    return name


def _same(a, b) -> bool:
    return type(a) is type(b) and a.shape == b.shape and getattr(a, "n", None) == getattr(
        b, "n", None) and np.array_equal(getattr(a, "nvec", 0), getattr(b, "nvec", 0))


class AgentGroups:
    """The groups of ``agents`` (``possible_agents``) of ``env`` under ``mode`` and the rows'
    common spaces (module doc); what does not fit is refused naming ``agent_groups``."""

    def __init__(self, env: Any, agents: list, mode: str, label: str = "env"):
        if mode not in GROUP_MODES[1:]:
            raise UsageError(f"agent_groups: expected one of {', '.join(GROUP_MODES)}, got "
                             f"{mode!r}")
        self.mode, self.label = mode, label
        self.names: list[str] = []
        self.index = np.zeros(len(agents), np.int64)  # each agent's group
        self.obs_spaces: list[spaces.Box] = []
        self.act_spaces: list[spaces.Space] = []
        for i, a in enumerate(agents):
            g = group_name(a, mode)
            obs, act = env.observation_space(a), env.action_space(a)
            if g not in self.names:
                self._check_obs(g, obs)
                self.names.append(g)
                self.obs_spaces.append(obs)
                self.act_spaces.append(act)
            j = self.index[i] = self.names.index(g)
            if not (_same(obs, self.obs_spaces[j]) and _same(act, self.act_spaces[j])):
                raise UsageError(f"agent_groups: agent {a!r} of group {g!r} has other "
                                 "observation or action spaces than the group's first agent; "
                                 "the agents of a group share a policy and need the same")
        self.sizes = [int(np.prod(sp.shape)) for sp in self.obs_spaces]
        self.width = max(self.sizes)
        self.action_space, self.n_actions = self._action_space()

    def _check_obs(self, g: str, obs) -> None:
        if not isinstance(obs, spaces.Box):
            raise UsageError(f"agent_groups: per-group policies read flat Box observations; "
                             f"group {g!r} of {self.label} observes {obs}")

    def _action_space(self) -> tuple[spaces.Space, list[int] | None]:
        first = self.act_spaces[0]
        if all(_same(sp, first) for sp in self.act_spaces):
            if isinstance(first, spaces.Box):
                raise UsageError("agent_groups: per-group policies take Discrete, "
                                 "MultiDiscrete or MultiBinary actions, not Box (continuous) "
                                 f"ones ({self.label}'s are {first})")
            return first, None
        if all(isinstance(sp, spaces.Discrete) and int(sp.start) == 0
               for sp in self.act_spaces):
            n = [int(sp.n) for sp in self.act_spaces]
            return spaces.Discrete(max(n)), n
        raise UsageError("agent_groups: the groups' action spaces differ ("
                         + ", ".join(f"{g}: {sp}" for g, sp in zip(self.names, self.act_spaces))
                         + "); groups may differ only in their number of Discrete actions")

    # ---------------------------------------------------------------- rows
    def observation_space(self, ids: int) -> spaces.Box:
        """The rows' observation space: ``D`` padded entries, ``ids`` agent one-hot
        entries, the group index in ``[0, G - 1]``."""
        lo = np.concatenate([np.full(self.width, -np.inf, np.float32),
                             np.zeros(ids + 1, np.float32)])
        hi = np.concatenate([np.full(self.width, np.inf, np.float32),
                             np.ones(ids, np.float32),
                             np.full(1, len(self.names) - 1, np.float32)])
        return spaces.Box(lo, hi, dtype=np.float32)

    def row(self, obs, i: int, one_hot: np.ndarray | None) -> np.ndarray:
        """Agent ``i``'s observation as its row (module doc)."""
        flat = np.asarray(obs, np.float32).reshape(-1)
        out = np.zeros(self.width + (0 if one_hot is None else one_hot.size) + 1, np.float32)
        out[:flat.size] = flat
        if one_hot is not None:
            out[self.width:-1] = one_hot
        out[-1] = self.index[i]
        return out

    def base_masks(self) -> np.ndarray | None:
        """``[k, n_max]``: each agent's group's actions allowed, the padded ones not;
        ``None`` when every group has the same actions."""
        if self.n_actions is None:
            return None
        n = np.asarray(self.n_actions)[self.index]
        return np.arange(max(self.n_actions))[None, :] < n[:, None]

    def to_data(self) -> list[dict]:
        """Each group's name, agents' indices and spaces, as JSON values (the checkpoint
        records them)."""
        from ppokit.io.spaces import space_to_data

        return [{"name": g, "agents": [int(i) for i in np.flatnonzero(self.index == j)],
                 "observation_space": space_to_data(self.obs_spaces[j]),
                 "action_space": space_to_data(self.act_spaces[j])}
                for j, g in enumerate(self.names)]
