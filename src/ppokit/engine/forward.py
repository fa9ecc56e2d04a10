"""The environment trainer's forward adapter (:func:`policy_forward`: the policy evaluated
on a minibatch's observations, actions and, where the env gives them, action masks) and the
eager reference step the fused one is held to (:func:`reference_step`)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from .update import Forward, UpdateSpec, eager_minibatch_step

__all__ = ["policy_forward", "reference_step"]


def policy_forward(policy: nn.Module) -> Callable[[dict], Forward]:
    """The environment trainer's forward adapter: the policy evaluated on a minibatch's
    observations and actions (with their action masks and, for a centralised critic, the
    global states, where the rollout holds them)."""
    def forward(rows: dict) -> Forward:
        masks = rows.get("action_masks")  # (rollouts of an env that gives masks)
        kw = {} if rows.get("states") is None else {"state": rows["states"]}
        if masks is None:
            logp, ent, v = policy.evaluate(rows["obs"], rows["actions"], **kw)
        else:
            logp, ent, v = policy.evaluate(rows["obs"], rows["actions"], masks, **kw)
        return Forward(logp, ent, v)
    return forward


def reference_step(spec: UpdateSpec, policy: nn.Module, optimizer, mb: dict, *,
                   clip_range: float, kl_limit: float | None = None):
    """The eager minibatch step the fused one is held to (no trainer object involved)."""
    params = [p for p in policy.parameters() if p.requires_grad]
    return eager_minibatch_step(spec, policy_forward(policy), optimizer, params, mb,
                                clip_range=clip_range, kl_limit=kl_limit)
