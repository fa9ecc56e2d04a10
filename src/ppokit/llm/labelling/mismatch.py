"""The rollout–training mismatch: how far the sampler's probabilities of the tokens it drew
are from the trainer's own, and the two corrections for it (docs/theory.md#rollout-training-
mismatch). Pure tensor code on ``[B, L]`` tensors in the rollout's token layout.

The sampler and the trainer compute the same policy, but not the same numbers: the sampler
may run in bfloat16 while training runs in float32, and its cached incremental forward adds
the same terms in another order. The ratio of the trainer's old probability to the
sampler's, ``ρ_t = π_old(y_t) / π_sampler(y_t)``, is 1 where they agree. PPO's ratio is
taken against ``π_old`` (the trainer's, ``old_logprobs = "recompute"``), so the tokens were
drawn from one distribution and are weighed as if from another; the corrections reweigh:

* ``truncate`` (truncated importance sampling): each token's policy-gradient term is
  multiplied by ``min(ρ_t, C)``;
* ``mask`` (masked importance sampling): a token whose ``ρ_t`` leaves ``[C_low, C]`` leaves
  the loss.

At ``level = "sequence"`` the ratio of a completion is the geometric mean of its tokens'
(``exp`` of the mean log-ratio), and the weight or the decision applies to all its tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["MismatchCorrection", "log_ratios", "mismatch_stats", "correction"]


class MismatchCorrection:
    """What :func:`correction` gives: ``weight`` (``[B, L]``, or ``None``: all 1), the
    ``keep`` mask (``[B, L]`` bool, the tokens left in the loss) and its statistics."""

    def __init__(self, weight: Tensor | None, keep: Tensor, stats: dict):
        self.weight, self.keep, self.stats = weight, keep, stats


def log_ratios(trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor,
               level: str = "token") -> Tensor:
    """``log ρ`` per token (0 off ``mask``); at ``level = "sequence"`` every token of a row
    holds the row's mean log-ratio (0 for a row without any token)."""
    zero = torch.zeros((), dtype=trainer_logp.dtype)
    lr = torch.where(mask, trainer_logp.float() - sampler_logp.float(), zero.float())
    if level == "token":
        return lr
    n = mask.sum(1).clamp(min=1)
    seq = lr.sum(1) / n
    return torch.where(mask, seq[:, None].expand_as(lr), zero.float())


def mismatch_stats(trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor,
                   low: float, high: float) -> dict:
    """``mismatch_k3_mean`` (mean over the tokens of ``ρ − 1 − log ρ``, an estimate of
    KL(π_sampler ‖ π_old) from the sampler's own draws, ≥ 0 and 0 only where they agree),
    ``mismatch_k3_max`` (its largest token), ``mismatch_abs_logratio_max`` and
    ``mismatch_frac_outside`` (the share of tokens whose ρ leaves ``[low, high]``)."""
    lr = log_ratios(trainer_logp, sampler_logp, mask)[mask]
    if lr.numel() == 0:
        return {"mismatch_k3_mean": 0.0, "mismatch_k3_max": 0.0,
                "mismatch_abs_logratio_max": 0.0, "mismatch_frac_outside": 0.0}
    k3 = torch.expm1(lr) - lr
    rho = torch.exp(lr)
    return {"mismatch_k3_mean": float(k3.mean()), "mismatch_k3_max": float(k3.max()),
            "mismatch_abs_logratio_max": float(lr.abs().max()),
            "mismatch_frac_outside": float(((rho < low) | (rho > high)).float().mean())}


def correction(mode: str, level: str, trainer_logp: Tensor, sampler_logp: Tensor,
               mask: Tensor, low: float, high: float) -> MismatchCorrection:
    """The correction ``mode`` (``"truncate"`` or ``"mask"``) at ``level`` for the tokens
    of ``mask``. Statistics: ``rollout_is_weight_mean`` / ``_max`` (truncate: the weights
    of the tokens in the loss) or ``rollout_is_masked_frac`` (mask: the share of the
    tokens taken out)."""
    rho = torch.exp(log_ratios(trainer_logp, sampler_logp, mask, level))
    n = max(int(mask.sum()), 1)
    if mode == "truncate":
        weight = torch.where(mask, rho.clamp(max=high), torch.ones_like(rho))
        w = weight[mask]
        stats = {"rollout_is_weight_mean": float(w.mean()) if w.numel() else 1.0,
                 "rollout_is_weight_max": float(w.max()) if w.numel() else 1.0,
                 "rollout_is_truncated_frac": float((rho[mask] > high).sum()) / n}
        return MismatchCorrection(weight.to(trainer_logp.dtype), mask, stats)
    if mode == "mask":
        keep = mask & (rho >= low) & (rho <= high)
        stats = {"rollout_is_masked_frac": float((mask & ~keep).sum()) / n}
        return MismatchCorrection(None, keep, stats)
    raise ValueError(f"rollout_is: expected 'truncate' or 'mask', got {mode!r}")
