"""Supervised fine-tuning on demonstrations (the warm start). Its step loop
(:func:`nll_steps`) and the layout of ``(prompt, completion)`` pairs (:func:`encode_pairs`)
live in :mod:`ppokit.llm.modeling` and are importable from here too."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from ..modeling.pairs import encode_pairs
from ..modeling.tuning import nll_steps
from .guards import check_sft_args

__all__ = ["encode_pairs", "sft_train", "builtin_sft", "nll_steps"]


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


def builtin_sft(task, model, tokenizer, *, steps: int, batch_size: int = 64, lr: float = 3e-3,
                seed: int = 0, log=None) -> dict:
    """The shipped warm start: SFT on the built-in task's noisy demonstrations."""

    def sample(n, rng):
        prompts = task.train_prompts(n, rng)
        return prompts, [task.demonstration(p, rng) for p in prompts]

    return sft_train(model, tokenizer, sample, steps=steps, batch_size=batch_size, lr=lr,
                     seed=seed, log=log)
