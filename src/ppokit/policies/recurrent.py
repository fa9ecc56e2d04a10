"""LSTM actor-critic: the policy with memory (``recurrent = "lstm"``).

Layout (defaults as sb3-contrib's ``RecurrentPPO``: one LSTM layer of 256 units for the
actor, a separate one for the critic)::

    obs ─ encoder ─ LSTM_actor ─ MLP(net_arch) ─ action head
        └ encoder ─ LSTM_critic ─ MLP(net_arch) ─ value            (enable_critic_lstm)
                    (actor's LSTM output, detached) ─ MLP ─ value  (shared_lstm)
        └ encoder ─ MLP(net_arch) ─ value                          (neither: no memory)

The encoder turns one observation into a flat feature vector (``features_dim``): flatten
for Box observations, one-hot for Discrete ones. It is the one place another encoder (a
CNN, a multi-input one) slots in: everything after it sees ``[B, features_dim]``. With
``shared_lstm`` the critic reads the actor's LSTM output *detached*, so that the value loss
does not move the actor's memory (the value term would otherwise dominate it).

The state
---------
A state is a tuple of tensors ``[n_lstm_layers, B, H]``: ``(h, c)`` of the actor's LSTM,
then ``(h, c)`` of the critic's when it has its own. :meth:`reset` zeroes the rows whose
``episode_start`` is set: a new episode begins with the zero state, whatever came before.
Single steps (rollouts, evaluation, ``predict``) take the state *before* the observation
and return the state after it. Updates run whole sequences (:meth:`evaluate_sequences`):
one ``nn.LSTM`` call over a padded batch of sequences ``[S, L]``, each starting from its own
recorded state; a sequence never crosses an episode start (see :mod:`ppokit.rollout.recurrent`),
so no reset happens inside it, and padding sits after the real steps, where the causal
recurrence cannot carry it back into them.
"""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from ppokit.kernels import lstm as native_lstm

from .mlp import ACTIVATIONS, MLPActorCritic, mlp_layers

Tensor = torch.Tensor
State = tuple[Tensor, ...]

__all__ = ["LSTMActorCritic", "make_recurrent_policy", "State"]


