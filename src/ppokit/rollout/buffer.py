"""The rollout container: ``[T, N]`` tensors of one collection window (T steps × N envs).

Fields (all ``[T, N, ...]``, time-major; row ``t`` is the transition taken from ``obs[t]``):

=================  =====================================================================
``obs``            observation the action was chosen from (normalised if enabled)
``actions``        action sampled (Box: the unclipped Gaussian sample)
``logp``           log π_old(a|s) at collection time
``values``         V_old(s) at collection time (0 when the critic is not used)
``rewards``        reward of the transition (scaled if reward scaling is enabled)
``terminated``     the episode really ended: no bootstrap
``episode_end``    terminated or truncated: the advantage does not carry across it
``next_values``    V_old of the transition's real next state: of ``info["final_obs"]`` on a
                   SAME_STEP truncation, of the last next-state for ``t = T − 1``
``valid``          False for the dummy step that follows an episode end in NEXT_STEP mode
                   (ignored action, reward 0); such rows are never trained on
``action_masks``   ``[T, N, W]`` bool, the action mask the action was sampled under
                   (``None``: the env gives no masks; :mod:`ppokit.envs.masks`)
``states``         ``[T, N, S]`` float32, the global state a centralised critic read for
                   ``values`` (``None``: the critic reads the observation)
=================  =====================================================================

:meth:`Rollout.compute_advantages` fills ``advantages`` and ``returns`` (value targets
``Â + V_old``) exactly once; they are frozen for all epochs of the update.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ppokit.core.options import EMPTY
from ppokit.core.registry import ENV_ADVANTAGES, AdvantageSpec, Steps
from ppokit.engine.batch import take_rows

Tensor = torch.Tensor

__all__ = ["Rollout", "ADVANTAGE_ESTIMATORS"]

ADVANTAGE_ESTIMATORS = ENV_ADVANTAGES  # a live view: gae, reward_to_go, and any registered


@dataclass
class Rollout:
    obs: Tensor
    actions: Tensor
    logp: Tensor
    values: Tensor
    rewards: Tensor
    terminated: Tensor
    episode_end: Tensor
    next_values: Tensor
    valid: Tensor
    advantages: Tensor | None = None
    returns: Tensor | None = None
    action_masks: Tensor | None = None
    states: Tensor | None = None

    @property
    def num_steps(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.rewards.shape[1])

    def compute_advantages(self, gamma: float, gae_lambda: float,
                           estimator: str = "gae", options: Mapping[str, Any] = EMPTY) -> None:
        """Fill ``advantages`` and ``returns`` once (a second call is an error).

        ``gae``: :func:`ppokit.core.gae` with the two masks. ``reward_to_go``: the
        discounted return within the episode (:func:`ppokit.core.reward_to_go`) minus
        ``values`` (zero without a critic); a truncation adds ``γ V(final state)`` to its
        reward and a window that ends mid-episode bootstraps from ``next_values[T-1]`` —
        both zero when no critic is used, giving the plain Monte-Carlo return. ``options``:
        the estimator's own (``AdvantageSpec.options``).
        """
        if self.advantages is not None:
            raise RuntimeError("advantages are computed once per rollout and then frozen")
        fn = ENV_ADVANTAGES.get(estimator)  # the config value is the registry name
        steps = Steps(self.rewards, self.values, self.next_values, self.terminated,
                      self.episode_end)
        with torch.no_grad():
            adv, ret = fn(steps, AdvantageSpec(gamma=gamma, gae_lambda=gae_lambda,
                                             options=options))
        adv, ret = torch.as_tensor(adv), torch.as_tensor(ret)
        if adv.shape != self.rewards.shape or ret.shape != self.rewards.shape:
            raise ValueError(f"advantage estimator {estimator!r}: expected advantages and "
                             f"returns of shape {tuple(self.rewards.shape)}, got "
                             f"{tuple(adv.shape)} and {tuple(ret.shape)}")
        self.advantages, self.returns = adv, ret

    def flat(self) -> dict[str, Tensor]:
        """``[T·N, ...]`` views of the valid rows only (row order: time-major)."""
        if self.advantages is None:
            raise RuntimeError("compute_advantages() first")
        keep = self.valid.reshape(-1)
        # the kept rows' numbers: take_rows copies whole rows (pixels: ~10x a mask's
        # element-by-element copy)
        rows = None if keep.all() else torch.nonzero(keep).squeeze(1)
        out = {}
        names = ("obs", "actions", "logp", "values", "advantages", "returns")
        if self.action_masks is not None:
            names += ("action_masks",)
        if self.states is not None:
            names += ("states",)
        for name in names:
            t = getattr(self, name)
            t = t.reshape(-1, *t.shape[2:])
            out[name] = t if rows is None else take_rows(t, rows)
        return out
