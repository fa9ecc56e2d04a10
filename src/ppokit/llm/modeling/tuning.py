"""Supervised steps on a model's own tokens (:func:`nll_steps`: the SFT warm start's loop,
also an agent run's warm start on its environment's demonstrations) and the refusal to
keep non-finite weights (:func:`check_finite_model`) that every ppokit trainer applies
before it saves a model."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ppokit.errors import UsageError

from .rollout import sequence_logprobs

__all__ = ["nll_steps", "check_finite_model"]


def check_finite_model(model, what: str) -> None:
    """Raise a UsageError when any parameter or buffer of ``model`` holds a NaN or an
    infinity, so that the caller saves nothing. ``what`` names the step that produced the
    model (``"llm dpo"``) and leads the message."""
    bad, total, first = 0, 0, None
    with torch.no_grad():
        tensors = list(model.named_parameters()) + list(model.named_buffers())
        for name, t in tensors:
            if not (t.is_floating_point() or t.is_complex()):
                continue
            n = int((~torch.isfinite(t)).sum())
            total += t.numel()
            if n:
                bad += n
                first = first or name
    if bad:
        raise UsageError(f"{what}: training produced non-finite weights ({bad:,} of "
                         f"{total:,} values are NaN or infinite, first in {first}); nothing "
                         "was saved. Lower the learning rate (or beta) and check the data")


def nll_steps(model, batch: Callable[[int], tuple], *, steps: int, lr: float,
              weight_decay: float = 0.0, log: Callable | None = None) -> dict:
    """``steps`` AdamW steps on the mean negative log-likelihood of the tokens marked in
    ``batch(step) -> (input_ids, attention_mask, loss_mask)`` (token convention): a linear
    warm-up over 20 steps then a linear decay to 0, gradients clipped to norm 1. Returns a
    summary (final loss, seconds, steps); weights that end up NaN or infinite raise."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20)
                                              * max(0.0, 1 - s / max(steps, 1)))
    t0 = time.perf_counter()
    loss_val = float("nan")
    for step in range(steps):
        ids, attn, mask = batch(step)
        lp = sequence_logprobs(model, ids, attn)["logp"]
        loss = -(lp * mask).sum() / mask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_val = loss.item()
        if log is not None and (step % 50 == 0 or step == steps - 1):
            log(step, loss_val)
    model.eval()
    check_finite_model(model, "sft")
    return {"sft_loss": loss_val, "sft_seconds": time.perf_counter() - t0, "sft_steps": steps}
