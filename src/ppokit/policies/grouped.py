"""One policy per agent group (``agent_groups``, docs/multiagent.md): an MLP actor-critic
whose every layer holds one weight block per group.

A row's observation ends with its group index (a float in ``0 .. G-1``: the last entry of
the flat observation :class:`ppokit.envs.agent_groups.AgentGroups` builds, and of the
global state a centralised critic reads). Each layer computes every group's product and
keeps, for each row, its own group's (:class:`GroupedLinear`), so a row's actions, values
and gradients come from its group's weights alone: the weights of group ``g`` get exactly
zero gradient from the rows of any other group, and the zero padding that brings every
group's observation to one width reaches only zero inputs of its own group's weights.

The number of groups is read from the observation space (the group entry's upper bound is
``G - 1``), which the checkpoint records: the policy rebuilds without the environment.
The actions of a group with fewer Discrete actions than the widest are padded and masked
out by the environment's action masks (``ppokit.envs.agent_groups``), so they have
probability exactly 0.

Everything else is :class:`ppokit.policies.MLPActorCritic`'s (the heads, sampling,
masking). The NumPy sampler and the fused minibatch step take plain linear layers only, so
a grouped policy acts through ``policy.act`` and trains in the eager step.
"""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from .mlp import ACTIVATIONS, MLPActorCritic, mlp_layers

Tensor = torch.Tensor

__all__ = ["GroupedLinear", "GroupedMLP", "GroupedActorCritic", "groups_in_space",
           "make_grouped_policy"]


class GroupedLinear(nn.Module):
    """``G`` linear layers ``in_features → out_features``; row ``b`` goes through layer
    ``group[b]``. ``weight``: ``[G, out, in]``, ``bias``: ``[G, out]``."""

    def __init__(self, layers: list[nn.Linear]):
        super().__init__()
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in layers]).clone())
        self.bias = nn.Parameter(torch.stack([m.bias.detach() for m in layers]).clone())
        self.in_features = layers[0].in_features
        self.out_features = layers[0].out_features

    def forward(self, x: Tensor, group: Tensor) -> Tensor:
        # every group's product [G, B, out], then each row's own: the rows of group h pass
        # no gradient to the weights of any group g != h
        y = torch.einsum("bi,goi->gbo", x, self.weight) + self.bias[:, None, :]
        return y[group, torch.arange(x.shape[0])]


class GroupedMLP(nn.Module):
    """An MLP of :class:`GroupedLinear` layers over ``[B, D + 1]`` inputs whose last entry
    is the row's group index. Iterating it gives its layers (so code that looks for plain
    linear layers sees none)."""

    def __init__(self, groups: int, n_in: int, hidden: tuple[int, ...], n_out: int,
                 act: type[nn.Module], ortho: bool, out_gain: float):
        super().__init__()
        nets = [mlp_layers(n_in, hidden, n_out, act, ortho, out_gain) for _ in range(groups)]
        mods: list[nn.Module] = []
        for j, m in enumerate(nets[0]):
            mods.append(GroupedLinear([net[j] for net in nets]) if isinstance(m, nn.Linear)
                        else m)
        self.layers = nn.ModuleList(mods)
        self.groups = groups

    def __iter__(self):
        return iter(self.layers)

    def __getitem__(self, i):
        return self.layers[i]

    def forward(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], -1)
        group = x[:, -1].round().long().clamp(0, self.groups - 1)
        x = x[:, :-1]
        for m in self.layers:
            x = m(x, group) if isinstance(m, GroupedLinear) else m(x)
        return x


class GroupedActorCritic(MLPActorCritic):
    """:class:`MLPActorCritic` with one actor and one critic per agent group (module doc).
    ``obs_dim`` and ``state_dim`` include the group entry."""

    def __init__(self, groups: int, obs_dim: int, kind: str, action_dim: int, *,
                 nvec: tuple[int, ...] | None = None, hidden: tuple[int, ...] = (64, 64),
                 activation: str = "tanh", ortho_init: bool = True,
                 state_dim: int | None = None, state_norm: bool = False):
        if kind == "gaussian":
            raise ValueError("agent_groups: per-group policies take Discrete, MultiDiscrete "
                             "or MultiBinary actions, not Box (continuous) ones")
        super().__init__(obs_dim, kind, action_dim, nvec=nvec, hidden=hidden,
                         activation=activation, ortho_init=ortho_init, state_dim=state_dim)
        if state_norm and state_dim is not None:  # (the group index is not normalised)
            self.state_norm = nn.LayerNorm(state_dim - 1)
        act = ACTIVATIONS[activation]
        n_logits = int(sum(nvec)) if kind == "multicategorical" else action_dim
        self.groups = int(groups)
        self.actor = GroupedMLP(self.groups, obs_dim - 1, hidden, n_logits, act, ortho_init,
                                0.01)
        self.critic = GroupedMLP(self.groups, (obs_dim if state_dim is None else state_dim)
                                 - 1, hidden, 1, act, ortho_init, 1.0)

    @staticmethod
    def _run(net, x: Tensor) -> Tensor:
        return net(x)

    def _norm_state(self, state: Tensor) -> Tensor:
        return torch.cat([self.state_norm(state[:, :-1]), state[:, -1:]], 1)


def groups_in_space(obs_space: spaces.Space, what: str = "observation") -> int:
    """The number of groups an observation (or state) space of grouped rows says: its last
    entry's upper bound plus one; a :class:`ValueError` for a space without one."""
    if not isinstance(obs_space, spaces.Box) or len(obs_space.shape) != 1 or \
            obs_space.shape[0] < 2 or not np.isfinite(obs_space.high[-1]) or \
            obs_space.low[-1] != 0:
        raise ValueError(f"agent_groups: the {what} space {obs_space} does not end with a "
                         "group index (a run trained with agent_groups reads its rows' "
                         "groups from it)")
    return int(obs_space.high[-1]) + 1


def make_grouped_policy(obs_space: spaces.Space, action_space: spaces.Space, *,
                        hidden: tuple[int, ...] = (64, 64), activation: str = "tanh",
                        ortho_init: bool = True, state_space: spaces.Box | None = None,
                        state_norm: bool = False) -> GroupedActorCritic:
    """The grouped actor-critic for the rows' spaces (flat observations ending with the
    group index; ``state_space``: a centralised critic's state, ending with it too)."""
    from .actions import check_action_space

    check_action_space(action_space)
    g = groups_in_space(obs_space)
    state_dim = None
    if state_space is not None:
        if groups_in_space(state_space, "state") != g:
            raise ValueError("agent_groups: the state space's group index disagrees with "
                             "the observation space's")
        state_dim = int(np.prod(state_space.shape))
    kw = dict(hidden=tuple(hidden), activation=activation, ortho_init=ortho_init,
              state_dim=state_dim, state_norm=state_norm)
    obs_dim = int(obs_space.shape[0])
    if isinstance(action_space, spaces.Discrete):
        return GroupedActorCritic(g, obs_dim, "categorical", int(action_space.n), **kw)
    if isinstance(action_space, spaces.MultiDiscrete):
        nvec = tuple(int(n) for n in np.asarray(action_space.nvec).reshape(-1))
        return GroupedActorCritic(g, obs_dim, "multicategorical", len(nvec), nvec=nvec, **kw)
    if isinstance(action_space, spaces.MultiBinary):
        return GroupedActorCritic(g, obs_dim, "bernoulli", int(np.prod(action_space.shape)),
                                  **kw)
    return GroupedActorCritic(g, obs_dim, "gaussian", 0, **kw)