class LSTMActorCritic(nn.Module):
    """Actor and critic with LSTM memory; the heads are those of
    :class:`ppokit.policies.MLPActorCritic` (``categorical``, ``gaussian``,
    ``multicategorical``)."""

    recurrent = True
    #: the update's LSTM passes in C where the kernels are built (:meth:`_sequence`)
    native_lstm = True

    def __init__(self, obs_dim: int, kind: str, action_dim: int, *,
                 nvec: tuple[int, ...] | None = None, hidden: tuple[int, ...] = (64, 64),
                 activation: str = "tanh", ortho_init: bool = True,
                 log_std_init: float = 0.0, obs_onehot: int | None = None, obs_start: int = 0,
                 lstm_hidden_size: int = 256, n_lstm_layers: int = 1,
                 shared_lstm: bool = False, enable_critic_lstm: bool = True):
        super().__init__()
        if kind not in ("categorical", "gaussian", "multicategorical"):
            raise ValueError(f"kind: unknown policy head {kind!r}")
        if shared_lstm and enable_critic_lstm:
            raise ValueError("shared_lstm: the critic either shares the actor's LSTM or has "
                             "its own (enable_critic_lstm), not both")
        act = ACTIVATIONS[activation]
        self.kind = kind
        self.obs_onehot = obs_onehot
        self.obs_start = int(obs_start)
        self.features_dim = obs_dim
        self.lstm_hidden_size = int(lstm_hidden_size)
        self.n_lstm_layers = int(n_lstm_layers)
        self.shared_lstm = bool(shared_lstm)
        self.enable_critic_lstm = bool(enable_critic_lstm)
        self.nvec = tuple(int(n) for n in nvec) if nvec is not None else None
        n_logits = int(sum(self.nvec)) if kind == "multicategorical" else action_dim
        H = self.lstm_hidden_size
        self.lstm_actor = nn.LSTM(obs_dim, H, self.n_lstm_layers, batch_first=True)
        self.lstm_critic = (nn.LSTM(obs_dim, H, self.n_lstm_layers, batch_first=True)
                            if self.enable_critic_lstm else None)
        self.actor = mlp_layers(H, hidden, n_logits, act, ortho_init, 0.01)
        critic_in = H if (self.enable_critic_lstm or self.shared_lstm) else obs_dim
        self.critic = mlp_layers(critic_in, hidden, 1, act, ortho_init, 1.0)
        if kind == "gaussian":
            self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    # the heads are the MLP policy's (the same functions, reading kind / log_std / nvec)
    _split = MLPActorCritic._split
    _sample = MLPActorCritic._sample
    _mode = MLPActorCritic._mode
    _logp_entropy = MLPActorCritic._logp_entropy
    _run = staticmethod(MLPActorCritic._run)

    # -- state ----------------------------------------------------------------------------
    @property
    def n_state(self) -> int:
        """Tensors in a state: 2 (the actor's h, c) or 4 (and the critic's)."""
        return 4 if self.lstm_critic is not None else 2

    def initial_state(self, n: int) -> State:
        """The zero state of ``n`` rows (the state at every episode start)."""
        shape = (self.n_lstm_layers, n, self.lstm_hidden_size)
        return tuple(torch.zeros(shape) for _ in range(self.n_state))

    @staticmethod
    def reset(state: State, episode_start: Tensor | np.ndarray | None) -> State:
        """``state`` with the rows where ``episode_start`` is set replaced by zeros."""
        if episode_start is None:
            return state
        start = torch.as_tensor(np.asarray(episode_start, bool))
        if not bool(start.any()):
            return state
        keep = (~start).to(state[0].dtype).view(1, -1, 1)
        return tuple(s * keep for s in state)

    # -- encoder --------------------------------------------------------------------------
    def encode(self, obs: Tensor) -> Tensor:
        """``[B, *obs_shape]`` → ``[B, features_dim]``."""
        if self.obs_onehot is not None:
            # a Discrete(n, start) observation s is the one-hot of s − start
            idx = obs.long().reshape(-1) - self.obs_start
            return nn.functional.one_hot(idx, self.obs_onehot).float()
        return obs.reshape(obs.shape[0], -1)

    # -- one step -------------------------------------------------------------------------
    def _step(self, x: Tensor, state: State, *, critic: bool = True
              ) -> tuple[Tensor, Tensor | None, State]:
        """Head output ``[B, n_out]``, value ``[B]`` (None when ``critic`` is False) and
        the state after the encoded observations ``x`` ``[B, F]`` (no reset here)."""
        y, (h, c) = self.lstm_actor(x.unsqueeze(1), (state[0], state[1]))
        y = y.squeeze(1)
        out = self._run(self.actor, y)
        new: State = (h, c)
        value = None
        if self.lstm_critic is not None:
            yv, (hv, cv) = self.lstm_critic(x.unsqueeze(1), (state[2], state[3]))
            new = (h, c, hv, cv)
            if critic:
                value = self._run(self.critic, yv.squeeze(1)).squeeze(-1)
        elif critic:
            value = self._run(self.critic, y if self.shared_lstm else x).squeeze(-1)
        return out, value, new

    def act(self, obs: Tensor, state: State, generator: torch.Generator | None = None
            ) -> tuple[Tensor, Tensor, Tensor, State]:
        """``(action, logp, value, next_state)`` for one step; ``state`` is the state
        before ``obs`` (already reset where an episode starts)."""
        out, value, new = self._step(self.encode(obs), state)
        a, logp = self._sample(out, generator)
        return a, logp, value, new

    def value(self, obs: Tensor, state: State) -> Tensor:
        """``[B]`` V(obs) seen with ``state`` (the state before ``obs``)."""
        return self._step(self.encode(obs), state)[1]

    def actor_state(self, state: State) -> State:
        return state[:2]

    def predict(self, obs: Tensor, state: State, episode_start=None,
                deterministic: bool = True, generator: torch.Generator | None = None
                ) -> tuple[Tensor, State]:
        """``(action, next_state)`` of the actor alone (evaluation, ``Agent.predict``):
        ``state`` holds the actor's ``(h, c)``; rows with ``episode_start`` set begin from
        the zero state."""
        h, c = self.reset(tuple(state[:2]), episode_start)
        y, (h, c) = self.lstm_actor(self.encode(obs).unsqueeze(1), (h, c))
        out = self._run(self.actor, y.squeeze(1))
        a = self._mode(out) if deterministic else self._sample(out, generator)[0]
        return a, (h, c)

    # -- sequences (updates) --------------------------------------------------------------
    def evaluate_sequences(self, obs: Tensor, actions: Tensor, state: State
                           ) -> tuple[Tensor, Tensor, Tensor]:
        """``(logp, entropy, value)``, each ``[S, L]``, of sequences ``obs``
        ``[S, L, *obs_shape]`` and ``actions`` ``[S, L, ...]`` that start from ``state``
        (tensors ``[n_lstm_layers, S, H]``); one batched LSTM pass, no reset inside."""
        S, L = obs.shape[0], obs.shape[1]
        x = self.encode(obs.reshape(S * L, *obs.shape[2:])).view(S, L, -1)
        y = self._sequence(self.lstm_actor, x, state[0], state[1])
        out = self.actor(y.reshape(S * L, -1))
        logp, ent = self._logp_entropy(out, actions.reshape(S * L, *actions.shape[2:]))
        if self.lstm_critic is not None:
            yv = self._sequence(self.lstm_critic, x, state[2], state[3])
            v = self.critic(yv.reshape(S * L, -1))
        elif self.shared_lstm:
            v = self.critic(y.reshape(S * L, -1).detach())
        else:
            v = self.critic(x.reshape(S * L, -1))
        return logp.reshape(S, L), ent.reshape(S, L), v.reshape(S, L)

    def _sequence(self, lstm: nn.LSTM, x: Tensor, h: Tensor, c: Tensor) -> Tensor:
        """Every output of ``lstm`` over ``x`` ``[S, L, F]`` from ``(h, c)``: in C where
        :func:`ppokit.kernels.lstm.supports` it and :attr:`native_lstm` is set (the
        default; the same numbers to float32 rounding), else ``nn.LSTM``."""
        if self.native_lstm and native_lstm.supports(lstm, x, h):
            return native_lstm.lstm(lstm, x, h, c)
        return lstm(x, (h, c))[0]

    def evaluate_steps(self, obs: Tensor, actions: Tensor, state: State
                       ) -> tuple[Tensor, Tensor, Tensor]:
        """What :meth:`evaluate_sequences` computes, one step at a time through the same
        single-step code the rollout uses (the reference the tests hold it to)."""
        logps, ents, values = [], [], []
        for t in range(obs.shape[1]):
            x = self.encode(obs[:, t])
            if self.shared_lstm:  # the critic reads the actor's output detached
                y, (h, c) = self.lstm_actor(x.unsqueeze(1), (state[0], state[1]))
                out = self._run(self.actor, y.squeeze(1))
                v = self._run(self.critic, y.squeeze(1).detach()).squeeze(-1)
                state = (h, c)
            else:
                out, v, state = self._step(x, state)
            lp, en = self._logp_entropy(out, actions[:, t])
            logps.append(lp)
            ents.append(en)
            values.append(v)
        return torch.stack(logps, 1), torch.stack(ents, 1), torch.stack(values, 1)

    # -- the Policy interface without memory is not meaningful ------------------------------
    def evaluate(self, obs: Tensor, actions: Tensor):
        raise TypeError("a recurrent policy evaluates sequences: use evaluate_sequences "
                        "(obs [S, L, ...], actions, state)")

    def deterministic_action(self, obs: Tensor):
        raise TypeError("a recurrent policy needs its state: use predict(obs, state, "
                        "episode_start)")


