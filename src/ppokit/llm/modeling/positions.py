"""Where each token sits in a left-padded batch, and which rows share a prompt (the
sampler and the fused kernels both read these)."""

from __future__ import annotations

import torch

__all__ = ["position_ids_from_mask", "distinct_prompts"]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, so left padding does not shift them."""
    return (attention_mask.long().cumsum(1) - 1).clamp(min=0)


def distinct_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
    """``(first, inverse)`` when some rows repeat a prompt: ``first[u]`` is the first row
    holding distinct prompt ``u`` and ``inverse[b]`` the distinct prompt of row ``b``;
    None when every row's prompt is different."""
    n = prompt_ids.shape[0]
    if n < 2:
        return None
    key = torch.cat([prompt_ids, prompt_mask.long()], 1)
    uniq, inv = torch.unique(key, dim=0, return_inverse=True)
    if uniq.shape[0] == n:
        return None
    dev = prompt_ids.device
    first = torch.full((uniq.shape[0],), n, dtype=torch.long, device=dev).scatter_reduce(
        0, inv, torch.arange(n, device=dev), "amin")
    return first, inv
