"""Labels of one token rollout: scores, KL rewards, advantages and value targets, computed
once and frozen (pure tensor code; docs/theory.md#token-layout).

``cfg`` is the run's :class:`ppokit.llm.training.config.LLMConfig`, read by field name
(labelling sits below training, docs/architecture.md#layers)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ppokit.core import (
    ADVANTAGES,
    AdvantageSpec,
    TokenSteps,
    broadcast_to_tokens,
    explained_variance,
    kl_k1,
    masked_mean,
    masked_whiten,
    token_advantages,
)
from ppokit.engine.recipe import estimator_options

from ..modeling.rollout import TokenRollout, shift_to_tokens
from .mismatch import correction

__all__ = ["Labels", "compute_labels", "advantage_spec", "overlong_penalty"]


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int,
                     penalty: float) -> torch.Tensor:
    """DAPO's soft overlong punishment, ``[B]`` (≤ 0): nothing up to ``max_new_tokens −
    buffer`` tokens, then a penalty growing linearly with the length to ``penalty`` at
    ``max_new_tokens`` (a completion cut there has reached it). ``buffer`` 0: none."""
    if buffer <= 0:
        return torch.zeros(lengths.shape, dtype=torch.float32)
    over = (lengths.float() - (max_new_tokens - buffer)).clamp(min=0.0)
    return -penalty * (over / buffer).clamp(max=1.0)


def advantage_spec(cfg) -> AdvantageSpec:
    """What the configuration's advantage estimator reads besides the rollout."""
    return AdvantageSpec(gamma=cfg.gamma, gae_lambda=cfg.gae_lambda,
                         group_size=cfg.samples_per_prompt,
                         normalize_std=bool(cfg.normalize_std),
                         options=estimator_options(cfg))


@dataclass
class Labels:
    """Frozen per-rollout training labels (``[B, L]`` unless noted)."""

    old_logp: torch.Tensor
    ref_logp: torch.Tensor | None  # None: not computed, no KL term reads it (β 0)
    loss_mask: torch.Tensor  # bool: action tokens that enter the losses
    advantages: torch.Tensor
    returns: torch.Tensor | None
    values: torch.Tensor | None
    scores: torch.Tensor  # [B] raw scores
    token_rewards: torch.Tensor  # [B, L] what the advantage estimator saw (ppo/reinforce++)
    kl_tokens: torch.Tensor  # [B, L] k1(old, ref) on action tokens (0 without ref_logp)
    stats: dict = field(default_factory=dict)
    is_weight: torch.Tensor | None = None  # [B, L] rollout_is=truncate: the tokens' weights