def make_recurrent_policy(obs_space: spaces.Space, action_space: spaces.Space, *,
                          hidden: tuple[int, ...] = (64, 64), activation: str = "tanh",
                          ortho_init: bool = True, log_std_init: float = 0.0,
                          lstm_hidden_size: int = 256, n_lstm_layers: int = 1,
                          shared_lstm: bool = False, enable_critic_lstm: bool = True
                          ) -> LSTMActorCritic:
    """Build the LSTM actor-critic matching single-env observation and action spaces."""
    from .actions import check_action_space

    check_action_space(action_space, recurrent=True)
    onehot = None
    if isinstance(obs_space, spaces.Box):
        obs_dim = int(np.prod(obs_space.shape))
    elif isinstance(obs_space, spaces.Discrete):
        obs_dim = onehot = int(obs_space.n)
    else:
        raise ValueError(f"observation space {obs_space} is not supported (Box or Discrete)")
    kw = dict(hidden=tuple(hidden), activation=activation, ortho_init=ortho_init,
              obs_onehot=onehot, obs_start=int(getattr(obs_space, "start", 0) or 0),
              lstm_hidden_size=lstm_hidden_size,
              n_lstm_layers=n_lstm_layers, shared_lstm=shared_lstm,
              enable_critic_lstm=enable_critic_lstm)
    if isinstance(action_space, spaces.Discrete):
        return LSTMActorCritic(obs_dim, "categorical", int(action_space.n), **kw)
    if isinstance(action_space, spaces.Box):
        return LSTMActorCritic(obs_dim, "gaussian", int(np.prod(action_space.shape)),
                               log_std_init=log_std_init, **kw)
    nvec = tuple(int(n) for n in np.asarray(action_space.nvec).reshape(-1))  # MultiDiscrete
    return LSTMActorCritic(obs_dim, "multicategorical", len(nvec), nvec=nvec, **kw)
