"""Policy, value, entropy and KL loss terms, and how they are aggregated.

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

A *sequence* is a row that holds at least one action: by default the ``seq-mean`` modes
divide by the number of such rows (a row whose every position is masked contributes nothing
and does not count); pass ``num_seqs`` for a fixed count instead (micro-batch accumulation,
or a batch size that stays the same whatever is masked).

1-D input ``[M]`` is the ``[M, 1]`` layout: each element is a sequence of at most one action
(``L`` = 1, so ``norm_length`` defaults to 1). Every mode then gives the masked mean: a
masked element is neither a token nor a sequence.

Masked positions
----------------
Masked positions never reach a loss or its gradient, whatever they hold (NaN, ±inf, 1e6):
every loss term replaces them by a neutral value *before* any arithmetic, so the backward
pass has no ``0 · inf`` to evaluate and their gradient is exactly 0. The valid positions are
checked the same way by every term: a NaN or inf there is a :class:`ValueError` naming the
argument, never a silent NaN loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .kl import DEFAULT_KL_LOSS_ESTIMATOR, KL_LOSS_ESTIMATORS, kl_estimate
from .validation import (
    NonFiniteError,
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
    "ppo_kl_penalty_loss",
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
              norm_length: float | None = None, agg: str | None = None) -> Tensor:
    """Reduce a per-sample loss ``x`` (``[M]`` or ``[B, L]``) to a scalar (see module doc).

    ``num_tokens`` / ``num_seqs`` override the denominators with global counts, which is
    what makes micro-batch gradient accumulation exact; ``norm_length`` is the constant of
    ``seq-mean-token-sum-norm``. By default ``num_tokens`` is the number of valid positions
    and ``num_seqs`` the number of rows holding at least one; ``[M]`` is read as ``[M, 1]``,
    so every mode gives the masked mean there. Masked positions of ``x`` are never read.
    ``agg``: ``mode`` by the name the losses' keywords use, so a policy loss passes the
    engine's ``**agg`` on unchanged.
    """
    if agg is not None:
        mode = agg
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"mode: unknown aggregation mode {mode!r}; known: "
                         f"{', '.join(AGGREGATION_MODES)}")
    check_nonempty(x, "x")
    if x.ndim not in (1, 2):
        raise ValueError(f"x: expected shape [M] or [B, L], got {tuple(x.shape)}")
    m = None if mask is None else check_mask(mask, x, "x")
    if x.ndim == 1:  # the [M, 1] layout: each element a sequence of at most one action
        x = x[:, None]
        m = None if m is None else m[:, None]
    bsz, length = x.shape
    if m is None:
        xm = x
        n_tok = x.new_tensor(float(x.numel()))
        n_seq = x.new_tensor(float(bsz))
    else:
        xm = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
        per_row = m.sum(1)
        n_tok = per_row.sum().clamp(min=1).to(x.dtype)
        n_seq = (per_row > 0).sum().clamp(min=1).to(x.dtype)
    if mode == "token-mean":
        return xm.sum() / (num_tokens if num_tokens is not None else n_tok)
    seqs = num_seqs if num_seqs is not None else n_seq
    if mode == "seq-mean-token-sum":
        return xm.sum() / seqs
    if mode == "seq-mean-token-mean":
        n_row = x.new_tensor(float(length)) if m is None else per_row.clamp(min=1).to(x.dtype)
        return (xm.sum(1) / n_row).sum() / seqs
    return xm.sum() / (seqs * (norm_length if norm_length is not None else length))


@dataclass
class PolicyLoss:
    """A policy-loss result: ``loss`` (scalar ``[]``) to minimise, ``per_sample`` and
    ``ratio`` (the input shape, ``[M]`` or ``[B, L]``), and detached scalar diagnostics."""

    loss: Tensor
    per_sample: Tensor
    ratio: Tensor
    stats: dict[str, Tensor] = field(default_factory=dict)


def _valid_only(t: Tensor, m: Tensor | None, name: str) -> Tensor:
    """``t`` with every masked position set to 0, after checking that every valid position
    is finite (a :class:`ValueError` naming ``name`` otherwise).

    ``torch.where`` picks rather than multiplies, so neither the forward pass nor the
    backward pass ever touches what a masked position held: its gradient is exactly 0.
    """
    if m is not None:
        t = torch.where(m, t, torch.zeros((), dtype=t.dtype, device=t.device))
    d = t.detach()
    # one reduction in the common case; the full elementwise test only when the sum is not
    # finite (which large finite values can also cause)
    if not bool(torch.isfinite(d.sum())) and not bool(torch.isfinite(d).all()):
        where = "valid " if m is not None else ""
        raise NonFiniteError(f"{name}: expected finite values at {where}positions, found "
                             "NaN or inf")
    return t


def _masked_terms(names_values: dict, mask, ref: str, layout: str = "[M] or [B, L]"
                  ) -> tuple[dict[str, Tensor], Tensor | None]:
    """The float inputs of one loss term, all of ``ref``'s shape, with masked positions
    replaced by 0 and valid positions checked finite (see :func:`_valid_only`)."""
    f = float_inputs(names_values)
    r = f[ref]
    check_nonempty(r, ref)
    if r.ndim not in (1, 2):
        raise ValueError(f"{ref}: expected shape {layout}, got {tuple(r.shape)}")
    check_same_shape(r, ref, **{k: v for k, v in f.items() if k != ref})
    m = None if mask is None else check_mask(mask, r, ref)
    return {k: _valid_only(v, m, k) for k, v in f.items()}, m


def policy_inputs(logp, logp_old, advantages, mask):
    f, m = _masked_terms({"logp": logp, "logp_old": logp_old, "advantages": advantages},
                         mask, "logp")
    return f["logp"], f["logp_old"].detach(), f["advantages"].detach(), m


def clip_fractions(ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float,
                   mask: Tensor | None = None, dual_clip: float | None = None
                   ) -> tuple[Tensor, Tensor]:
    """``(clipfrac, clip_active_frac)`` over valid samples.

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
        return (valid_mean(outside.to(r.dtype), m), valid_mean(active.to(r.dtype), m))


