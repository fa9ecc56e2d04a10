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
* ``action``: ``[B]`` int64 (Discrete), ``[B, A]`` float32 (Box), ``[B, K]`` int64
  (MultiDiscrete). Box actions are the *unclipped* Gaussian sample: ``logp`` is the density
  of exactly this sample; the environment receives it clipped to the Box bounds
  (the collector does the clipping, see :mod:`ppokit.rollout`).
* ``logp``, ``entropy``, ``value``: ``[B]`` float32. For MultiDiscrete the heads are
  independent: ``logp`` and ``entropy`` are sums over heads.

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
