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
from ppokit.core.options import EMPTY, OPTION_TABLES, Options, resolve
from ppokit.core.registry import ADVANTAGES, POLICY_LOSSES
from ppokit.plugins import names_checked
from ppokit.settings import setting

from .update import NORM_SCOPES, TARGET_KL_CHECKS, VALUE_CLIP_MODES, UpdateSpec

__all__ = ["RECIPE", "COEF_MAX", "recipe", "spec_of", "options_of", "estimator_options",
           "checked_options", "OPTION_TABLES"]

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
    # the parts' own options (ppokit.core.options)
    "loss_options": dict(expected="a table of the policy loss's options", help=(
        "the policy loss's own options, those its registration declares: --set "
        "loss_options.NAME=VALUE (or a JSON object); the loss reads spec.options")),
    "advantage_options": dict(expected="a table of the advantage estimator's options", help=(
        "the advantage estimator's own options, those its registration declares: --set "
        "advantage_options.NAME=VALUE (or a JSON object); the estimator reads spec.options")),
}


def recipe(name: str, default: Any, note: str = "", **override: Any) -> Any:
    """The configuration field ``name`` of the recipe with ``default``: the declared help
    (followed by ``note``, e.g. where a preset sets the default), bounds and allowed
    values; ``override`` replaces a part (a trainer's narrower registry view)."""
    decl = {**RECIPE[name], **override}
    text = decl.pop("help") + (f" ({note})" if note else "")
    if isinstance(default, dict):  # a table: each configuration its own
        return setting(help=text, default_factory=lambda: dict(default), **decl)
    return setting(default, text, **decl)


def spec_of(config: Any, **derived: Any) -> UpdateSpec:
    """The :class:`UpdateSpec` of a configuration: each of the spec's fields is the
    configuration's attribute of the same name, unless ``derived`` gives it (what the
    trainer computes: the loss's KL anchor, the controller's beta, the critic in use); a
    field the configuration does not have keeps the spec's default."""
    values: dict[str, Any] = {}
    if hasattr(config, "loss_options") and "options" not in derived:
        values["options"] = options_of(config, "loss_options")
    for f in fields(UpdateSpec):
        if f.name in derived:
            values[f.name] = derived[f.name]
        elif hasattr(config, f.name):
            values[f.name] = getattr(config, f.name)
    return UpdateSpec(**values)


_REGISTRIES = {"loss_options": POLICY_LOSSES, "advantage_options": ADVANTAGES}


def options_of(config: Any, table: str) -> Options:
    """The options the configuration's policy loss (``table="loss_options"``) or advantage
    estimator (``"advantage_options"``) runs with: its registration's defaults, replaced by
    the configuration's table (:func:`ppokit.core.options.resolve`: an undeclared option or
    a wrong type is a :class:`~ppokit.errors.UsageError` naming it)."""
    part, kind = OPTION_TABLES[table]
    name = getattr(config, part)
    declared = _REGISTRIES[table].entry(name).get("options", EMPTY)
    return resolve(table, kind, name, declared, getattr(config, table, None))


def estimator_options(config: Any) -> Options:
    """The options the configuration's advantage estimator runs with
    (``AdvantageSpec.options``)."""
    return options_of(config, "advantage_options")


def checked_options(config: Any) -> dict[str, dict[str, Any]]:
    """The configuration's option tables with each value of its option's type (a text
    from ``--set`` read as it), checked against the selected parts' declarations; a table
    whose part is not registered (a run read without its module) is kept as it is."""
    out = {}
    for table, (part, _) in OPTION_TABLES.items():
        given = getattr(config, table)
        name = getattr(config, part)
        if not names_checked() or name not in _REGISTRIES[table]:
            out[table] = given
            continue
        full = options_of(config, table)
        out[table] = {k: full[k] for k in given}
    return out
