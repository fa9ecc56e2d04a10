"""Policy, value, entropy and KL loss terms, and how they are aggregated
(seed 000 §3.4–3.6, §5; design.md "PPO-Clip is one-sided per advantage sign").

Every function takes per-sample tensors — ``[M]`` for a minibatch of environment steps or
``[B, L]`` for tokens — with an optional ``mask`` of the same shape (1 = action), and returns
a *named* result; the caller sums the terms (:class:`LossTerms`). Labels (advantages, old
log-probs, value targets, old values) are detached here, so no gradient can flow into them.

Sign convention: every ``loss`` is something to **minimise**. The policy loss is
``−surrogate``; the entropy term is returned as the entropy itself (a bonus: the total
subtracts ``ent_coef · entropy``).

Aggregation modes (:func:`aggregate`) and their length bias, for ``[B, L]`` input:

``token-mean``
    ``Σ_{b,t} m·x / N_tok``. Every action token weighs the same, so long responses carry
    more total weight than short ones (a longer sequence gets proportionally more say).
    Micro-batch accumulation equals the full batch **only** when each micro-batch divides
    by the global token count (pass ``num_tokens``); with per-micro-batch counts it does not.
``seq-mean-token-sum``
    ``Σ_b (Σ_t m·x) / B``. A sequence's loss grows with its length: a strong bias toward
    long sequences (their gradient is larger). Accumulable with the global ``num_seqs``.
``seq-mean-token-mean``
    ``Σ_b (Σ_t m·x / n_b) / B``. Every sequence weighs the same, so each token of a short
    sequence weighs more than a token of a long one (original GRPO; penalises long wrong
    answers less per token). Accumulable with the global ``num_seqs`` as long as a sequence
    is never split across micro-batches.
``seq-mean-token-sum-norm``
    ``Σ_b Σ_t m·x / (B · L_norm)`` with a constant ``L_norm`` (default: L). Dr. GRPO's
    unbiased form: the same per-token weight everywhere, independent of batch composition.
    Accumulable with the global ``num_seqs`` and a fixed ``norm_length``.

For 1-D input each element is its own sequence of one action, so all modes give the masked
mean (``seq-mean-token-sum-norm`` with ``norm_length`` 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .kl import kl_estimate
from .validation import (
    Tensor,
    check_mask,
    check_nonempty,
    check_nonnegative,
    check_positive,
    check_same_shape,
    float_inputs,
)

__all__ = [
    "AGGREGATION_MODES",
    "aggregate",
    "PolicyLoss",
    "clipped_surrogate_loss",
    "vanilla_pg_loss",
    "value_loss",
    "entropy_bonus",
    "kl_penalty_loss",
    "LossTerms",
    "clip_fractions",
    "ratio_stats",
    "approx_kl",
]

AGGREGATION_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def aggregate(x: Tensor, mask: Tensor | None = None, mode: str = "token-mean", *,
              num_tokens: float | None = None, num_seqs: float | None = None,
              norm_length: float | None = None) -> Tensor:
    """Reduce a per-sample loss ``x`` (``[M]`` or ``[B, L]``) to a scalar (see module doc).

    ``num_tokens`` / ``num_seqs`` override the denominators with global counts, which is
    what makes micro-batch gradient accumulation exact; ``norm_length`` is the constant of
    ``seq-mean-token-sum-norm``.
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"mode: unknown aggregation mode {mode!r}; known: "
                         f"{', '.join(AGGREGATION_MODES)}")
    check_nonempty(x, "x")
    if x.ndim not in (1, 2):
        raise ValueError(f"x: expected shape [M] or [B, L], got {tuple(x.shape)}")
    if mask is None:
        m = torch.ones_like(x, dtype=torch.bool)
    else:
        m = check_mask(mask, x, "x")
    mf = m.to(x.dtype)
    xm = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if x.ndim == 1:
        if mode == "seq-mean-token-sum-norm":
            denom = (num_seqs if num_seqs is not None else x.shape[0]) * (norm_length or 1.0)
        elif mode == "token-mean":
            denom = num_tokens if num_tokens is not None else mf.sum().clamp(min=1)
        else:
            denom = num_seqs if num_seqs is not None else mf.sum().clamp(min=1)
        return xm.sum() / denom
    bsz, length = x.shape
    if mode == "token-mean":
        denom = num_tokens if num_tokens is not None else mf.sum().clamp(min=1)
        return xm.sum() / denom
    seqs = num_seqs if num_seqs is not None else bsz
    if mode == "seq-mean-token-sum":
        return xm.sum() / seqs
    if mode == "seq-mean-token-mean":
        per_seq = xm.sum(1) / mf.sum(1).clamp(min=1)
        return per_seq.sum() / seqs
    return xm.sum() / (seqs * (norm_length if norm_length is not None else length))