def compute_labels(cfg, roll: TokenRollout, scores: torch.Tensor, old_logp, ref_logp,
                   beta: float, values_after: torch.Tensor | None = None,
                   sampler_logp: torch.Tensor | None = None,
                   turn_rewards: torch.Tensor | None = None) -> Labels:
    """Rewards, advantages and value targets for one rollout (pure tensor code).

    ``values_after``: ``[B, L]`` critic output at each position (value of the state after
    reading that token), ``ppo`` only. ``scores``: ``[B]`` raw sequence scores.
    ``sampler_logp``: the sampler's log-probs of the action tokens, for the mismatch
    correction ``cfg.rollout_is`` (:mod:`ppokit.llm.labelling.mismatch`; ``old_logp`` is then the
    trainer's own): ``truncate`` gives the labels token weights, ``mask`` takes tokens out
    of the loss mask after the advantages are computed (a token-level estimator's returns
    still run over every action token).

    ``ref_logp``: ``None`` when no KL term reads it (β 0, or ``kl_mode`` none): the KL
    rewards are then 0 and the statistics leave out ``kl_ref``, which the trainer measures
    on a probe of the batch (:func:`ppokit.llm.training.frozen.reference_probe`).

    ``turn_rewards``: an agent run's ``[B, L]`` rewards, each turn's on its last token
    (``scores`` are then the episodes' returns, and ``roll.truncated`` the episodes that
    were cut): the token estimators see them as they are; with a critic, a truncated
    episode's return continues with the critic's value where it stopped, a terminated
    one's ends there — the double mask of environment training
    (docs/agents.md#credit-across-turns); ``truncation`` does not apply.
    """
    am = roll.action_mask
    trunc = roll.truncated
    bsz = am.shape[0]
    raw = scores.float()
    agent = turn_rewards is not None  # (truncation is the episode's: see the docstring)
    s, loss_mask, place_score = _shaped_scores(cfg, raw, am, trunc, agent)
    zero = torch.zeros((), dtype=old_logp.dtype)
    if ref_logp is None:
        if beta != 0 and cfg.kl_mode != "none":
            raise ValueError(f"compute_labels: a KL term (kl_mode {cfg.kl_mode!r}, beta "
                             f"{beta:g}) needs the reference's log-probs; got none")
        kl_tok = torch.zeros_like(old_logp)
    else:
        kl_tok = torch.where(am, kl_k1(old_logp, ref_logp), zero)
    kl_seq = kl_tok.sum(1)
    last = roll.last_action_index().clamp(min=0)
    has_action = am.any(1)
    if agent:
        score_tok = torch.where(am, turn_rewards.float(), 0.0)
    else:
        score_tok = torch.zeros(am.shape)
        score_tok[torch.arange(bsz), last] = torch.where(place_score & has_action, s, 0.0)
    use_kl_reward = cfg.kl_mode == "reward" and beta > 0
    kl_reward = -beta * kl_tok if use_kl_reward else torch.zeros_like(kl_tok)
    values = returns = None
    entry = ADVANTAGES.entry(cfg.advantage_estimator)  # a config value is a registry name
    spec = advantage_spec(cfg)
    token_rewards = score_tok + kl_reward
    if entry["layout"] == "groups":  # one advantage per sequence, on its action tokens
        seq = s - (beta * kl_seq if use_kl_reward else 0.0)
        adv = _group_advantages(entry, spec, seq, loss_mask)
    else:  # per token: the estimator's token form, or its step form on each completion
        boot = None
        if values_after is not None:
            values = shift_to_tokens(values_after[:, :-1]).detach()
            if cfg.truncation == "bootstrap" or agent:
                # an episode's value after its last token: the environment's reply when it
                # was cut at the context with the reply in (docs/agents.md#credit-across-turns)
                at = roll.last_token_index().clamp(min=0) if agent else last
                v_last = values_after.detach()[torch.arange(bsz), at]
                boot = torch.where(trunc & has_action, v_last, torch.zeros_like(v_last))
        adv, returns, values = _token_advantages(entry, spec, token_rewards, values,
                                                 loss_mask, boot, zero)
    is_weight, is_stats = None, {}
    if cfg.rollout_is != "none":
        if sampler_logp is None:
            raise ValueError("rollout_is: the rollout has no sampler log-probs to weigh")
        corr = correction(cfg.rollout_is, cfg.rollout_is_level, old_logp, sampler_logp,
                          loss_mask, cfg.rollout_is_threshold_lower, cfg.rollout_is_threshold)
        is_weight, loss_mask, is_stats = corr.weight, corr.keep, corr.stats
        if values is not None:
            values = torch.where(loss_mask, values, zero)
    # whitening (normalize_advantage) happens in the update engine, batch scope
    adv = torch.where(loss_mask, adv, zero)
    non_score = (kl_reward.sum(1) if use_kl_reward else torch.zeros(bsz))
    stats = _label_stats(cfg, raw, am, trunc, kl_tok, non_score, adv, loss_mask, is_stats,
                         agent, values, returns)
    if ref_logp is None:
        del stats["kl_ref"], stats["kl_ref_token"]
    return Labels(old_logp.detach(), None if ref_logp is None else ref_logp.detach(),
                  loss_mask, adv.detach(),
                  None if returns is None else returns.detach(), values, raw, token_rewards,
                  kl_tok, stats, None if is_weight is None else is_weight.detach())


