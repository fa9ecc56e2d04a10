"""The built-in task: reverse a short digit string.

A prompt is ``"<digits>>"`` (e.g. ``"3817>"``); the correct completion is the digits
reversed (``"7183"``) followed by EOS. The rule-based score in [0, 1] gives partial credit
per position: ``#{i : out[i] == target[i]} / max(len(out), len(target))``, so a wrong
digit, a missing digit and an extra character each cost credit, and an empty answer
scores 0.

Held-out prompts are never trained on: a digit string is held out when a fixed hash of it
falls in the held-out bucket (10 % of all strings), and training prompts are drawn from
the rest. The demonstrations of the warm-start step come from a *noisy teacher*: each
answer digit is replaced by a random digit with probability ``noise`` (default 0.15), so
supervised fine-tuning on them, with its small fixed budget, leaves an imperfect policy
that a verifiable reward can improve.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

__all__ = ["ReverseTask", "reverse_score", "score_one"]

SEP = ">"


def score_one(prompt: str, completion: str) -> float:
    """Partial-credit score of one completion for a reverse-task prompt."""
    digits = prompt.strip()
    if digits.endswith(SEP):
        digits = digits[:-1]
    target = digits[::-1]
    out = completion.strip()
    n = max(len(out), len(target))
    if n == 0:
        return 1.0
    hits = sum(1 for a, b in zip(out, target) if a == b)
    return hits / n


def reverse_score(prompts: list[str], completions: list[str]) -> list[float]:
    """The built-in reward: ``module:function`` = ``ppokit.llm.task:reverse_score``."""
    if len(prompts) != len(completions):
        raise ValueError(f"completions: expected {len(prompts)} (one per prompt), got "
                         f"{len(completions)}")
    return [score_one(p, c) for p, c in zip(prompts, completions)]


def _held_out(digits: str, percent: int = 10) -> bool:
    h = int.from_bytes(hashlib.blake2b(digits.encode(), digest_size=4).digest(), "little")
    return h % 100 < percent


@dataclass
class ReverseTask:
    """Reverse a digit string of ``min_len`` … ``max_len`` digits."""

    min_len: int = 3
    max_len: int = 6
    noise: float = 0.15

    def _draw(self, rng: random.Random, held_out: bool) -> str:
        while True:
            n = rng.randint(self.min_len, self.max_len)
            s = "".join(rng.choice("0123456789") for _ in range(n))
            if _held_out(s) == held_out:
                return s

    def train_prompts(self, n: int, rng: random.Random) -> list[str]:
        return [self._draw(rng, False) + SEP for _ in range(n)]

    def heldout_prompts(self, n: int = 128, seed: int = 12345) -> list[str]:
        rng = random.Random(seed)
        return [self._draw(rng, True) + SEP for _ in range(n)]

    def demonstration(self, prompt: str, rng: random.Random) -> str:
        """A noisy teacher's answer: each digit wrong with probability ``noise``."""
        target = prompt[:-1][::-1]
        return "".join(rng.choice("0123456789") if rng.random() < self.noise else c
                       for c in target)

    @property
    def max_new_tokens(self) -> int:
        return self.max_len + 3

    score = staticmethod(reverse_score)