@dataclass
class PolicyLoss:
    """A policy-loss result: ``loss`` (scalar ``[]``) to minimise, ``per_sample`` and
    ``ratio`` (the input shape, ``[M]`` or ``[B, L]``), and detached scalar diagnostics."""

    loss: Tensor
    per_sample: Tensor
    ratio: Tensor
    stats: dict[str, Tensor] = field(default_factory=dict)


def _policy_inputs(logp, logp_old, advantages, mask):
    f = float_inputs({"logp": logp, "logp_old": logp_old, "advantages": advantages})
    lp, lpo, adv = f["logp"], f["logp_old"], f["advantages"]
    check_nonempty(lp, "logp")
    if lp.ndim not in (1, 2):
        raise ValueError(f"logp: expected shape [M] or [B, L], got {tuple(lp.shape)}")
    check_same_shape(lp, "logp", logp_old=lpo, advantages=adv)
    m = None if mask is None else check_mask(mask, lp, "logp")
    for name, t in (("logp", lp), ("logp_old", lpo), ("advantages", adv)):
        valid = t if m is None else torch.where(m, t, torch.zeros((), dtype=t.dtype))
        if not bool(torch.isfinite(valid.detach().sum())) and not bool(
                torch.isfinite(valid.detach()).all()):
            raise ValueError(f"{name}: expected finite values, found NaN or inf")
    return lp, lpo.detach(), adv.detach(), m


def clip_fractions(ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float,
                   mask: Tensor | None = None, dual_clip: float | None = None
                   ) -> tuple[Tensor, Tensor]:
    """``(clipfrac, clip_active_frac)`` over valid samples (seed 000 §5.1).

    ``clipfrac``: share with ``ρ`` outside ``[1−ε_low, 1+ε_high]`` (the Stable-Baselines3 /
    CleanRL statistic). ``clip_active_frac``: share whose surrogate gradient is really zero:
    ``Â > 0 and ρ > 1+ε_high``, or ``Â < 0 and ρ < 1−ε_low`` (or, with dual clip ``c``,
    ``Â < 0 and ρ > c``). A sample outside the range in the *wrong* direction still has a
    gradient: it is counted by the first, not the second.
    """
    with torch.no_grad():
        r = ratio.detach()
        outside = (r > 1 + clip_high) | (r < 1 - clip_low)
        active = ((advantages > 0) & (r > 1 + clip_high)) | ((advantages < 0) & (r < 1 - clip_low))
        if dual_clip is not None:
            active = active | ((advantages < 0) & (r > dual_clip))
        m = None if mask is None else mask
        return (_mean(outside.to(r.dtype), m), _mean(active.to(r.dtype), m))


def _mean(x: Tensor, m: Tensor | None) -> Tensor:
    if m is None:
        return x.mean()
    return torch.where(m, x, torch.zeros((), dtype=x.dtype)).sum() / m.sum().clamp(min=1)


def ratio_stats(ratio: Tensor, mask: Tensor | None = None) -> dict[str, Tensor]:
    """``ratio_min``, ``ratio_max``, ``ratio_mean`` over valid samples (detached scalars);
    ``ratio`` and ``mask`` share a shape, ``[M]`` or ``[B, L]``."""
    with torch.no_grad():
        r = ratio.detach()
        if mask is None:
            return {"ratio_min": r.min(), "ratio_max": r.max(), "ratio_mean": r.mean()}
        inf = torch.tensor(float("inf"), dtype=r.dtype)
        return {
            "ratio_min": torch.where(mask, r, inf).min(),
            "ratio_max": torch.where(mask, r, -inf).max(),
            "ratio_mean": _mean(r, mask),
        }


def approx_kl(logp_new, logp_old, mask=None, estimator: str = "k3") -> Tensor:
    """Mean sampled estimate of ``KL(π_old ‖ π_new)`` from actions drawn by ``π_old``.

    ``estimator``: ``"k3"`` (``(ρ−1) − log ρ``, non-negative; Stable-Baselines3's and
    CleanRL's ``approx_kl``), ``"k1"`` (``−log ρ``, unbiased, may be negative) or ``"k2"``.
    Detached; shapes ``[M]`` or ``[B, L]``.
    """
    with torch.no_grad():
        per = kl_estimate(torch.as_tensor(logp_old).detach(), torch.as_tensor(logp_new).detach(),
                          estimator)
        m = None if mask is None else check_mask(mask, per, "logp_new")
        return _mean(per, m)


