"""Critic-free advantages: GRPO, Dr. GRPO, RLOO and REINFORCE++.

Scores of several responses to the same prompt are laid out ``[num_prompts, G]`` (G samples
per prompt). A flat ``[num_prompts · G]`` vector is accepted with ``group_size=G``, in the
order prompt-major (all samples of prompt 0, then prompt 1, …). The result has the input's
shape and dtype; broadcast a sequence advantage to its tokens with :func:`broadcast_to_tokens`.

* **GRPO** (Shao et al. 2024): ``(r − mean_g) / (std_g + eps)``; ``std_g`` uses ``ddof``
  (default 1, ``torch.std``'s unbiased estimator, as in DeepSeekMath and TRL). Subtracting
  a mean that includes the sample's own reward scales the expected gradient by (G−1)/G;
  the std division adds a per-prompt weighting (questions with low spread get large
  advantages).
* **Dr. GRPO** (Liu et al. 2025): ``r − mean_g`` with no std division; pair it with the
  ``seq-mean-token-sum-norm`` aggregation (a constant normaliser) to remove length bias.
* **RLOO** (Ahmadian et al. 2024): leave-one-out baseline ``r_i − mean_{j≠i} r_j``
  ``= G/(G−1) · (r_i − mean_g)``: the baseline does not depend on the sample's own action.
* **REINFORCE++** (Hu 2025): no per-group baseline; token returns (with KL rewards) are
  whitened over the whole batch (:func:`reinforce_pp_advantages`).

A group without spread (all G scores equal) gets advantage exactly 0 from every estimator,
whatever the dtype and the scale of the scores. Each group is first shifted by one of its
own scores (which changes no advantage mathematically), so equal scores become exact zeros
before any mean is taken; computing ``r − mean_g`` directly would leave the rounding error
of the mean (≈ 1e-8 in float32), which GRPO's division by an equally small std turns into
an advantage of order 0.1–1 on every sample. float16 and bfloat16 scores are computed in
float32 and returned in their own dtype.
"""

from __future__ import annotations

import torch

from .returns import reward_to_go  # noqa: F401  (documented relation)
from .stats import masked_whiten
from .validation import (
    Tensor,
    as_tensor,
    check_finite,
    check_mask,
    check_ndim,
    check_nonempty,
    check_unit_interval,
    float_inputs,
)

__all__ = [
    "grpo_advantages",
    "dr_grpo_advantages",
    "rloo_advantages",
    "reinforce_pp_advantages",
    "broadcast_to_tokens",
]


def _groups(scores, group_size):
    """``(s, shifted, flat)``: the scores, their ``[P, G]`` groups minus each group's first
    score (float32 at least), and whether the input was flat."""
    s = float_inputs({"scores": scores}, finite=("scores",))["scores"]
    check_nonempty(s, "scores")
    flat = s.ndim == 1
    if flat:
        if group_size is None:
            raise ValueError("group_size: required when scores is flat [num_prompts * G]")
        g = int(group_size)
        if g < 1 or s.numel() % g:
            raise ValueError(f"group_size: expected a positive divisor of len(scores) = "
                             f"{s.numel()}, got {group_size!r}")
        grouped = s.reshape(-1, g)
    else:
        check_ndim(s, "scores", (2,), "[num_prompts, G] or flat [num_prompts * G]")
        if group_size is not None and int(group_size) != s.shape[1]:
            raise ValueError(f"group_size: {group_size} disagrees with scores.shape[1] = "
                             f"{s.shape[1]}")
        grouped = s
    if grouped.dtype in (torch.float16, torch.bfloat16):
        grouped = grouped.float()
    return s, grouped - grouped[:, :1], flat


def _out(adv: Tensor, s: Tensor, flat: bool) -> Tensor:
    adv = adv.to(s.dtype)
    return adv.reshape(s.shape) if flat else adv


