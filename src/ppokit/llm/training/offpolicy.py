"""Off-policy settings of the token trainer: where PPO's old log-probs come from, the
rollout-training mismatch correction (``rollout_is``) and generation overlapped with
training (``max_staleness``) — a section of
:class:`ppokit.llm.training.config.LLMConfig`, with its defaults and its checks.

The three meet in one weight. The tokens of a batch were drawn by a *behaviour* policy: the
sampler in another number format than the trainer (the mismatch), or, with
``max_staleness = K ≥ 1``, the policy as it was up to ``K`` updates ago. PPO's ratio is
taken against the *proximal* policy: the trainer's own log-probs of the batch at the start
of this update (``old_logprobs = "recompute"``). The correction reweighs each token by
``π_prox / π_behav`` (``truncate``: capped at ``rollout_is_threshold``; ``mask``: tokens
outside the band leave the loss) — the decoupled PPO objective
(docs/real_models.md#7-generation-overlapped-with-training).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ppokit.engine.recipe import COEF_MAX
from ppokit.errors import UsageError
from ppokit.settings import fail, setting

__all__ = ["OffPolicySettings", "MAX_STALENESS", "resolve_off_policy", "check_off_policy"]

MAX_STALENESS = 64  # policy versions a batch may lag behind the policy it trains


@dataclass(frozen=True)
class OffPolicySettings:
    """Which policy the batch's tokens come from and how the loss weighs them."""

    old_logprobs: str | None = setting(None, "PPO's old log-probs: sampler (those the sampler "
                                       "drew each token with; no extra forward pass) | "
                                       "recompute (the trainer's forward pass over the batch "
                                       "after sampling; default: recompute with rollout_is or "
                                       "max_staleness, else sampler)",
                                       choices=("sampler", "recompute"))
    rollout_is: str = setting("none", "rollout-training mismatch correction: none | truncate "
                              "(token weight min(pi_old/pi_sampler, threshold)) | mask (tokens "
                              "or sequences whose ratio leaves [threshold_lower, threshold] "
                              "leave the loss); docs/llm_algorithms.md; with max_staleness "
                              ">= 1, none means truncate", choices=("none", "truncate", "mask"))
    rollout_is_level: str = setting("token", "rollout_is: per token | sequence (the geometric "
                                    "mean of its tokens' ratios)", choices=("token", "sequence"))
    rollout_is_threshold: float = setting(2.0, "rollout_is: the ratio's cap (truncate) or "
                                          "upper bound (mask), also the bound of the logged "
                                          "mismatch_frac_outside; set only with rollout_is",
                                          bounds=(1.0, COEF_MAX, False))
    rollout_is_threshold_lower: float | None = setting(None, "rollout_is=mask: the lower bound "
                                                       "(default: 1 / threshold)",
                                                       bounds=(0.0, 1.0, False))
    max_staleness: int = setting(0, "generation overlapped with training: the engine samples "
                                 "the next batches, with weights up to this many updates old, "
                                 "while the trainer trains on this one; the loss weighs them "
                                 "by rollout_is (decoupled PPO). 0: generate, then train "
                                 "(docs/real_models.md#7-generation-overlapped-with-training)",
                                 bounds=(0, MAX_STALENESS, False))


def resolve_off_policy(cfg):
    """The section's defaults: with ``max_staleness ≥ 1`` the correction is on
    (``truncate`` unless ``mask`` is asked for); the old log-probs are recomputed whenever
    a correction weighs them against the sampler's."""
    k = cfg.max_staleness
    if isinstance(k, int) and not isinstance(k, bool) and k > 0 and cfg.rollout_is == "none":
        cfg = replace(cfg, rollout_is="truncate")
    if cfg.old_logprobs is None:
        cfg = replace(cfg, old_logprobs="sampler" if cfg.rollout_is == "none"
                      else "recompute")
    if cfg.rollout_is_threshold_lower is None and isinstance(
            cfg.rollout_is_threshold, (int, float)) and cfg.rollout_is_threshold > 0:
        cfg = replace(cfg, rollout_is_threshold_lower=1.0 / cfg.rollout_is_threshold)
    return cfg


def check_off_policy(cfg) -> None:
    """The section's rules, once every field has a valid value of its own."""
    _check_rollout_is_settings(cfg)
    if cfg.max_staleness > 0:
        _check_staleness(cfg)
    if cfg.rollout_is != "none" and cfg.old_logprobs != "recompute":
        raise UsageError("rollout_is: a mismatch correction weighs the trainer's old "
                         "log-probs against the sampler's, so it needs "
                         "old_logprobs=recompute (its default with rollout_is)")
    if cfg.rollout_is_threshold_lower >= cfg.rollout_is_threshold:
        raise UsageError(f"rollout_is_threshold_lower: expected a bound below "
                         f"rollout_is_threshold={cfg.rollout_is_threshold:g}, got "
                         f"{cfg.rollout_is_threshold_lower:g}")


def _check_staleness(cfg) -> None:
    """What generation ahead of training cannot go with (one line each, naming the
    setting)."""
    k = cfg.max_staleness
    for refused, why in (
            (cfg.old_logprobs == "sampler", "old_logprobs=sampler: the sampler's log-probs "
             "are the behaviour policy's, up to K updates old; the proximal ones are "
             "recomputed (old_logprobs=recompute)"),
            (cfg.dynamic_sampling, "dynamic_sampling: its extra rounds are sampled within "
             "the iteration, by the current policy"),
            (cfg.env is not None, "env: an agent's turns are sampled by the trainer, turn "
             "by turn"),
            (cfg.fsdp, "fsdp: the sharded policy generates only with every rank taking "
             "part")):
        if refused:
            raise UsageError(f"max_staleness: {k} is not offered with {why}; use "
                             f"max_staleness=0")


def _check_rollout_is_settings(cfg) -> None:
    """The settings of a mismatch correction apply only with one: set without
    ``rollout_is`` they would change nothing but a logged bound, so they are refused."""
    if cfg.rollout_is != "none":
        return
    default = {f.name: f.default for f in fields(OffPolicySettings)}
    lower = cfg.rollout_is_threshold_lower
    for name, changed in (
            ("rollout_is_threshold", cfg.rollout_is_threshold != default["rollout_is_threshold"]),
            ("rollout_is_threshold_lower", lower is not None
             and lower != 1.0 / cfg.rollout_is_threshold),
            ("rollout_is_level", cfg.rollout_is_level != default["rollout_is_level"])):
        if changed:
            fail(name, "applies only with rollout_is (--rollout-is truncate or mask), which is "
                 "none here", show=False)
