"""Preference pairs ``{prompt, chosen, rejected}`` (JSONL) shared by ``llm rm`` and ``llm dpo``,
and a generator of the built-in task's pairs."""

from __future__ import annotations

import json
import random

from ppokit.errors import UsageError

from .task import ReverseTask, score_one

__all__ = ["load_pairs", "write_pairs", "split_pairs", "builtin_pairs"]


def load_pairs(path: str, flag: str = "--data") -> list[dict]:
    """The preference pairs of a JSONL file (one ``{prompt, chosen, rejected}`` object of
    strings a line, at least two), read and checked as
    :func:`ppokit.llm.inputs.data.read_jsonl_objects` does."""
    from .data import read_jsonl_objects

    out = read_jsonl_objects(path, flag, ("prompt", "chosen", "rejected"),
                             "preference-pairs file")
    if len(out) < 2:
        raise UsageError(f"{flag}: {path!r} needs at least 2 preference pairs")
    return out


def write_pairs(pairs: list[dict], path: str) -> None:
    with open(path, "w") as f:
        for p in pairs:
            f.write(json.dumps(p) + "\n")


def split_pairs(pairs: list[dict], eval_frac: float, seed: int = 0):
    """Shuffle (fixed seed) and hold out ``eval_frac`` of the pairs (at least one)."""
    idx = list(range(len(pairs)))
    random.Random(seed).shuffle(idx)
    n_eval = max(1, int(round(len(pairs) * eval_frac)))
    return [pairs[i] for i in idx[n_eval:]], [pairs[i] for i in idx[:n_eval]]


def builtin_pairs(n: int, *, seed: int = 0, prefer_longer: float = 0.0,
                  task: ReverseTask | None = None) -> list[dict]:
    """Pairs for the built-in task from two noisy answers to the same prompt.

    With ``prefer_longer = 0`` the labeller prefers the answer with the higher true score.
    With ``prefer_longer = p`` one of the two answers gets 1–4 extra digits appended, and
    with probability ``p`` the labeller prefers the longer answer whatever its score (a
    length-biased labeller, as in the reward-hacking demo)."""
    task = task or ReverseTask()
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < n:
        prompt = task.train_prompts(1, rng)[0]
        a, b = task.demonstration(prompt, rng), task.demonstration(prompt, rng)
        if prefer_longer > 0:
            b = b + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 4)))
            if rng.random() < prefer_longer:
                pairs.append({"prompt": prompt, "chosen": b, "rejected": a})
                continue
        sa, sb = score_one(prompt, a), score_one(prompt, b)
        if sa == sb:
            continue
        chosen, rejected = (a, b) if sa > sb else (b, a)
        pairs.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return pairs
