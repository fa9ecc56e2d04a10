"""Reward functions that provoke the language-model failures ``ppokit report`` names, on the
built-in reverse task (tests/test_report_lm.py; the recorded runs in tests/data/README.md).
Each takes ppokit's keyword arguments and returns one float per completion."""

from __future__ import annotations


def length_bonus(completions, **kwargs) -> list[float]:
    """0.1 per character: paid on top of the task's score, it pays for length."""
    return [0.1 * len(c) for c in completions]


def brevity(completions, **kwargs) -> list[float]:
    """−0.3 per character: more than a right digit earns on the reverse task (1/6 to
    1/3), so stopping at once pays."""
    return [-0.3 * len(c) for c in completions]


def seven_zeros(completions, **kwargs) -> list[float]:
    """1 for a completion that starts with seven zeros, which the warm start never
    writes: every group's rewards are all 0 (a reward too hard to ever pay)."""
    return [1.0 if c.startswith("0000000") else 0.0 for c in completions]
