"""Labels of one token rollout: scores, KL rewards, advantages and value targets, computed
once and frozen (pure tensor code; docs/theory.md#token-layout)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ppokit.core import (
    broadcast_to_tokens,
    explained_variance,
    kl_k1,
    masked_mean,
    masked_whiten,
    reinforce_pp_advantages,
    token_gae,
)
from ppokit.core.registry import GROUP_ADVANTAGES

from .config import LLMConfig
from .rollout import TokenRollout, shift_to_tokens

__all__ = ["Labels", "compute_labels"]


@dataclass
class Labels:
    """Frozen per-rollout training labels (``[B, L]`` unless noted)."""

    old_logp: torch.Tensor
    ref_logp: torch.Tensor
    loss_mask: torch.Tensor  # bool: action tokens that enter the losses
    advantages: torch.Tensor
    returns: torch.Tensor | None
    values: torch.Tensor | None
    scores: torch.Tensor  # [B] raw scores
    token_rewards: torch.Tensor  # [B, L] what the advantage estimator saw (ppo/reinforce++)
    kl_tokens: torch.Tensor  # [B, L] k1(old, ref) on action tokens
    stats: dict = field(default_factory=dict)


def compute_labels(cfg: LLMConfig, roll: TokenRollout, scores: torch.Tensor, old_logp, ref_logp,
                   beta: float, values_after: torch.Tensor | None = None) -> Labels:
    """Rewards, advantages and value targets for one rollout (pure tensor code).

    ``values_after``: ``[B, L]`` critic output at each position (value of the state after
    reading that token), ``ppo`` only. ``scores``: ``[B]`` raw sequence scores.
    """
    am = roll.action_mask
    trunc = roll.truncated
    bsz, length = am.shape
    raw = scores.float()
    s = raw.clone()
    if cfg.score_norm == "batch":
        s = masked_whiten(s)
    if cfg.score_clip is not None:
        s = s.clamp(-cfg.score_clip, cfg.score_clip)
    loss_mask = am.clone()
    place_score = torch.ones(bsz, dtype=torch.bool)
    if cfg.truncation == "penalty":
        s = s - cfg.truncation_penalty * trunc.float()
    elif cfg.truncation == "mask":
        loss_mask &= ~trunc[:, None]
    elif cfg.truncation == "bootstrap":
        place_score = ~trunc
    zero = torch.zeros((), dtype=old_logp.dtype)
    kl_tok = torch.where(am, kl_k1(old_logp, ref_logp), zero)
    kl_seq = kl_tok.sum(1)
    last = roll.last_action_index().clamp(min=0)
    has_action = am.any(1)
    score_tok = torch.zeros(bsz, length)
    score_tok[torch.arange(bsz), last] = torch.where(place_score & has_action, s, 0.0)
    use_kl_reward = cfg.kl_mode == "reward" and beta > 0
    kl_reward = -beta * kl_tok if use_kl_reward else torch.zeros_like(kl_tok)
    values = returns = None
    est = cfg.advantage_estimator  # a config value is a registry name
    token_rewards = score_tok + kl_reward
    if est == "gae":
        values = shift_to_tokens(values_after[:, :-1]).detach()
        boot = None
        if cfg.truncation == "bootstrap":
            v_last = values_after.detach()[torch.arange(bsz), last]
            boot = torch.where(trunc & has_action, v_last, torch.zeros_like(v_last))
        adv, returns = token_gae(token_rewards, values, loss_mask, cfg.gamma, cfg.gae_lambda,
                                 bootstrap_values=boot)
        values = torch.where(loss_mask, values, zero)
    elif est == "reinforce_pp":
        adv = reinforce_pp_advantages(token_rewards, loss_mask, cfg.gamma)
    else:  # a group estimator: one advantage per sequence, broadcast to its action tokens
        seq = s - (beta * kl_seq if use_kl_reward else 0.0)
        opts = {"normalize_std": cfg.normalize_std} if est == "grpo" else {}
        seq_adv = GROUP_ADVANTAGES.get(est)(seq, cfg.samples_per_prompt, **opts)
        adv = broadcast_to_tokens(seq_adv, loss_mask)
    # whitening (normalize_advantage) happens in the update engine, batch scope
    adv = torch.where(loss_mask, adv, zero)
    non_score = (kl_reward.sum(1) if use_kl_reward else torch.zeros(bsz))
    stats = {
        "score_mean": float(raw.mean()),
        "score_std": float(raw.std()) if bsz > 1 else 0.0,
        "non_score_reward": float(non_score.mean()),
        "kl_ref": float(kl_seq.mean()),
        "kl_ref_token": float(masked_mean(kl_tok, am)),
        "response_length_mean": float(am.sum(1).float().mean()),
        "truncated_frac": float(trunc.float().mean()),
        "advantage_mean": float(masked_mean(adv, loss_mask)),
    }
    if cfg.samples_per_prompt > 1 and bsz % cfg.samples_per_prompt == 0:
        # groups whose raw scores are all equal: a group estimator gives them advantage 0
        groups = raw.view(-1, cfg.samples_per_prompt)
        stats["zero_spread_frac"] = float((groups.amax(1) == groups.amin(1)).float().mean())
    if returns is not None:
        stats["explained_variance"] = explained_variance(values, returns, loss_mask)
        stats["return_mean"] = float(masked_mean(returns, loss_mask))
    return Labels(old_logp.detach(), ref_logp.detach(), loss_mask, adv.detach(),
                  None if returns is None else returns.detach(), values, raw, token_rewards,
                  kl_tok, stats)