def valid_mean(x: Tensor, m: Tensor | None) -> Tensor:
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
            "ratio_mean": valid_mean(r, mask),
        }


def approx_kl(logp_new, logp_old, mask=None, estimator: str = "k3") -> Tensor:
    """Mean sampled estimate of ``KL(π_old ‖ π_new)`` from actions drawn by ``π_old``.

    ``estimator``: ``"k3"`` (``(ρ−1) − log ρ``, non-negative; Stable-Baselines3's and
    CleanRL's ``approx_kl``), ``"k1"`` (``−log ρ``, unbiased, may be negative) or ``"k2"``.
    Detached; shapes ``[M]`` or ``[B, L]``; masked positions are never read.
    """
    with torch.no_grad():
        f, m = _masked_terms({"logp_new": torch.as_tensor(logp_new).detach(),
                              "logp_old": torch.as_tensor(logp_old).detach()}, mask, "logp_new")
        per = kl_estimate(f["logp_old"], f["logp_new"], estimator)
        return valid_mean(per, m)


def clipped_surrogate_loss(logp, logp_old, advantages, mask=None, *, clip_eps: float = 0.2,
                           clip_eps_high: float | None = None, dual_clip: float | None = None,
                           agg: str = "token-mean", num_tokens=None, num_seqs=None,
                           norm_length=None) -> PolicyLoss:
    """PPO-Clip: ``loss = −min(ρ Â, clip(ρ, 1−ε_low, 1+ε_high) Â)`` per sample, aggregated.

    One-sided per advantage sign. ``ρ = exp(logp − logp_old)`` (never a
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
    lp, lpo, adv, m = policy_inputs(logp, logp_old, advantages, mask)
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
    stats = policy_stats(log_ratio, ratio, adv, m, eps_low, eps_high, dual_clip)
    return PolicyLoss(loss=loss, per_sample=per, ratio=ratio, stats=stats)


def policy_stats(log_ratio, ratio, adv, m, eps_low, eps_high, dual_clip):
    with torch.no_grad():
        lr = log_ratio.detach()
        r = ratio.detach()
        clipfrac, active = clip_fractions(r, adv, eps_low, eps_high, m, dual_clip)
        stats = {
            "clipfrac": clipfrac,
            "clip_active_frac": active,
            "approx_kl": valid_mean(torch.expm1(lr) - lr, m),
            "approx_kl_k1": valid_mean(-lr, m),
        }
        stats.update(ratio_stats(r, m))
    return stats


def vanilla_pg_loss(logp, logp_old, advantages, mask=None, *, agg: str = "token-mean",
                    num_tokens=None, num_seqs=None, norm_length=None) -> PolicyLoss:
    """Vanilla policy gradient ``loss = −log π(a|s) · Â`` (REINFORCE / A2C).

    Same inputs as :func:`clipped_surrogate_loss` (``[M]`` or ``[B, L]``, all one shape,
    with an optional same-shape mask); ``logp_old`` is used only for the
    diagnostics (ratio, approx KL). Its gradient equals that of ``−ρ Â`` at ``ρ = 1``.
    """
    lp, lpo, adv, m = policy_inputs(logp, logp_old, advantages, mask)
    per = -lp * adv
    loss = aggregate(per, m, agg, num_tokens=num_tokens, num_seqs=num_seqs,
                     norm_length=norm_length)
    log_ratio = (lp - lpo).detach()
    ratio = log_ratio.exp()
    stats = policy_stats(log_ratio, ratio, adv, m, float("inf"), float("inf"), None)
    return PolicyLoss(loss=loss, per_sample=per, ratio=ratio, stats=stats)


def value_loss(values, returns, mask=None, *, values_old=None, clip_range_vf: float | None = None,
               clip_mode: str = "max", half: bool = False, agg: str = "token-mean",
               num_tokens=None, num_seqs=None, norm_length=None) -> Tensor:
    """Critic regression loss.

    Unclipped: ``(V − R)²`` per sample, **without** a ½ unless ``half=True`` (this is
    Stable-Baselines3's ``F.mse_loss``, so ``vf_coef`` means the same as there).

    With ``clip_range_vf = c`` (needs ``values_old``, the frozen rollout values),
    ``V_clip = V_old + clip(V − V_old, −c, c)`` and:

    * ``clip_mode="max"`` (default; OpenAI baselines PPO2, CleanRL): ``max((V−R)², (V_clip−R)²)``
      — pessimistic, the same one-sided logic as the policy clip;
    * ``clip_mode="clipped"`` (Stable-Baselines3): ``(V_clip − R)²``.

    Shapes: ``values``, ``returns``, ``values_old``, ``mask`` all ``[M]`` or ``[B, L]``.
    ``returns`` and ``values_old`` are detached. Returns the aggregated scalar. Every valid
    position must be finite; masked positions are never read (module doc).
    """
    if clip_mode not in ("max", "clipped"):
        raise ValueError(f"clip_mode: expected 'max' or 'clipped', got {clip_mode!r}")
    inputs = {"values": values, "returns": returns}
    if clip_range_vf is not None:
        c = check_positive(clip_range_vf, "clip_range_vf")
        if values_old is None:
            raise ValueError("values_old: required when clip_range_vf is set")
        inputs["values_old"] = values_old
    f, m = _masked_terms(inputs, mask, "values")
    v, ret = f["values"], f["returns"].detach()
    err = (v - ret) ** 2
    if clip_range_vf is not None:
        vo = f["values_old"].detach()
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

    A bonus: the total loss *subtracts* ``ent_coef ·`` this value. Every valid position must
    be finite; masked positions are never read."""
    f, m = _masked_terms({"entropy": entropy}, mask, "entropy")
    return aggregate(f["entropy"], m, agg, num_tokens=num_tokens, num_seqs=num_seqs,
                     norm_length=norm_length)


def kl_penalty_loss(logp, logp_ref, mask=None, *,
                    estimator: str = DEFAULT_KL_LOSS_ESTIMATOR, agg: str = "token-mean",
                    num_tokens=None, num_seqs=None, norm_length=None) -> Tensor:
    """KL to a reference policy as a differentiable loss term.

    ``logp`` (current policy ``π``, with gradient) and ``logp_ref`` (frozen) of the sampled
    tokens, ``[M]`` or ``[B, L]``; per sample an estimate of ``KL(π ‖ π_ref)`` for tokens
    sampled from ``π``, aggregated. ``estimator`` (:data:`ppokit.core.KL_LOSS_ESTIMATORS`)
    decides where its gradient points:

    * ``"k2"`` (default): ``½ (log π − log π_ref)²``, per-sample gradient
      ``(log π − log π_ref) ∇log π`` whose expectation under ``π`` is ``∇KL(π ‖ π_ref)``: the
      gradient of the KL the term penalises. Its value is biased (it agrees with the KL to
      second order near the reference).
    * ``"k3"`` (GRPO's form): ``π_ref/π − 1 − log(π_ref/π)``, unbiased in value for
      ``KL(π ‖ π_ref)``, but per-sample gradient ``(1 − π_ref/π) ∇log π``, whose expectation
      is ``∇KL(π_ref ‖ π)``: it pulls towards the reference along the other direction
      (mass-covering; ``π_ref/π`` is unbounded where ``π`` is small).

    Neither is clamped. The expectations hold for tokens sampled from the policy being
    differentiated: on a rollout of ``π_old`` that is the update's first step, and
    approximately so while ``π`` stays near ``π_old`` (docs/theory.md#the-kl-loss-and-its-gradient).
    k1 (``log π − log π_ref``) is refused: its expected gradient is 0; it belongs in the
    per-token KL *reward* (k1 of old vs reference, folded into the rewards before GAE,
    never clamped). For the PPO paper's penalty on the distance from the *sampling* policy,
    use :func:`ppo_kl_penalty_loss`. Masked positions are never read.
    """
    if estimator not in KL_LOSS_ESTIMATORS:
        why = (" (k1's expected gradient is 0: it belongs in the reward)"
               if estimator == "k1" else "")
        raise ValueError(f"estimator: expected one of {', '.join(KL_LOSS_ESTIMATORS)} for "
                         f"the KL loss term, got {estimator!r}{why}")
    f, m = _masked_terms({"logp": logp, "logp_ref": logp_ref}, mask, "logp")
    per = kl_estimate(f["logp"], f["logp_ref"].detach(), estimator)
    return aggregate(per, m, agg, num_tokens=num_tokens, num_seqs=num_seqs,
                     norm_length=norm_length)


def ppo_kl_penalty_loss(logp, logp_old, mask=None, *, agg: str = "token-mean",
                        num_tokens=None, num_seqs=None, norm_length=None) -> Tensor:
    """The PPO-KL penalty: ``KL(π_old ‖ π)`` estimated from actions sampled by ``π_old``.

    ``logp`` (current policy, with gradient) and ``logp_old`` (the rollout's frozen
    log-probs) of the sampled actions, ``[M]`` or ``[B, L]``. Per sample k3 in its ratio
    form ``(ρ − 1) − log ρ`` with ``ρ = π(a)/π_old(a)`` (non-negative, 0 at ``ρ = 1``),
    aggregated: the quantity :func:`approx_kl` measures and the adaptive β is driven by.

    Without bias both in value and in gradient for ``a ~ π_old``:
    ``E_old[ρ − 1] = 0`` and ``E_old[−log ρ] = KL(π_old ‖ π)``; per sample
    ``∇ = (ρ − 1) ∇log π`` and ``E_old[(ρ − 1) ∇log π] = −E_old[∇log π] = ∇KL(π_old ‖ π)``.
    (k3 with the roles swapped, ``π_old/π − 1 − log(π_old/π)``, has expectation
    ``χ²(π_old ‖ π) − KL(π_old ‖ π)`` under ``π_old``: a different penalty with a different
    gradient.) Masked positions are never read.
    """
    f, m = _masked_terms({"logp": logp, "logp_old": logp_old}, mask, "logp")
    log_ratio = f["logp"] - f["logp_old"].detach()
    per = torch.expm1(log_ratio) - log_ratio
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
