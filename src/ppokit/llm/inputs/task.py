"""The built-in tasks: reverse a short digit string (``reverse``), and short arithmetic
problems with a verifiable answer (``arithmetic``, :class:`ArithmeticTask`).

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

import functools
import hashlib
import random
from dataclasses import dataclass

__all__ = ["ReverseTask", "ArithmeticTask", "TASKS", "make_task", "reverse_score",
           "score_one", "correct_answer", "answer_format"]

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


def reverse_score(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
    """The reverse task's reward (``--reward ppokit.llm.inputs.task:reverse_score``), in the
    calling convention of every reward function (ppokit.llm.inputs.rewards)."""
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

    def row(self, prompt: str) -> dict:
        return {"prompt": prompt}

    rewards = (reverse_score,)
    reward_weights = (1.0,)
    sft_steps = 150  # the warm start's SFT steps
    score = staticmethod(reverse_score)



# ------------------------------------------------------------------ arithmetic

ANSWER_END = "."


def _parse_answer(completion: str) -> int | None:
    """The answer a completion gives: the integer before the final ``.`` of a
    well-formatted completion, else the last integer anywhere in it, else None."""
    import re

    text = completion.strip()
    m = re.fullmatch(r"(-?\d+)\.", text)
    if m:
        return int(m.group(1))
    found = re.findall(r"-?\d+", text)
    return int(found[-1]) if found else None


def correct_answer(completions: list[str], answer: list, **kwargs) -> list[float]:
    """1.0 when the completion's answer (:func:`_parse_answer`) equals the ``answer``
    column, else 0.0 (``--reward ppokit.llm.inputs.task:correct_answer``)."""
    out = []
    for c, a in zip(completions, answer):
        got = _parse_answer(c if isinstance(c, str) else c[0]["content"])
        out.append(1.0 if got is not None and str(got) == str(a).strip() else 0.0)
    return out


def answer_format(completions: list[str], **kwargs) -> list[float]:
    """1.0 when the completion is exactly an integer followed by ``.`` (the answer
    format), else 0.0 (``--reward ppokit.llm.inputs.task:answer_format``)."""
    import re

    return [1.0 if re.fullmatch(r"-?\d+\.", (c if isinstance(c, str) else
                                                c[0]["content"]).strip()) else 0.0
            for c in completions]


@dataclass
class ArithmeticTask:
    """Short expression problems with a verifiable answer: ``"23+7="`` → ``"30."`` + EOS.

    ``a op b`` with ``a`` in ``[0, max_a)``, ``b`` in ``[0, max_b)``, ``op`` in ``ops``.
    Two rewards, as in the GSM8K recipes most GRPO users run: :func:`correct_answer`
    (weight 1) and :func:`answer_format` (weight 0.2). 10 % of all problems (by a fixed
    hash of the expression) are held out. The warm-start demonstrations come from a noisy
    teacher: each answer digit is replaced by a random digit with probability ``noise``,
    and with probability ``format_noise`` the answer is written without its final ``.``
    or with a stray character, so the warm start is imperfect on both counts.
    """

    max_a: int = 50
    max_b: int = 10
    ops: str = "+-"
    noise: float = 0.15
    format_noise: float = 0.3

    def _value(self, prompt: str) -> int:
        expr = prompt.rstrip("=")
        for op in "+-":
            a, sep, b = expr.partition(op)
            if sep and a and b:
                return int(a) + int(b) if op == "+" else int(a) - int(b)
        raise ValueError(f"not an arithmetic prompt: {prompt!r}")

    def _draw(self, rng: random.Random, held_out: bool) -> str:
        while True:
            a, b = rng.randrange(self.max_a), rng.randrange(self.max_b)
            p = f"{a}{rng.choice(self.ops)}{b}="
            if _held_out(p) == held_out:
                return p

    def train_prompts(self, n: int, rng: random.Random) -> list[str]:
        return [self._draw(rng, False) for _ in range(n)]

    def heldout_prompts(self, n: int = 128, seed: int = 12345) -> list[str]:
        rng = random.Random(seed)
        return [self._draw(rng, True) for _ in range(n)]

    def row(self, prompt: str) -> dict:
        return {"prompt": prompt, "answer": str(self._value(prompt))}

    def demonstration(self, prompt: str, rng: random.Random) -> str:
        digits = "".join(rng.choice("0123456789") if c.isdigit() and rng.random() < self.noise
                         else c for c in str(self._value(prompt)))
        if rng.random() < self.format_noise:
            return digits + rng.choice(["", " ", ",", "0.", ".."])
        return digits + ANSWER_END

    @property
    def max_new_tokens(self) -> int:
        return len(str(self.max_a + self.max_b)) + 4

    rewards = (correct_answer, answer_format)
    reward_weights = (1.0, 0.2)
    sft_steps = 600  # the warm start's SFT steps: enough to learn the sums in part


TASKS = {"reverse": ReverseTask, "arithmetic": ArithmeticTask}


def make_task(name: str, options: str | None = None):
    """The task named ``name``: a built-in task of this module, or a task for pretrained
    chat models (:mod:`ppokit.llm.inputs.chat_tasks`, with its ``options``)."""
    if name in TASKS:
        if options:
            from ppokit.errors import UsageError

            raise UsageError(f"task_options: the built-in task {name!r} takes none")
        return TASKS[name]()
    return _chat_task(name, options)


@functools.lru_cache(maxsize=8)
def _chat_task(name: str, options: str | None):
    from .chat_tasks import make_chat_task

    return make_chat_task(name, options)
