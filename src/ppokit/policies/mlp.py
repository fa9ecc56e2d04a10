"""MLP actor-critic with Categorical, diagonal-Gaussian and multi-categorical heads.

Separate actor and critic networks (no shared trunk). Distributions are computed directly
from logits / means (no ``torch.distributions`` objects): building one costs tens of
microseconds per rollout step, more than the network itself for small MLPs.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from ppokit import kernels

from .masking import mask_logits, sample_masked

Tensor = torch.Tensor

__all__ = ["MLPActorCritic", "NumpySampler", "make_policy", "resolve_policy", "ACTIVATIONS"]

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _sample_categorical(logp_all: Tensor, generator: torch.Generator | None) -> Tensor:
    """Inverse-CDF sample ``[B, 1]`` from log-probs ``[B, K]`` (cheaper than multinomial)."""
    u = torch.rand(logp_all.shape[:-1] + (1,), generator=generator, dtype=logp_all.dtype)
    cdf = logp_all.exp().cumsum(-1)
    # u scaled by the cdf's own total: never past the last action, never on a zero-prob one
    return (cdf < u * cdf[..., -1:]).sum(-1, keepdim=True)


def sample_categorical_np(logits: np.ndarray, u: np.ndarray) -> np.ndarray:
    """NumPy twin of the categorical sampler: action ``[B]`` from logits ``[B, K]`` and
    uniforms ``u`` ``[B, 1]`` in ``[0, 1)``, by the same scaled inverse-CDF rule."""
    cdf = np.exp(logits - logits.max(-1, keepdims=True)).cumsum(-1)
    return (cdf < u * cdf[:, -1:]).sum(-1)


class NumpySampler:
    """The actor's forward pass and action sampling for the rollout's per-step batches (a
    few rows), outside torch: there torch's per-call cost is many times the policy's
    arithmetic, a handful of tiny matrix products.

    Where ppokit's compiled kernels are built (:mod:`ppokit.kernels`) the whole step is one
    C call (``native`` true); else, or with ``native=False``, it runs in NumPy (the
    reference the tests hold the C call to). The two pick the same action unless a uniform
    lies within float rounding of a boundary of the cumulative probabilities.

    It reads the policy's parameters through views that share their memory, so it always
    samples from the current weights (:meth:`bind` re-takes the views, e.g. after a
    parameter's storage was replaced). Only actions are produced: their log-probabilities
    and the values are computed afterwards for the whole rollout in one batched torch pass
    (:meth:`MLPActorCritic.evaluate`), the same computation the update uses.
    """

    def __init__(self, policy: MLPActorCritic, native: bool | None = None):
        if not self.supports(policy):
            raise ValueError("NumpySampler needs an MLPActorCritic with a categorical or "
                             "Gaussian head over flat observations")
        self.policy = policy
        self.kind = policy.kind
        self.relu = any(isinstance(m, nn.ReLU) for m in policy.actor)
        why = kernels.why_not("actor")
        if native and why is not None:
            raise ValueError(f"NumpySampler(native=True): {why}")
        lins = [m for m in policy.actor if isinstance(m, nn.Linear)]
        if native is None:  # (the C call's categorical head takes up to 64 actions)
            native = why is None and (self.kind == "gaussian" or lins[-1].out_features <= 64)
        elif native and self.kind == "categorical" and lins[-1].out_features > 64:
            raise ValueError("NumpySampler(native=True): more than 64 actions")
        self.native = bool(native)
        self.in_dim = lins[0].in_features
        self._scratch: dict[int, tuple[np.ndarray, int]] = {}  # rows -> (buffer, address)
        self.bind()

    @staticmethod
    def supports(policy) -> bool:
        return (isinstance(policy, MLPActorCritic) and policy.kind in ("categorical", "gaussian")
                and policy.obs_onehot is None and policy.encoder is None
                and all(isinstance(m, (nn.Linear, nn.Tanh, nn.ReLU)) for m in policy.actor)
                and all(p.dtype == torch.float32 and p.device.type == "cpu"
                        for p in policy.parameters()))

    def bind(self) -> None:
        lins = [m for m in self.policy.actor if isinstance(m, nn.Linear)]
        self.layers = [(m.weight.detach().numpy().T, m.bias.detach().numpy()) for m in lins]
        if self.kind == "gaussian":
            self.log_std = self.policy.log_std.detach().numpy()
        if self.native:
            # offsets in floats from the lowest parameter's address (the C call's plan)
            ts = [t for m in lins for t in (m.weight, m.bias)]
            if self.kind == "gaussian":
                ts.append(self.policy.log_std)
            if not all(t.is_contiguous() for t in ts):
                raise ValueError("NumpySampler: the actor's parameters are not contiguous")
            self._keep = ts  # (their storage stays alive while the plan points at it)
            base = min(t.data_ptr() for t in ts)
            offs = [(t.data_ptr() - base) // 4 for t in ts]
            log_std = offs[-1] if self.kind == "gaussian" else -1
            dims = [lins[0].in_features] + [m.out_features for m in lins]
            self._plan = np.array([int(self.kind == "categorical"), int(self.relu), len(lins),
                                   log_std, *dims, *offs[:2 * len(lins)]], np.int64)
            self._plan_p = self._plan.ctypes.data
            self._base = base

    def _scratch_for(self, rows: int) -> int:
        got = self._scratch.get(rows)
        if got is None:
            buf = np.empty(kernels.sample_scratch(self._plan_p, rows), np.float32)
            got = self._scratch[rows] = (buf, buf.ctypes.data)
        return got[1]

    def __call__(self, obs: np.ndarray, noise: np.ndarray,
                 out: np.ndarray | None = None) -> np.ndarray:
        """Actions for ``obs`` ``[B, obs_dim]`` (float32). ``noise``: uniforms ``[B, 1]``
        (categorical) or standard normals ``[B, action_dim]`` (Gaussian: the unclipped
        sample ``mean + exp(log_std) · noise`` is returned). Observations with more than one
        dimension per env (images) are flattened, as :meth:`MLPActorCritic.evaluate` does.
        ``out``: where to write the actions (int64 ``[B]`` or float32 ``[B, action_dim]``,
        contiguous), else a new array."""
        h = obs.reshape(obs.shape[0], -1) if obs.ndim != 2 else obs
        if self.native:
            b = h.shape[0]
            if h.shape[1] != self.in_dim:
                raise ValueError(f"NumpySampler: observations of shape {obs.shape}, expected "
                                 f"({b}, {self.in_dim})")
            if out is None:
                out = (np.empty(b, np.int64) if self.kind == "categorical"
                       else np.empty((b, self.layers[-1][1].shape[0]), np.float32))
            if h.dtype != np.float32 or not h.flags.c_contiguous:
                h = np.ascontiguousarray(h, np.float32)
            kernels.sample(self._plan_p, self._base, h, noise, out, self._scratch_for(b), b)
            return out
        last = len(self.layers) - 1
        for i, (wt, b) in enumerate(self.layers):
            h = h @ wt
            h += b
            if i < last:
                if self.relu:
                    np.maximum(h, 0.0, out=h)
                else:
                    np.tanh(h, out=h)
        if self.kind == "categorical":
            a = sample_categorical_np(h, noise)
        else:
            h += np.exp(self.log_std) * noise
            a = h
        if out is None:
            return a
        out[...] = a.reshape(out.shape)
        return out


def mlp_layers(n_in: int, hidden: tuple[int, ...], n_out: int, act: type[nn.Module],
         ortho: bool, out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    last = n_in
    for h in hidden:
        lin = nn.Linear(last, h)
        if ortho:
            nn.init.orthogonal_(lin.weight, math.sqrt(2))
            nn.init.zeros_(lin.bias)
        layers += [lin, act()]
        last = h
    out = nn.Linear(last, n_out)
    if ortho:
        nn.init.orthogonal_(out.weight, out_gain)
        nn.init.zeros_(out.bias)
    layers.append(out)
    return nn.Sequential(*layers)


class MLPActorCritic(nn.Module):
    """Actor and critic MLPs over a flat observation; implements :class:`ppokit.policies.Policy`.

    ``kind`` is ``"categorical"`` (Discrete), ``"gaussian"`` (Box; state-independent
    log-std parameter), ``"multicategorical"`` (MultiDiscrete, independent heads) or
    ``"bernoulli"`` (MultiBinary, one independent bit per logit).

    ``encoder`` (:mod:`ppokit.policies.encoders`: a CNN, a multi-input encoder) turns
    observations into the ``obs_dim`` features the MLPs read; ``critic_encoder`` is the
    critic's own (``None``: the critic reads the actor's features, one shared trunk).

    ``state_dim`` makes the critic centralised: it reads a flat global state of that size
    (the ``state`` argument of :meth:`value`, :meth:`act` and :meth:`evaluate`) instead of
    the observation, which the actor alone reads; without a ``state`` :meth:`act` and
    :meth:`evaluate` give ``None`` for the values, and :meth:`value` refuses. With
    ``state_norm`` each state row first goes through a LayerNorm (``state_norm``, MAPPO's
    feature normalisation: zero mean and unit variance over the row's entries, then a
    learnt scale and shift).
    """

    def __init__(self, obs_dim: int, kind: str, action_dim: int, *,
                 nvec: tuple[int, ...] | None = None, hidden: tuple[int, ...] = (64, 64),
                 activation: str = "tanh", ortho_init: bool = True,
                 log_std_init: float = 0.0, obs_onehot: int | None = None, obs_start: int = 0,
                 encoder: nn.Module | None = None, critic_encoder: nn.Module | None = None,
                 state_dim: int | None = None, state_norm: bool = False):
        super().__init__()
        if kind not in ("categorical", "gaussian", "multicategorical", "bernoulli"):
            raise ValueError(f"kind: unknown policy head {kind!r}")
        act = ACTIVATIONS[activation]
        self.kind = kind
        self.obs_onehot = obs_onehot
        self.obs_start = int(obs_start)
        self.encoder = encoder
        self.critic_encoder = critic_encoder
        n_logits = int(sum(nvec)) if kind == "multicategorical" else action_dim
        self.actor = mlp_layers(obs_dim, hidden, n_logits, act, ortho_init, 0.01)
        self.state_dim = None if state_dim is None else int(state_dim)
        self.critic = mlp_layers(obs_dim if state_dim is None else self.state_dim, hidden, 1,
                                 act, ortho_init, 1.0)
        self.state_norm = (nn.LayerNorm(self.state_dim) if state_norm and state_dim is not None
                           else None)
        if kind == "gaussian":
            self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))
        self.nvec = tuple(int(n) for n in nvec) if nvec is not None else None

    # -- helpers --------------------------------------------------------------------------
    @staticmethod
    def _run(net: nn.Sequential, x: Tensor) -> Tensor:
        """``net(x)`` without the per-module call machinery (hooks), which costs more than
        the arithmetic for these small layers; used on the rollout path."""
        for m in net:
            if isinstance(m, nn.Linear):
                x = torch.nn.functional.linear(x, m.weight, m.bias)
            else:
                x = m(x)
        return x

    def _features(self, obs: Tensor) -> Tensor:
        if self.encoder is not None:
            return self.encoder(obs)
        if self.obs_onehot is not None:
            # a Discrete(n, start) observation s is the one-hot of s − start
            idx = obs.long().reshape(-1) - self.obs_start
            return nn.functional.one_hot(idx, self.obs_onehot).float()
        return obs.reshape(obs.shape[0], -1)

    def _split(self, logits: Tensor) -> tuple[Tensor, ...]:
        return torch.split(logits, self.nvec, dim=-1)

    def _critic_features(self, obs: Tensor, actor_x: Tensor | None = None,
                         state: Tensor | None = None) -> Tensor | None:
        """The critic's input: the global state (a centralised critic; ``None`` without
        one), its own encoder's features, or the actor's."""
        if self.state_dim is not None:
            if state is None:
                return None
            state = state.reshape(state.shape[0], -1)
            return state if self.state_norm is None else self._norm_state(state)
        if self.critic_encoder is not None:
            return self.critic_encoder(obs)
        return self._features(obs) if actor_x is None else actor_x

    def _norm_state(self, state: Tensor) -> Tensor:
        return self.state_norm(state)

    def _value_of(self, features: Tensor | None, fast: bool = False) -> Tensor | None:
        if features is None:
            return None
        return (self._run(self.critic, features) if fast else self.critic(features)).squeeze(-1)

    # -- Policy interface -----------------------------------------------------------------
    def value(self, obs: Tensor, state: Tensor | None = None) -> Tensor:
        if self.state_dim is not None and state is None:
            raise ValueError("state: this policy's critic is centralised; its values read "
                             "the global state (value(obs, state))")
        return self._value_of(self._critic_features(obs, None, state), fast=True)

    def act(self, obs: Tensor, generator: torch.Generator | None = None,
            action_masks: Tensor | None = None, state: Tensor | None = None
            ) -> tuple[Tensor, Tensor, Tensor]:
        x = self._features(obs)
        out = self._masked(self._run(self.actor, x), action_masks)
        value = self._value_of(self._critic_features(obs, x, state), fast=True)
        a, logp = self._sample(out, generator, action_masks is not None)
        return a, logp, value

    def _masked(self, out: Tensor, action_masks: Tensor | None) -> Tensor:
        """The head's output with the masked actions' logits replaced
        (:mod:`ppokit.policies.masking`); unchanged without masks."""
        if action_masks is None:
            return out
        if self.kind not in ("categorical", "multicategorical"):
            raise ValueError(f"action masks: a {self.kind} head takes none (Discrete and "
                             "MultiDiscrete actions only)")
        return mask_logits(out, action_masks)

    def _sample(self, out: Tensor, generator: torch.Generator | None, masked: bool = False
                ) -> tuple[Tensor, Tensor]:
        """``(action, logp)`` sampled from the head's output ``out`` (logits / means;
        ``masked``: logits already masked, sampled so that no masked action is picked)."""
        draw = sample_masked if masked else _sample_categorical
        if self.kind == "categorical":
            logp_all = out.log_softmax(-1)
            a = draw(logp_all, generator)
            return a.squeeze(-1), logp_all.gather(-1, a).squeeze(-1)
        if self.kind == "gaussian":
            std = self.log_std.exp()
            noise = torch.randn(out.shape, generator=generator, dtype=out.dtype)
            a = out + std * noise
            logp = (-0.5 * noise.square() - self.log_std - _LOG_SQRT_2PI).sum(-1)
            return a, logp
        if self.kind == "bernoulli":
            u = torch.rand(out.shape, generator=generator, dtype=out.dtype)
            a = (u < torch.sigmoid(out)).to(out.dtype)
            return a, _bernoulli_logp(out, a)
        acts, logps = [], []
        for lg in self._split(out):
            lp = lg.log_softmax(-1)
            a = draw(lp, generator)
            acts.append(a)
            logps.append(lp.gather(-1, a))
        return torch.cat(acts, -1), torch.cat(logps, -1).sum(-1)

    def _logp_entropy(self, out: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Log-probability and entropy of ``actions`` (``[B]`` indices, or ``[B, ...]`` of
        any shape, read flattened: ppokit.policies.actions) under the head's ``out``."""
        if self.kind == "categorical":
            logp_all = out.log_softmax(-1)
            ent = -(logp_all.exp() * logp_all).sum(-1)
            a = actions.long().reshape(-1, 1)
            return logp_all.gather(-1, a).squeeze(-1), ent
        actions = actions.reshape(actions.shape[0], -1)
        if self.kind == "gaussian":
            z = (actions - out) * torch.exp(-self.log_std)
            logp = (-0.5 * z.square() - self.log_std - _LOG_SQRT_2PI).sum(-1)
            ent = (0.5 + _LOG_SQRT_2PI + self.log_std).sum().expand(out.shape[0])
            return logp, ent
        if self.kind == "bernoulli":
            p = torch.sigmoid(out)
            ent = -(p * nn.functional.logsigmoid(out)
                    + (1 - p) * nn.functional.logsigmoid(-out)).sum(-1)
            return _bernoulli_logp(out, actions.to(out.dtype)), ent
        logp = 0.0
        ent = 0.0
        for i, lg in enumerate(self._split(out)):
            lp = lg.log_softmax(-1)
            logp = logp + lp.gather(-1, actions[:, i:i + 1].long()).squeeze(-1)
            ent = ent - (lp.exp() * lp).sum(-1)
        return logp, ent

    def evaluate(self, obs: Tensor, actions: Tensor, action_masks: Tensor | None = None,
                 state: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        x = self._features(obs)
        logp, ent = self._logp_entropy(self._masked(self.actor(x), action_masks), actions)
        return logp, ent, self._value_of(self._critic_features(obs, x, state))

    def log_prob(self, obs: Tensor, actions: Tensor, action_masks: Tensor | None = None
                 ) -> Tensor:
        out = self._masked(self.actor(self._features(obs)), action_masks)
        return self._logp_entropy(out, actions)[0]

    def deterministic_action(self, obs: Tensor, action_masks: Tensor | None = None
                             ) -> Tensor:
        return self._mode(self._masked(self.actor(self._features(obs)), action_masks))

    def _mode(self, out: Tensor) -> Tensor:
        """The most likely action (argmax / mean) of the head's output ``out``."""
        if self.kind == "categorical":
            return out.argmax(-1)
        if self.kind == "gaussian":
            return out
        if self.kind == "bernoulli":
            return (out > 0).to(out.dtype)
        return torch.stack([lg.argmax(-1) for lg in self._split(out)], -1)


def _bernoulli_logp(logits: Tensor, a: Tensor) -> Tensor:
    """log P(a) of independent bits with logits ``[B, n]`` (a in {0, 1}), summed over bits."""
    return (a * nn.functional.logsigmoid(logits)
            + (1 - a) * nn.functional.logsigmoid(-logits)).sum(-1)


def resolve_policy(obs_space: spaces.Space, policy: str = "auto") -> str:
    """The encoder a ``policy`` value means for ``obs_space``: ``auto`` picks ``cnn`` for an
    image Box (the Nature CNN from 36x36 pixels, the small-image CNN below:
    :func:`ppokit.policies.encoders.image_cnn`), ``multi_input`` for a Dict, ``mlp``
    otherwise; an explicit choice that does not fit the space is an error naming
    ``policy``."""
    from .encoders import BUILT_IN, POLICIES, is_image_space

    if policy not in POLICIES:
        raise ValueError(f"policy: expected one of {', '.join(POLICIES)} (a features "
                         f"extractor of your own: ppokit.register_features_extractor, in a "
                         f"module named by --import MODULE or imported from Python), got "
                         f"{policy!r}")
    if policy not in ("auto", *BUILT_IN):
        return policy  # a features extractor of the user's: it reads what the space gives
    if policy == "auto":
        if isinstance(obs_space, spaces.Dict):
            return "multi_input"
        return "cnn" if is_image_space(obs_space) else "mlp"
    if policy == "cnn" and not is_image_space(obs_space):
        raise ValueError(f"policy: cnn needs an image observation space (a 3-D Box of "
                         f"uint8 or bool, or of floats in [0, 1]); this env has {obs_space}")
    if policy == "multi_input" and not isinstance(obs_space, spaces.Dict):
        raise ValueError(f"policy: multi_input needs a Dict observation space; this env has "
                         f"{obs_space}")
    if policy == "mlp" and isinstance(obs_space, spaces.Dict):
        raise ValueError("policy: mlp cannot read a Dict observation space; use "
                         "multi_input (or auto)")
    return policy


def make_policy(obs_space: spaces.Space, action_space: spaces.Space, *,
                hidden: tuple[int, ...] = (64, 64), activation: str = "tanh",
                ortho_init: bool = True, log_std_init: float = 0.0, policy: str = "auto",
                cnn_channels: tuple[int, ...] = (32, 64, 64), features_dim: int = 512,
                share_features: bool = True, state_space: spaces.Box | None = None,
                state_norm: bool = False) -> MLPActorCritic:
    """Build the actor-critic matching single-env observation and action spaces: the
    encoder ``policy`` names (:func:`resolve_policy`; for ``cnn`` and ``multi_input`` one
    trunk shared by actor and critic unless ``share_features`` is false), then the MLPs.
    ``state_space``: a centralised critic over this flat global state (``state_norm``:
    normalised by a LayerNorm first)."""
    from .actions import check_action_space
    from .encoders import build_extractor, flat_dict_space

    check_action_space(action_space)
    onehot = None
    encoder = critic_encoder = None
    kind = resolve_policy(obs_space, policy)
    if kind != "mlp":  # every extractor through one registry (policies/encoders.py)
        space = obs_space
        if kind not in ("cnn", "multi_input") and isinstance(obs_space, spaces.Dict):
            space = flat_dict_space(obs_space)  # a user's extractor reads the stored vector

        def build():
            return build_extractor(kind, space, features_dim=features_dim,
                                   channels=tuple(cnn_channels))
        encoder = build()
        critic_encoder = None if share_features or state_space is not None else build()
        obs_dim = encoder.features_dim
    elif isinstance(obs_space, spaces.Box):
        obs_dim = int(np.prod(obs_space.shape))
    elif isinstance(obs_space, spaces.Discrete):
        obs_dim = onehot = int(obs_space.n)
    else:
        raise ValueError(f"observation space {obs_space} is not supported (Box, Discrete, "
                         "or Dict with policy=multi_input)")
    kw = dict(hidden=tuple(hidden), activation=activation, ortho_init=ortho_init,
              obs_onehot=onehot, obs_start=int(getattr(obs_space, "start", 0) or 0),
              encoder=encoder, critic_encoder=critic_encoder,
              state_dim=None if state_space is None else int(np.prod(state_space.shape)),
              state_norm=state_norm)
    if isinstance(action_space, spaces.Discrete):
        return MLPActorCritic(obs_dim, "categorical", int(action_space.n), **kw)
    if isinstance(action_space, spaces.Box):
        return MLPActorCritic(obs_dim, "gaussian", int(np.prod(action_space.shape)),
                              log_std_init=log_std_init, **kw)
    if isinstance(action_space, spaces.MultiDiscrete):
        nvec = tuple(int(n) for n in np.asarray(action_space.nvec).reshape(-1))
        return MLPActorCritic(obs_dim, "multicategorical", len(nvec), nvec=nvec, **kw)
    n = int(np.prod(action_space.shape))  # (check_action_space: MultiBinary is what is left)
    return MLPActorCritic(obs_dim, "bernoulli", n, **kw)
