"""Policy surrogates beyond PPO-Clip's token ratio: GSPO's sequence ratio and CISPO's
clipped, detached importance weight (docs/theory.md#sequence-ratios-and-clipped-weights).

Inputs as :func:`ppokit.core.clipped_surrogate_loss`: ``logp`` (with gradient),
``logp_old`` and ``advantages`` of one shape, ``[B, L]`` completions (or ``[M]``, read as
``[M, 1]``: each sample a sequence of one action), with an optional action ``mask``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .losses import PolicyLoss, aggregate, policy_inputs, policy_stats, valid_mean
from .validation import check_positive

__all__ = ["gspo_loss", "cispo_loss"]


def _rows(x: Tensor) -> Tensor:
    return x[:, None] if x.ndim == 1 else x


def gspo_loss(logp, logp_old, advantages, mask=None, *, clip_eps: float = 3e-4,
              clip_eps_high: float | None = 4e-4, token_level: bool = False,
              num_seqs=None, **_agg) -> PolicyLoss:
    """GSPO: one importance ratio per sequence, clipped per sequence.

    ``s_i = exp(mean over the completion's action tokens of log π_θ − log π_old)`` (the
    geometric mean of its token ratios: length-normalised, so its spread does not grow
    with the length), ``Â_i`` the mean of the row's token advantages (the sequence's
    advantage when it is broadcast, as the group estimators do), and

        loss = −(1/B) Σ_i min(s_i Â_i, clip(s_i, 1−ε_low, 1+ε_high) Â_i)

    over the ``B`` rows holding an action (``num_seqs``: a fixed count, for micro-batch
    accumulation). The clip range is the sequence ratio's, much narrower than a token
    ratio's (GSPO's defaults: ε_low 3e-4, ε_high 4e-4).

    ``token_level``: GSPO-token, whose token ratio ``sg(s_i) · π_θ(y_t)/sg(π_θ(y_t))`` has
    the value ``s_i`` and a gradient path through its own token only, so each token may
    carry its own advantage: ``−(1/B) Σ_i (1/n_i) Σ_t min(s_it Â_it, clip(s_it) Â_it)``.
    With every token of a row holding ``Â_i`` it equals GSPO in value and gradient.

    The aggregation mode of the configuration does not apply (GSPO defines its own
    normalisation). Statistics: ``clipfrac`` / ``clip_active_frac`` over sequences,
    ``ratio_min`` / ``ratio_max`` of the sequence ratios, ``approx_kl`` over tokens.
    """
    eps_low = check_positive(clip_eps, "clip_eps")
    eps_high = eps_low if clip_eps_high is None else check_positive(clip_eps_high,
                                                                      "clip_eps_high")
    lp, lpo, adv, m = policy_inputs(logp, logp_old, advantages, mask)
    lp2, lpo2, adv2 = _rows(lp), _rows(lpo), _rows(adv)
    m2 = torch.ones_like(lp2, dtype=torch.bool) if m is None else _rows(m)
    zero = torch.zeros((), dtype=lp2.dtype)
    log_ratio = torch.where(m2, lp2 - lpo2, zero)
    n = m2.sum(1)
    has = n > 0
    nf = n.clamp(min=1).to(lp2.dtype)
    seq_log_ratio = log_ratio.sum(1) / nf
    s = torch.exp(seq_log_ratio)  # [B], a gradient path through every token of the row
    seq_adv = torch.where(m2, adv2, zero).sum(1) / nf
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    seqs = float(has.sum().clamp(min=1)) if num_seqs is None else float(num_seqs)
    if token_level:
        tok_ratio = s.detach()[:, None] * torch.exp(lp2 - lp2.detach())
        surr = torch.minimum(tok_ratio * adv2, tok_ratio.clamp(lo, hi) * adv2)
        per_tok = torch.where(m2, -surr / nf[:, None], zero)
        loss = per_tok.sum() / seqs
    else:
        surr = torch.minimum(s * seq_adv, s.clamp(lo, hi) * seq_adv)
        per_seq = torch.where(has, -surr, zero)
        loss = per_seq.sum() / seqs
        per_tok = torch.where(m2, per_seq[:, None] / nf[:, None], zero)
    with torch.no_grad():
        sd = s.detach()
        outside = ((sd > hi) | (sd < lo)).to(lp2.dtype)
        active = (((seq_adv > 0) & (sd > hi)) | ((seq_adv < 0) & (sd < lo))).to(lp2.dtype)
        lr = log_ratio.detach()
        inf = torch.tensor(float("inf"), dtype=sd.dtype)
        stats = {
            "clipfrac": valid_mean(outside, has),
            "clip_active_frac": valid_mean(active, has),
            "approx_kl": valid_mean(torch.expm1(lr) - lr, m2),
            "approx_kl_k1": valid_mean(-lr, m2),
            "ratio_min": torch.where(has, sd, inf).min(),
            "ratio_max": torch.where(has, sd, -inf).max(),
            "ratio_mean": valid_mean(sd, has),
        }
    shape = lp.shape
    ratio = torch.where(m2, s[:, None].expand_as(lp2), zero + 1.0).reshape(shape)
    return PolicyLoss(loss=loss, per_sample=per_tok.reshape(shape), ratio=ratio, stats=stats)


def cispo_loss(logp, logp_old, advantages, mask=None, *, clip_eps: float | None = None,
               clip_eps_high: float = 0.28, agg: str = "token-mean", num_tokens=None,
               num_seqs=None, norm_length=None) -> PolicyLoss:
    """CISPO: every token keeps its gradient; its importance weight is clipped and detached.

        loss = −agg( sg(clip(ρ_t, 1−ε_low, 1+ε_high)) · Â_t · log π_θ(y_t) )

    with ``ρ_t = exp(log π_θ − log π_old)``. Unlike PPO-Clip, a token whose ratio left the
    range is not dropped from the gradient: its weight stops growing instead. ``clip_eps``
    ``None`` (the default, as CISPO is usually run): no lower bound, the weight only capped
    above at ``1+ε_high``. Its gradient is ``−sg(w_t) Â_t ∇log π_θ(y_t)``; the loss value
    itself carries ``log π_θ`` and is read through its gradient, not its level.

    Statistics: ``clipfrac`` is the share of weights the clip changed; ``clip_active_frac``
    is 0 (no token loses its gradient).
    """
    eps_high = check_positive(clip_eps_high, "clip_eps_high")
    eps_low = float("inf") if clip_eps is None else check_positive(clip_eps, "clip_eps")
    lp, lpo, adv, m = policy_inputs(logp, logp_old, advantages, mask)
    log_ratio = lp - lpo
    ratio = torch.exp(log_ratio)
    lo = max(1.0 - eps_low, 0.0)
    weight = ratio.detach().clamp(min=lo, max=1.0 + eps_high)
    per = -weight * adv * lp
    loss = aggregate(per, m, agg, num_tokens=num_tokens, num_seqs=num_seqs,
                     norm_length=norm_length)
    stats = policy_stats(log_ratio, ratio, adv, m, eps_low, eps_high, None)
    stats["clip_active_frac"] = torch.zeros((), dtype=ratio.dtype)
    return PolicyLoss(loss=loss, per_sample=per, ratio=ratio, stats=stats)
