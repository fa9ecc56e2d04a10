"""Flat parameter storage: every trainable parameter of a module in one aligned buffer,
every gradient in another.

The fused minibatch step (:mod:`ppokit.engine.fused`) clips the global gradient norm and
runs Adam with a handful of operations on one vector instead of a loop over parameters;
that needs the parameters to *be* views of one buffer. :class:`FlatParameters` makes them
so, explicitly: the trainer creates it right after building the policy and before the
optimiser, the rollout sampler and the checkpoint code see the parameters, so no later
step changes the storage behind their backs. The ``Parameter`` objects stay the same (only
their storage becomes a view), so ``state_dict``/``load_state_dict``, autograd and the
optimiser's per-parameter state work as before; checkpoints clone tensors before saving.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["FlatParameters", "flat_views", "flat_buffer"]

_ALIGN = 16  # elements: every view starts on a 64-byte boundary, like a fresh tensor


def _offsets(like: list[torch.Tensor]) -> tuple[list[int], int]:
    offs, o = [], 0
    for t in like:
        offs.append(o)
        o += -(-t.numel() // _ALIGN) * _ALIGN
    return offs, o


def flat_buffer(like: list[torch.Tensor]) -> torch.Tensor:
    """A zeroed buffer holding every tensor of ``like`` at an aligned offset (the padding
    stays 0: it gets no gradient, so Adam never moves it)."""
    return torch.zeros(_offsets(like)[1], dtype=like[0].dtype)


def flat_views(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of ``flat`` shaped like ``like``, each starting at an aligned offset. (Alignment
    matters for bit-exact results: BLAS kernels may sum in a different order on a
    misaligned operand, and a resumed run must compute exactly what the original did.)"""
    offs, _ = _offsets(like)
    return [flat[o:o + t.numel()].view_as(t) for o, t in zip(offs, like)]


class FlatParameters:
    """Re-home ``params`` (trainable, float, CPU, one dtype) into ``self.data`` and give
    each a gradient that is a view of ``self.grad``; the values are unchanged."""

    def __init__(self, params: Iterable[torch.nn.Parameter]):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("FlatParameters: no trainable parameters")
        if len({p.dtype for p in self.params}) != 1 or any(p.device.type != "cpu"
                                                           for p in self.params):
            raise ValueError("FlatParameters: parameters must share one dtype on the CPU")
        with torch.no_grad():
            self.data = flat_buffer(self.params)
            for p, view in zip(self.params, flat_views(self.data, self.params)):
                view.copy_(p.detach())
                p.data = view
            self.grad = torch.zeros_like(self.data)
            for p, view in zip(self.params, flat_views(self.grad, self.params)):
                p.grad = view

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """``flat`` (shaped like :attr:`data`) split into per-parameter views."""
        return flat_views(flat, self.params)

    def zero_grad(self) -> None:
        self.grad.zero_()

    def owns(self, params: list[torch.Tensor]) -> bool:
        """Whether ``params`` are exactly these parameters, still views of the buffers."""
        return (len(params) == len(self.params)
                and all(p is q for p, q in zip(params, self.params))
                and all(p.grad is not None and p.grad.data_ptr() == v.data_ptr()
                        for p, v in zip(self.params, self.views(self.grad))))