def clipped_surrogate_loss(logp, logp_old, advantages, mask=None, *, clip_eps: float = 0.2,
                           clip_eps_high: float | None = None, dual_clip: float | None = None,
                           agg: str = "token-mean", num_tokens=None, num_seqs=None,
                           norm_length=None) -> PolicyLoss:
    """PPO-Clip: ``loss = −min(ρ Â, clip(ρ, 1−ε_low, 1+ε_high) Â)`` per sample, aggregated.

    Seed 000 §3.5: one-sided per advantage sign. ``ρ = exp(logp − logp_old)`` (never a
    division of probabilities).

    Args:
        logp: ``[M]`` or ``[B, L]`` log-probs of the taken actions under the current policy
            (with gradient).
        logp_old: same shape, frozen log-probs from the rollout (detached here).
        advantages: same shape, frozen advantages (detached here).
        mask: optional same-shape action mask.
        clip_eps: ``ε_low`` (and ``ε_high`` unless given), > 0.
        clip_eps_high: optional asymmetric upper ε (e.g. DAPO's "clip higher").
        dual_clip: optional ``c > 1``: for ``Â < 0`` the surrogate is floored at ``c Â``
            (Ye et al. 2020), bounding the loss of very large ratios on bad actions.
        agg, num_tokens, num_seqs, norm_length: see :func:`aggregate`.

    Returns: :class:`PolicyLoss` with ``stats``: ``clipfrac``, ``clip_active_frac``,
    ``approx_kl`` (k3), ``approx_kl_k1``, ``ratio_min/max/mean``.
    """
    eps_low = check_positive(clip_eps, "clip_eps")
    eps_high = eps_low if clip_eps_high is None else check_positive(clip_eps_high,
                                                                      "clip_eps_high")
    if dual_clip is not None and not float(dual_clip) > 1.0:
        raise ValueError(f"dual_clip: expected a number > 1, got {dual_clip!r}")
    lp, lpo, adv, m = _policy_inputs(logp, logp_old, advantages, mask)
    log_ratio = lp - lpo
    ratio = torch.exp(log_ratio)
    surr1 = ratio * adv
    surr2 = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    surr = torch.minimum(surr1, surr2)
    if dual_clip is not None:
        surr = torch.where(adv < 0, torch.maximum(surr, dual_clip * adv), surr)
    per = -surr
    loss = aggregate(per, m, agg, num_tokens=num_tokens, num_seqs=num_seqs,
                     norm_length=norm_length)
    stats = _policy_stats(log_ratio, ratio, adv, m, eps_low, eps_high, dual_clip)
    return PolicyLoss(loss=loss, per_sample=per, ratio=ratio, stats=stats)


def _policy_stats(log_ratio, ratio, adv, m, eps_low, eps_high, dual_clip):
    with torch.no_grad():
        lr = log_ratio.detach()
        r = ratio.detach()
        clipfrac, active = clip_fractions(r, adv, eps_low, eps_high, m, dual_clip)
        stats = {
            "clipfrac": clipfrac,
            "clip_active_frac": active,
            "approx_kl": _mean(torch.expm1(lr) - lr, m),
            "approx_kl_k1": _mean(-lr, m),
        }
        stats.update(ratio_stats(r, m))
    return stats


def vanilla_pg_loss(logp, logp_old, advantages, mask=None, *, agg: str = "token-mean",
                    num_tokens=None, num_seqs=None, norm_length=None) -> PolicyLoss:
    """Vanilla policy gradient ``loss = −log π(a|s) · Â`` (REINFORCE / A2C; seed 000 §3.1).

    Same inputs as :func:`clipped_surrogate_loss` (``[M]`` or ``[B, L]``, all one shape,
    with an optional same-shape mask); ``logp_old`` is used only for the
    diagnostics (ratio, approx KL). Its gradient equals that of ``−ρ Â`` at ``ρ = 1``.
    """
    lp, lpo, adv, m = _policy_inputs(logp, logp_old, advantages, mask)
    per = -lp * adv
    loss = aggregate(per, m, agg, num_tokens=num_tokens, num_seqs=num_seqs,
                     norm_length=norm_length)
    log_ratio = (lp - lpo).detach()
    ratio = log_ratio.exp()
    stats = _policy_stats(log_ratio, ratio, adv, m, float("inf"), float("inf"), None)
    return PolicyLoss(loss=loss, per_sample=per, ratio=ratio, stats=stats)