def _shaped_scores(cfg, raw: torch.Tensor, am: torch.Tensor, trunc: torch.Tensor,
                   agent: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(scores, loss mask, where a score is placed)`` after ``score_norm``,
    ``score_clip`` and, outside agent runs, ``truncation`` (penalty: scores lowered;
    mask: truncated completions out of the loss; bootstrap: their scores not placed)."""
    s = raw.clone()
    if cfg.score_norm == "batch":
        s = masked_whiten(s)
    if cfg.score_clip is not None:
        s = s.clamp(-cfg.score_clip, cfg.score_clip)
    loss_mask = am.clone()
    place_score = torch.ones(am.shape[0], dtype=torch.bool)
    if not agent and cfg.truncation == "penalty":
        s = s - cfg.truncation_penalty * trunc.float()
    elif not agent and cfg.truncation == "mask":
        loss_mask &= ~trunc[:, None]
    elif not agent and cfg.truncation == "bootstrap":
        place_score = ~trunc
    return s, loss_mask, place_score


def _group_advantages(entry, spec: AdvantageSpec, seq: torch.Tensor,
                      loss_mask: torch.Tensor) -> torch.Tensor:
    """A sequence-level estimator's ``[B]`` advantages of the sequence rewards ``seq``,
    spread over each sequence's action tokens."""
    seq_adv = torch.as_tensor(entry.fn(seq, spec))
    if seq_adv.shape != seq.shape:
        raise ValueError(f"advantage estimator {entry.name!r}: expected [B] = "
                         f"{tuple(seq.shape)} advantages, got {tuple(seq_adv.shape)}")
    return broadcast_to_tokens(seq_adv, loss_mask)


def _token_advantages(entry, spec: AdvantageSpec, token_rewards: torch.Tensor,
                      values: torch.Tensor | None, loss_mask: torch.Tensor,
                      boot: torch.Tensor | None, zero: torch.Tensor):
    """A token-level estimator's ``(advantages, returns, values)``: returns only with a
    critic's ``values`` (which are zeroed off the loss mask), an error where the estimator
    gives the wrong shape or no returns for the critic."""
    vals = values if values is not None else torch.zeros_like(token_rewards)
    adv, returns = token_advantages(entry, TokenSteps(token_rewards, vals, loss_mask, boot),
                                    spec)
    if tuple(torch.as_tensor(adv).shape) != tuple(loss_mask.shape):
        raise ValueError(f"advantage estimator {entry.name!r}: expected [B, L] = "
                         f"{tuple(loss_mask.shape)} advantages, got "
                         f"{tuple(torch.as_tensor(adv).shape)}")
    if values is None:
        return adv, None, None  # no critic to regress
    if returns is None:
        raise ValueError(f"advantage estimator {entry.name!r} gives no returns, which "
                         f"the critic (use_critic) regresses on")
    return adv, returns, torch.where(loss_mask, values, zero)


def _label_stats(cfg, raw: torch.Tensor, am: torch.Tensor, trunc: torch.Tensor,
                 kl_tok: torch.Tensor, non_score: torch.Tensor, adv: torch.Tensor,
                 loss_mask: torch.Tensor, is_stats: dict, agent: bool,
                 values: torch.Tensor | None, returns: torch.Tensor | None) -> dict:
    """The rollout's statistics: scores, KL to the reference, lengths, advantages, the
    mismatch correction's (``is_stats``); groups
    of equal scores; the critic's fit. An agent's truncation is logged as
    episode/truncated_frac, not here."""
    bsz = raw.shape[0]
    stats = {
        "score_mean": float(raw.mean()),
        "score_std": float(raw.std()) if bsz > 1 else 0.0,
        "non_score_reward": float(non_score.mean()),
        "kl_ref": float(kl_tok.sum(1).mean()),
        "kl_ref_token": float(masked_mean(kl_tok, am)),
        "response_length_mean": float(am.sum(1).float().mean()),
        "truncated_frac": float(trunc.float().mean()),
        "advantage_mean": float(masked_mean(adv, loss_mask)),
        **is_stats,
    }
    if agent:
        del stats["truncated_frac"]
    if cfg.samples_per_prompt > 1 and bsz % cfg.samples_per_prompt == 0:
        # groups whose raw scores are all equal: a group estimator gives them advantage 0
        groups = raw.view(-1, cfg.samples_per_prompt)
        stats["zero_spread_frac"] = float((groups.amax(1) == groups.amin(1)).float().mean())
    if returns is not None:
        stats["explained_variance"] = explained_variance(values, returns, loss_mask)
        stats["return_mean"] = float(masked_mean(returns, loss_mask))
    return stats
