"""The labelled batch the update engine consumes: one rollout's frozen labels, validated
and detached once (:class:`LabelledBatch`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["LabelledBatch", "take_rows"]


def take_rows(t: Tensor, idx: Tensor) -> Tensor:
    """``t[idx]`` for a 1-D integer ``idx``, as ``index_select``: the same rows, but copied
    one whole row at a time (a minibatch of 256 Atari frames, 7 MB of uint8: ~1 ms against
    ~11 ms for advanced indexing, which copies element by element); a channels-last
    image batch keeps its layout. Any other index (a mask, a slice) goes through
    ``t[idx]``."""
    if idx.dim() == 1 and not idx.dtype.is_floating_point and idx.dtype != torch.bool:
        if (t.dim() == 4 and not t.is_contiguous()
                and t.is_contiguous(memory_format=torch.channels_last)):
            # images kept channels-last (the collector's pixels): whole rows of the
            # N, H, W, C memory, and the result in the same layout
            n, c, h, w = t.shape
            rows = torch.index_select(t.permute(0, 2, 3, 1).reshape(n, h * w * c), 0, idx)
            return rows.view(len(idx), h, w, c).permute(0, 3, 1, 2)
        return torch.index_select(t, 0, idx)
    return t[idx]


@dataclass
class LabelledBatch:
    """The frozen labels of one rollout plus whatever the forward adapter reads, every
    tensor with the rows as its first dimension. ``mask`` (``[B, L]`` bool) marks the
    elements that enter the losses; ``None``: all of them (``[N]`` rows)."""

    data: dict[str, Tensor]
    mask: Tensor | None = None

    @property
    def n_rows(self) -> int:
        return int(self.data["logp"].shape[0])

    @classmethod
    def build(cls, data: dict[str, Tensor], mask: Tensor | None = None) -> LabelledBatch:
        """Validate and detach once per rollout: every tensor has the same number of rows;
        the labels (``logp``, ``advantages`` and, when present, ``returns``, ``values``,
        ``ref_logp``) have one shape, the mask's, and are finite where it is set (masked
        elements may hold anything: they never reach the loss or its gradient)."""
        for key in ("logp", "advantages"):
            if key not in data:
                raise ValueError(f"labelled batch: {key!r} is required")
        out = {k: v.detach() for k, v in data.items()}
        n = out["logp"].shape[0]
        shape = out["logp"].shape if mask is None else mask.shape
        if mask is not None:
            if mask.dtype != torch.bool:
                raise ValueError(f"labelled batch: mask must be bool, got {mask.dtype}")
            if mask.shape[0] != n:
                raise ValueError("labelled batch: mask rows differ from logp's")
        for k, v in out.items():
            if v.shape[:1] != (n,):
                raise ValueError(f"labelled batch: {k!r} has {tuple(v.shape)[:1]} rows, "
                                 f"logp {n}")
        for k in ("logp", "advantages", "returns", "values", "ref_logp", "is_weight"):
            if k not in out:
                continue
            v = out[k]
            if v.shape != shape:
                raise ValueError(f"labelled batch: {k!r} has shape {tuple(v.shape)}, "
                                 f"expected {tuple(shape)}")
            valid = v if mask is None else v[mask]
            if not bool(torch.isfinite(valid).all()):
                raise ValueError(f"labelled batch: {k!r} is not finite on valid elements")
        return cls(out, None if mask is None else mask.detach())

    def rows(self, idx: Tensor | None) -> dict[str, Tensor]:
        """The rows ``idx`` (all when ``None``) as a dict, with ``mask`` when there is one."""
        d = dict(self.data) if idx is None else {k: take_rows(v, idx)
                                                 for k, v in self.data.items()}
        if self.mask is not None:
            d["mask"] = self.mask if idx is None else take_rows(self.mask, idx)
        return d