def value_loss(values, returns, mask=None, *, values_old=None, clip_range_vf: float | None = None,
               clip_mode: str = "max", half: bool = False, agg: str = "token-mean",
               num_tokens=None, num_seqs=None, norm_length=None) -> Tensor:
    """Critic regression loss (seed 000 §3.5–3.6).

    Unclipped: ``(V − R)²`` per sample, **without** a ½ unless ``half=True`` (this is
    Stable-Baselines3's ``F.mse_loss``, so ``vf_coef`` means the same as there).

    With ``clip_range_vf = c`` (needs ``values_old``, the frozen rollout values),
    ``V_clip = V_old + clip(V − V_old, −c, c)`` and:

    * ``clip_mode="max"`` (default; OpenAI baselines PPO2, CleanRL): ``max((V−R)², (V_clip−R)²)``
      — pessimistic, the same one-sided logic as the policy clip;
    * ``clip_mode="clipped"`` (Stable-Baselines3): ``(V_clip − R)²``.

    Shapes: ``values``, ``returns``, ``values_old``, ``mask`` all ``[M]`` or ``[B, L]``.
    ``returns`` and ``values_old`` are detached. Returns the aggregated scalar.
    """
    f = float_inputs({"values": values, "returns": returns})
    v, ret = f["values"], f["returns"].detach()
    check_nonempty(v, "values")
    check_same_shape(v, "values", returns=ret)
    m = None if mask is None else check_mask(mask, v, "values")
    if clip_mode not in ("max", "clipped"):
        raise ValueError(f"clip_mode: expected 'max' or 'clipped', got {clip_mode!r}")
    err = (v - ret) ** 2
    if clip_range_vf is not None:
        c = check_positive(clip_range_vf, "clip_range_vf")
        if values_old is None:
            raise ValueError("values_old: required when clip_range_vf is set")
        vo = float_inputs({"values_old": values_old})["values_old"].to(v.dtype).detach()
        check_same_shape(v, "values", values_old=vo)
        v_clip = vo + torch.clamp(v - vo, -c, c)
        err_clip = (v_clip - ret) ** 2
        err = torch.maximum(err, err_clip) if clip_mode == "max" else err_clip
    if half:
        err = 0.5 * err
    return aggregate(err, m, agg, num_tokens=num_tokens, num_seqs=num_seqs,
                     norm_length=norm_length)


def entropy_bonus(entropy, mask=None, *, agg: str = "token-mean", num_tokens=None,
                  num_seqs=None, norm_length=None) -> Tensor:
    """Aggregated policy entropy ``H(π(·|s))`` (``[M]`` or ``[B, L]`` per-sample entropies).

    A bonus: the total loss *subtracts* ``ent_coef ·`` this value."""
    e = float_inputs({"entropy": entropy})["entropy"]
    check_nonempty(e, "entropy")
    m = None if mask is None else check_mask(mask, e, "entropy")
    return aggregate(e, m, agg, num_tokens=num_tokens, num_seqs=num_seqs,
                     norm_length=norm_length)


def kl_penalty_loss(logp, logp_ref, mask=None, *, estimator: str = "k3",
                    agg: str = "token-mean", num_tokens=None, num_seqs=None,
                    norm_length=None) -> Tensor:
    """KL to a reference policy as a differentiable loss term (GRPO style).

    ``logp`` (current policy, with gradient) and ``logp_ref`` (frozen) of the sampled
    tokens, ``[M]`` or ``[B, L]``. Per sample ``estimator`` (default k3, non-negative) of
    ``KL(π ‖ π_ref)``, aggregated. This is the alternative to the per-token KL *reward*
    (k1 of old vs reference, folded into the rewards before GAE, never clamped).
    """
    f = float_inputs({"logp": logp, "logp_ref": logp_ref})
    lp, lr = f["logp"], f["logp_ref"].detach()
    check_same_shape(lp, "logp", logp_ref=lr)
    m = None if mask is None else check_mask(mask, lp, "logp")
    per = kl_estimate(lp, lr, estimator)
    return aggregate(per, m, agg, num_tokens=num_tokens, num_seqs=num_seqs,
                     norm_length=norm_length)


@dataclass
class LossTerms:
    """The named terms of one minibatch loss, each a scalar ``[]``. ``total`` combines them;
    each stays inspectable (and testable for where its gradient goes)."""

    policy: Tensor
    value: Tensor | None = None
    entropy: Tensor | None = None
    kl: Tensor | None = None

    def total(self, vf_coef: float = 0.5, ent_coef: float = 0.0, kl_coef: float = 0.0) -> Tensor:
        check_nonnegative(vf_coef, "vf_coef")
        out = self.policy
        if self.value is not None and vf_coef:
            out = out + vf_coef * self.value
        if self.entropy is not None and ent_coef:
            out = out - ent_coef * self.entropy
        if self.kl is not None and kl_coef:
            out = out + kl_coef * self.kl
        return out
