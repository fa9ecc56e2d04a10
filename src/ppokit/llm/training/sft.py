"""Supervised fine-tuning on demonstrations (the warm start), and the shared helper that
lays out ``(prompt, completion)`` pairs as left-padded token sequences."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import torch

from ..modeling.rollout import left_pad, sequence_logprobs
from .guards import check_finite_model, check_sft_args

__all__ = ["encode_pairs", "sft_train", "builtin_sft", "nll_steps"]


def encode_pairs(tokenizer, prompts: list[str], completions: list[str], *,
                 add_eos: bool = True, add_bos: bool = True):
    """``(input_ids, attention_mask, completion_mask)``, all ``[B, L]``, left padded.

    ``completion_mask`` (bool, token convention) marks the completion tokens and the EOS
    appended after them; prompt tokens and padding are 0."""
    rows, comp_lens = [], []
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    for p, c in zip(prompts, completions, strict=True):
        pi = tokenizer(p, add_special_tokens=False)["input_ids"]
        if add_bos and bos is not None and (not pi or pi[0] != bos):
            pi = [bos] + pi
        ci = tokenizer(c, add_special_tokens=False)["input_ids"]
        if add_eos:
            ci = ci + [eos]
        rows.append(pi + ci)
        comp_lens.append(len(ci))
    ids, attn = left_pad(rows, tokenizer.pad_token_id)
    width = ids.shape[1]
    cmask = torch.zeros_like(ids, dtype=torch.bool)
    for i, n in enumerate(comp_lens):
        if n:
            cmask[i, width - n:] = True
    return ids, attn, cmask


def sft_train(model, tokenizer, sample_batch: Callable[[int, random.Random], tuple],
              *, steps: int = 300, batch_size: int = 64, lr: float = 3e-3,
              weight_decay: float = 0.0, seed: int = 0, log: Callable | None = None) -> dict:
    """Minimise the mean negative log-likelihood of completion tokens (EOS included).

    ``sample_batch(n, rng) -> (prompts, completions)`` supplies each step's batch.
    Returns a summary (final loss, seconds, steps). Bad arguments raise a UsageError
    before any work; weights that end up NaN or infinite raise one after training."""
    check_sft_args(steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                   weight_decay=weight_decay)
    rng = random.Random(seed)
    torch.manual_seed(seed)

    def batch(step: int):
        prompts, comps = sample_batch(batch_size, rng)
        return encode_pairs(tokenizer, prompts, comps)

    return nll_steps(model, batch, steps=steps, lr=lr, weight_decay=weight_decay, log=log)


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


def builtin_sft(task, model, tokenizer, *, steps: int, batch_size: int = 64, lr: float = 3e-3,
                seed: int = 0, log=None) -> dict:
    """The shipped warm start: SFT on the built-in task's noisy demonstrations."""

    def sample(n, rng):
        prompts = task.train_prompts(n, rng)
        return prompts, [task.demonstration(p, rng) for p in prompts]

    return sft_train(model, tokenizer, sample, steps=steps, batch_size=batch_size, lr=lr,
                     seed=seed, log=log)
