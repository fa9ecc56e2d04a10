"""The policy interface every ppokit learner, collector and check relies on.

A ppokit policy is a ``torch.nn.Module`` holding an actor (a distribution over actions
given an observation) and a critic (a scalar value per observation). Shapes use a flat
leading batch axis ``[B]``; the collector passes ``B = N`` (one row per env) and the
learner passes a minibatch ``B = M``.

=========================================  ================================================
method                                     returns
=========================================  ================================================
``act(obs, generator=None)``               ``(action, logp, value)``: a sample from π(·|obs),
                                           its log-probability and V(obs). Used by rollouts,
                                           normally under ``torch.inference_mode``.
``evaluate(obs, actions)``                 ``(logp, entropy, value)`` of given actions, with
                                           gradient. Used by updates.
``value(obs)``                             ``[B]`` critic values V(obs).
``deterministic_action(obs)``              the mode of π(·|obs) (argmax / mean), for eval.
``log_prob(obs, actions)``                 ``[B]`` log π(a|obs) (``evaluate`` without the
                                           critic).
=========================================  ================================================

Shapes:

* ``obs``: ``[B, *obs_shape]`` float32 (already normalised when normalisation is on).
* ``action``: the policy's own coordinates (:mod:`ppokit.policies.actions`): ``[B]``
  int64 indices from 0 (Discrete, whatever its ``start``), ``[B, K]`` float32 (Box,
  flattened), ``[B, K]`` int64 (MultiDiscrete indices from 0, MultiBinary bits,
  flattened); ``evaluate`` also takes them in the space's shape ``[B, *shape]``. Box
  actions are the *unclipped* Gaussian sample: ``logp`` is the density of exactly this
  sample. The environment receives :func:`ppokit.policies.actions.env_actions` of them
  (start added, Box clipped to its bounds, the space's shape and dtype).
* ``logp``, ``entropy``, ``value``: ``[B]`` float32. For MultiDiscrete the heads are
  independent: ``logp`` and ``entropy`` are sums over heads.

Action masks: ppokit's MLP actor-critic also takes ``action_masks`` (``[B, W]`` bool,
:mod:`ppokit.policies.masking`) in ``act``, ``evaluate``, ``log_prob`` and
``deterministic_action``; the masked actions then have probability 0 in each.

A centralised critic (ppokit's MLP actor-critic with ``state_dim``, ``centralised_critic``
in the configuration) reads a global state ``[B, S]`` float32 instead of the observation:
``act``, ``evaluate`` and ``value`` take it as ``state=``; without it ``act`` and
``evaluate`` return ``None`` in place of the values (the actor needs only the observation).

``generator``, when given, is the only source of randomness used for sampling, which is
what makes runs reproducible and resumable (its state is saved with the checkpoint).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

Tensor = torch.Tensor

__all__ = ["Policy"]


@runtime_checkable
class Policy(Protocol):
    """Structural type of a ppokit policy (see the module documentation for shapes)."""

    def act(self, obs: Tensor, generator: torch.Generator | None = None
            ) -> tuple[Tensor, Tensor, Tensor]: ...

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...

    def value(self, obs: Tensor) -> Tensor: ...

    def deterministic_action(self, obs: Tensor) -> Tensor: ...

    def log_prob(self, obs: Tensor, actions: Tensor) -> Tensor: ...
