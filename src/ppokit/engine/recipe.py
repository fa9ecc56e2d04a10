"""The update recipe, declared once: each hyperparameter of an update and of the advantage
estimate — its help, bounds and allowed values — as both configurations embed it
(:class:`ppokit.TrainConfig` and :class:`ppokit.llm.LLMConfig` declare these fields with
:func:`recipe`, so ``--help``, ``--set`` parsing and validation say the same for both),
and :func:`spec_of`, the one way a configuration becomes an :class:`UpdateSpec`.

The allowed values of ``policy_loss`` and ``advantage_estimator`` are the registries'
names (:mod:`ppokit.core.registry`): registering a loss or an estimator makes it a value of
both configurations."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ppokit.core.kl import KL_LOSS_ESTIMATORS
from ppokit.core.losses import AGGREGATION_MODES
from ppokit.core.registry import ADVANTAGES, POLICY_LOSSES
from ppokit.settings import setting

from .update import NORM_SCOPES, TARGET_KL_CHECKS, VALUE_CLIP_MODES, UpdateSpec

__all__ = ["RECIPE", "COEF_MAX", "recipe", "spec_of"]

# Coefficients stay within COEF_MAX so that their products with the losses stay finite in
# float32.
COEF_MAX = 1e6
_POSITIVE = (0.0, COEF_MAX, True)  # (low, high, low_is_open)
_NONNEGATIVE = (0.0, COEF_MAX, False)

RECIPE: dict[str, dict[str, Any]] = {
    # the policy term
    "policy_loss": dict(choices=POLICY_LOSSES, help=(
        "the surrogate: clip (PPO-Clip), vanilla (-logp*A), kl_penalty (ratio*A - "
        "beta*KL(old||new); environments), gspo, gspo_token, cispo (sequence and weight "
        "clipping; language models), or one registered with ppokit.register_policy_loss")),
    "clip_range": dict(bounds=_POSITIVE, help="PPO clip epsilon (the lower one with "
                       "clip_range_high; the initial value when scheduled)"),
    "clip_range_high": dict(bounds=_POSITIVE, help="upper clip epsilon (none: clip_range)"),
    "agg": dict(choices=AGGREGATION_MODES, help="aggregation of the policy, entropy and KL "
                "terms over tokens and sequences (ppokit.core.aggregate)"),
    "ent_coef": dict(bounds=_NONNEGATIVE, help="entropy bonus coefficient"),
    # the value term
    "use_critic": dict(help="learn a value function (baseline and bootstrap)"),
    "vf_coef": dict(bounds=_NONNEGATIVE, help="value-loss coefficient (the value loss is "
                    "(V-R)^2, no 1/2)"),
    "clip_range_vf": dict(bounds=_POSITIVE, help="value clipping range around the "
                          "rollout's values (none: off)"),
    "value_clip_mode": dict(choices=VALUE_CLIP_MODES, help="with clip_range_vf: max "
                            "(pessimistic) or clipped (SB3)"),
    # the KL term
    "kl_coef": dict(bounds=_NONNEGATIVE, help="beta: the KL term's weight (kl_penalty: its "
                    "initial value)"),
    "kl_target": dict(bounds=_POSITIVE, help="the KL an adaptive beta aims for (x/÷2 "
                      "outside 1.5x; PPO paper)"),
    "kl_estimator": dict(choices=tuple(KL_LOSS_ESTIMATORS), help=(
        "the KL term's per-token estimator against the reference: k2 (1/2 (log pi - log "
        "pi_ref)^2; expected gradient that of KL(pi || pi_ref), the KL penalised) | k3 "
        "(GRPO's pi_ref/pi - 1 - log(pi_ref/pi); unbiased value, but expected gradient "
        "that of KL(pi_ref || pi))")),
    # the optimiser's steps
    "learning_rate": dict(bounds=(0.0, 10.0, True), help="optimiser learning rate (the "
                          "initial value when scheduled)"),
    "n_epochs": dict(bounds=(1, 100_000, False), help="passes over each rollout"),
    "grad_accum": dict(bounds=(1, 2**20, False), help="micro-batches per minibatch "
                       "(gradient accumulation)"),
    "max_grad_norm": dict(bounds=_POSITIVE, help="global gradient-norm clip over every "
                          "trained parameter (none: off)"),
    "target_kl": dict(bounds=_POSITIVE, help="stop the update early when approx KL (k3) "
                      "exceeds this (none: off)"),
    "target_kl_check": dict(choices=TARGET_KL_CHECKS, help="minibatch: before each step vs "
                            "1.5*target_kl (SB3); epoch: after each epoch vs target_kl"),
    "normalize_advantage": dict(help="whiten advantages (ddof 1)"),
    "advantage_norm_scope": dict(choices=NORM_SCOPES, help="where advantages are "
                                 "whitened: minibatch or batch"),
    # the advantage estimate
    "advantage_estimator": dict(choices=ADVANTAGES, help=(
        "gae, reward_to_go (both trainers), reinforce_pp, grpo, dr_grpo, rloo (language "
        "models), or one registered with ppokit.register_advantage_estimator")),
    "gamma": dict(bounds=(0.0, 1.0, False), help="discount factor (per action token for "
                  "language models)"),
    "gae_lambda": dict(bounds=(0.0, 1.0, False), help="GAE lambda (1: Monte-Carlo "
                       "advantage with bootstrap)"),
}


def recipe(name: str, default: Any, note: str = "", **override: Any) -> Any:
    """The configuration field ``name`` of the recipe with ``default``: the declared help
    (followed by ``note``, e.g. where a preset sets the default), bounds and allowed
    values; ``override`` replaces a part (a trainer's narrower registry view)."""
    decl = {**RECIPE[name], **override}
    text = decl.pop("help") + (f" ({note})" if note else "")
    return setting(default, text, **decl)


def spec_of(config: Any, **derived: Any) -> UpdateSpec:
    """The :class:`UpdateSpec` of a configuration: each of the spec's fields is the
    configuration's attribute of the same name, unless ``derived`` gives it (what the
    trainer computes: the loss's KL anchor, the controller's beta, the critic in use); a
    field the configuration does not have keeps the spec's default."""
    values = {}
    for f in fields(UpdateSpec):
        if f.name in derived:
            values[f.name] = derived[f.name]
        elif hasattr(config, f.name):
            values[f.name] = getattr(config, f.name)
    return UpdateSpec(**values)
