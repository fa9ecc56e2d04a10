"""Invalid-action masking of categorical heads: the logits of the actions a mask forbids
replaced, so that sampling, the most likely action, log-probabilities and entropies are
over the allowed actions only.

A mask is a ``[B, W]`` boolean tensor, ``True`` where the action is allowed:

* ``Discrete(n)``: ``W = n``, one entry per action (in the policy's coordinates, i.e.
  index ``a − start``);
* ``MultiDiscrete(nvec)``: ``W = sum(nvec)``, the masks of the heads concatenated in the
  (row-major) order of the entries — the convention of sb3-contrib's ``MaskablePPO``.

:func:`mask_logits` writes :data:`MASKED_LOGIT` (a large negative, finite number) where
the mask is false. After ``log_softmax`` those actions have probability exactly 0 (the
exponential underflows), so they add exactly 0 to the entropy (``0 · log 0`` never
appears as ``0 · −inf``), and the gradient of any loss with respect to a masked logit is
exactly 0 (``torch.where`` passes no gradient to the branch it did not take). The
reference these are held to is in ``tests/test_action_masks.py``.

Other heads (Gaussian, Bernoulli) take no mask: :func:`mask_width` says so with one line.
"""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces

Tensor = torch.Tensor

__all__ = ["MASKED_LOGIT", "mask_width", "mask_logits", "sample_masked"]

MASKED_LOGIT = -1e8  # as sb3-contrib's: exp(-1e8 - max) is exactly 0 in float32


def mask_width(space) -> int:
    """The length ``W`` of one action mask of ``space`` (module doc); a
    :class:`ValueError` naming the space for one whose actions cannot be masked."""
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return int(np.asarray(space.nvec).sum())
    raise ValueError(f"action masks: the action space is {type(space).__name__}; masks "
                     "apply to Discrete and MultiDiscrete actions")


def mask_logits(logits: Tensor, mask: Tensor | None) -> Tensor:
    """``logits`` ``[B, W]`` with :data:`MASKED_LOGIT` where ``mask`` (``[B, W]``, any
    dtype: non-zero allows) is false; ``logits`` itself without a mask."""
    if mask is None:
        return logits
    mask = torch.as_tensor(mask)
    if mask.shape != logits.shape:
        raise ValueError(f"action masks: expected shape {tuple(logits.shape)}, got "
                         f"{tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        mask = mask != 0
    return torch.where(mask, logits, torch.full_like(logits, MASKED_LOGIT))


def sample_masked(logp_all: Tensor, generator: torch.Generator | None) -> Tensor:
    """Inverse-CDF sample ``[B, 1]`` from masked log-probs ``[B, K]``: the same rule as the
    unmasked sampler, with the uniform kept above 0 so that the pick is always an action of
    positive probability (an allowed one) even for a uniform of exactly 0."""
    u = torch.rand(logp_all.shape[:-1] + (1,), generator=generator, dtype=logp_all.dtype)
    cdf = logp_all.exp().cumsum(-1)
    x = (u * cdf[..., -1:]).clamp_min(torch.finfo(cdf.dtype).tiny)
    return (cdf < x).sum(-1, keepdim=True).clamp_max(logp_all.shape[-1] - 1)
