"""Rewards for token-level RLHF: a Python callable named ``module:function``, a learned
reward model directory, or the built-in task's rule.

A reward function takes ``(prompts: list[str], completions: list[str])`` and returns one
finite score per completion (a list, tuple, numpy array or 1-D tensor).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

import torch

from ppokit.errors import UsageError

__all__ = ["load_reward_callable", "RewardModelScorer", "check_scores"]


def load_reward_callable(spec: str) -> Callable:
    """Import ``module:function`` (e.g. ``ppokit.llm.task:reverse_score``)."""
    if ":" not in spec:
        raise UsageError(f"--reward: expected 'module:function', got {spec!r}")
    mod_name, _, fn_name = spec.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise UsageError(f"--reward: cannot import module {mod_name!r}: {exc}") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise UsageError(f"--reward: {mod_name!r} has no callable {fn_name!r}")
    return fn


def check_scores(scores, n: int) -> torch.Tensor:
    """Scores as a float32 ``[n]`` tensor; a wrong count or a NaN is an error."""
    s = torch.as_tensor(scores, dtype=torch.float32).reshape(-1)
    if s.numel() != n:
        raise ValueError(f"reward: expected {n} scores (one per completion), got {s.numel()}")
    if not bool(torch.isfinite(s).all()):
        bad = [i for i, v in enumerate(s.tolist()) if not math.isfinite(v)][:5]
        raise ValueError(f"reward: non-finite scores at indices {bad}")
    return s


class RewardModelScorer:
    """Scores ``prompt + completion + EOS`` with a sequence-classification reward model
    saved by ``ppokit llm rm`` (or any local ``AutoModelForSequenceClassification`` dir
    with one label)."""

    def __init__(self, path: str, batch_size: int = 64):
        from transformers import AutoModelForSequenceClassification

        from .models import _local_dir, load_tokenizer

        _local_dir(path, "--reward-model")
        self.tokenizer = load_tokenizer(path)
        try:
            self.model = AutoModelForSequenceClassification.from_pretrained(
                path, trust_remote_code=False, local_files_only=True)
        except Exception as exc:  # noqa: BLE001
            raise UsageError(f"--reward-model: cannot load {path!r}: {exc}") from None
        self.model.eval()
        self.batch_size = batch_size

    @torch.no_grad()
    def __call__(self, prompts: list[str], completions: list[str]) -> list[float]:
        from .rm import reward_forward
        from .sft import encode_pairs

        out = []
        for i in range(0, len(prompts), self.batch_size):
            ids, attn, _ = encode_pairs(self.tokenizer, prompts[i:i + self.batch_size],
                                        completions[i:i + self.batch_size])
            out.extend(reward_forward(self.model, ids, attn).tolist())
        return out