def grpo_advantages(scores, group_size: int | None = None, *, normalize_std: bool = True,
                    ddof: int = 1, eps: float = 1e-6) -> Tensor:
    """GRPO group-relative advantages. ``scores``: ``[P, G]`` or flat ``[P·G]``.

    ``normalize_std=False`` gives the mean-only variant (Dr. GRPO's estimator). A group of
    size 1, or a group whose scores are all equal, gets advantage exactly 0, never NaN.
    """
    if ddof not in (0, 1):
        raise ValueError(f"ddof: expected 0 or 1, got {ddof!r}")
    s, d, flat = _groups(scores, group_size)
    centred = d - d.mean(1, keepdim=True)
    if normalize_std:
        g = d.shape[1]
        if g - ddof > 0:
            std = d.std(1, correction=ddof, keepdim=True)
        else:
            std = torch.zeros_like(d[:, :1])
        centred = centred / (std + eps)
    return _out(centred, s, flat)


def dr_grpo_advantages(scores, group_size: int | None = None) -> Tensor:
    """Dr. GRPO: ``r − mean_g`` (no std division). Shapes as :func:`grpo_advantages`."""
    return grpo_advantages(scores, group_size, normalize_std=False)


def rloo_advantages(scores, group_size: int | None = None) -> Tensor:
    """RLOO leave-one-out: ``r_i − (Σ_g r − r_i)/(G − 1)``. Needs ``G ≥ 2``. ``scores``:
    ``[P, G]`` or flat ``[P·G]`` with ``group_size``; the result has the input's shape."""
    s, d, flat = _groups(scores, group_size)
    g = d.shape[1]
    if g < 2:
        raise ValueError(f"group_size: RLOO needs at least 2 samples per prompt, got {g}")
    baseline = (d.sum(1, keepdim=True) - d) / (g - 1)
    return _out(d - baseline, s, flat)


def reinforce_pp_advantages(token_rewards, mask, gamma: float = 1.0, *,
                            eps: float = 1e-8) -> Tensor:
    """REINFORCE++: per-token reward-to-go over action tokens, whitened over the batch.

    ``token_rewards``: ``[B, L]`` (the score on the last action token plus any per-token KL
    rewards); ``mask``: ``[B, L]`` action mask. Returns ``[B, L]`` advantages, 0 off the
    mask. The return of token t sums the rewards of the row's action tokens ≥ t with
    ``γ^(k)`` per action step (masked spans are skipped); then all valid tokens of the
    batch are whitened together (ddof 1; a batch of equal returns gives exactly 0).
    """
    gamma = check_unit_interval(gamma, "gamma")
    r = float_inputs({"token_rewards": token_rewards})["token_rewards"]
    check_nonempty(r, "token_rewards")
    check_ndim(r, "token_rewards", (2,), "[B, L]")
    m = check_mask(mask, r, "token_rewards")
    check_finite(r[m], "token_rewards")
    from .advantage import token_gae  # λ = 1 with zero values is the discounted return-to-go

    _, returns = token_gae(r, torch.zeros_like(r), m, gamma, 1.0)
    return masked_whiten(returns, m, eps=eps)


def broadcast_to_tokens(seq_values, mask) -> Tensor:
    """Place a per-sequence value ``[B]`` on every action token of ``mask`` ``[B, L]``;
    0 elsewhere. The explicit way to go from ``[B]`` to ``[B, L]`` (never a silent
    ``[B, 1]`` broadcast)."""
    m = as_tensor(mask, "mask")
    check_ndim(m, "mask", (2,), "[B, L]")
    v = as_tensor(seq_values, "seq_values")
    if not v.is_floating_point():
        v = v.to(torch.float32)
    if tuple(v.shape) != (m.shape[0],):
        raise ValueError(f"seq_values: expected shape [B] = ({m.shape[0]},), got "
                         f"{tuple(v.shape)}")
    m = check_mask(m, m, "mask")
    return torch.where(m, v[:, None].expand(m.shape), torch.zeros((), dtype=v.dtype))
