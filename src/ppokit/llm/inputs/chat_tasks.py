"""Verifiable tasks for pretrained chat models: short questions with one exact answer, asked
through the model's chat template, and ``reasoning-gym`` datasets as a task source.

The built-in tasks of :mod:`ppokit.llm.inputs.task` are written for the built-in tiny model and
its character tokenizer. A real checkpoint needs tasks it can partly solve: group-relative
methods learn only from groups whose rewards differ, so a task the model never or always
solves teaches nothing. The tasks here were chosen on SmolLM2-135M-Instruct, whose
held-out accuracy on them starts between about 10 % and 60 % (docs/real_models.md).

A task row is ``{"prompt": [{"role": "user", "content": question}], "answer": "..."}``.
The rewards are ordinary reward functions (ppokit.llm.inputs.rewards, TRL's calling convention):

* :func:`exact_answer`: 1.0 when the completion's final answer (:func:`final_answer`)
  equals the ``answer`` column, else 0.0;
* :func:`answer_only`: 1.0 when the whole completion is the answer and nothing else (a
  format reward, optional: ``--reward-weights 1,0.2`` with both, as the task's weights).

Held-out problems are never trained on: a problem is held out when a fixed hash of its
*content* (the operands, not the wording) falls in the held-out bucket (10 %), so a
rephrased question cannot leak it.

``--task reasoning-gym:NAME`` draws problems from the ``reasoning-gym`` package's dataset
``NAME`` (``pip install 'ppokit[reasoning]'``), with the dataset's own settings from
``task_options`` (a JSON object) and the dataset's own scorer on the final answer.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from ppokit.errors import UsageError

__all__ = ["CHAT_TASKS", "ChatTask", "ReasoningGymTask", "exact_answer", "answer_only",
           "final_answer", "is_chat_task", "make_chat_task"]

HELD_OUT_PERCENT = 10
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _held_out(key: str, percent: int = HELD_OUT_PERCENT) -> bool:
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "little")
    return h % 100 < percent


def _text(completion) -> str:
    return completion if isinstance(completion, str) else completion[0]["content"]


def final_answer(text: str, numeric: bool = True) -> str | None:
    """The answer a completion gives: the content of its last ``<answer>…</answer>`` when
    it has one; else, for a numeric answer, the last number in it (commas between digits
    removed: ``1,000`` is ``1000``); else its last word. None when there is none."""
    tagged = re.findall(r"<answer>(.*?)</answer>", text, flags=re.S)
    if tagged:
        text = tagged[-1]
    if numeric:
        found = _NUMBER.findall(re.sub(r"(?<=\d),(?=\d{3}\b)", "", text))
        return found[-1] if found else None
    words = re.findall(r"[A-Za-z]+", text)
    return words[-1].lower() if words else None


def _same(got: str | None, want: str) -> bool:
    if got is None:
        return False
    try:
        return float(got) == float(want)
    except ValueError:
        return got.strip().lower() == want.strip().lower()


def exact_answer(completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion's :func:`final_answer` equals ``answer``, else 0.0."""
    out = []
    for c, a in zip(completions, answer):
        numeric = _NUMBER.fullmatch(str(a).strip()) is not None
        out.append(1.0 if _same(final_answer(_text(c), numeric), str(a)) else 0.0)
    return out


def answer_only(completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion is the answer alone (surrounding spaces and one final period
    allowed), else 0.0: a format reward."""
    return [1.0 if _text(c).strip().rstrip(".").strip().lower() == str(a).strip().lower()
            else 0.0 for c, a in zip(completions, answer)]


@dataclass(frozen=True)
class _Template:
    """One kind of question: ``draw(rng) -> (content key, question, answer)``."""

    name: str
    draw: Callable[[random.Random], tuple[str, str, str]]


def _add(rng):
    a, b = rng.randrange(10, 100), rng.randrange(1, 10)
    return f"add {a} {b}", f"What is {a} + {b}?", str(a + b)


def _sub(rng):
    a, b = rng.randrange(10, 100), rng.randrange(1, 10)
    return f"sub {a} {b}", f"What is {a} - {b}?", str(a - b)


def _mul(rng):
    a, b = rng.randrange(2, 13), rng.randrange(2, 13)
    return f"mul {a} {b}", f"What is {a} times {b}?", str(a * b)


def _larger(rng):
    a, b = rng.sample(range(1, 1000), 2)
    return f"max {a} {b}", f"Which number is larger, {a} or {b}?", str(max(a, b))


def _next(rng):
    a = rng.randrange(1, 1000)
    return f"next {a}", f"What number comes right after {a}?", str(a + 1)


TEMPLATES = {t.name: t for t in (_Template("add", _add), _Template("sub", _sub),
                                 _Template("mul", _mul), _Template("larger", _larger),
                                 _Template("next", _next))}


@dataclass
class ChatTask:
    """Questions drawn from ``templates`` (each equally likely), as chat prompts."""

    name: str
    templates: tuple[str, ...]
    max_new_tokens: int = 32
    instruction: str = ""  # appended to every question

    rewards = (exact_answer, answer_only)
    reward_weights = (1.0, 0.0)  # the format reward is logged, not optimised, by default
    chat = True

    def _one(self, rng: random.Random, held_out: bool) -> tuple[str, str]:
        while True:
            t = TEMPLATES[self.templates[rng.randrange(len(self.templates))]]
            key, q, a = t.draw(rng)
            if _held_out(f"{self.name}:{key}") == held_out:
                return q + self.instruction, a

    def train_prompts(self, n: int, rng: random.Random) -> list[str]:
        return [self._encode(*self._one(rng, False)) for _ in range(n)]

    def heldout_prompts(self, n: int = 128, seed: int = 12345) -> list[str]:
        """``n`` distinct held-out problems (fewer if the task has fewer)."""
        rng, seen, out = random.Random(seed), set(), []
        for _ in range(50 * n):
            q, a = self._one(rng, True)
            if q not in seen:
                seen.add(q)
                out.append(self._encode(q, a))
                if len(out) == n:
                    break
        return out

    @staticmethod
    def _encode(question: str, answer: str) -> str:
        return json.dumps([question, answer])

    def row(self, prompt: str) -> dict:
        question, answer = json.loads(prompt)
        return {"prompt": [{"role": "user", "content": question}], "answer": answer}

    sft_steps = 0


CHAT_TASKS = {
    "numbers": ChatTask("numbers", ("add", "sub", "mul", "larger", "next"),
                        instruction=" Answer with just the number."),
}


class ReasoningGymTask(ChatTask):
    """A ``reasoning-gym`` dataset as a task: its questions as chat prompts, its own scorer
    as the reward, applied to the completion's final answer (:func:`final_answer` for a
    numeric answer, else the last line, or the ``<answer>`` tag's content). The dataset is
    built once (seed 1, ``size`` problems); a question is held out when a fixed hash of its
    text falls in the held-out bucket, so the two sides never share a question."""

    reward_weights = (1.0,)

    def __init__(self, dataset: str, options: dict | None = None, size: int = 20_000,
                 max_new_tokens: int = 64):
        try:
            import reasoning_gym
        except ImportError:
            raise UsageError("task: reasoning-gym tasks need the reasoning-gym package "
                             "(pip install 'ppokit[reasoning]')") from None
        from reasoning_gym.factory import DATASETS

        if dataset not in DATASETS:
            import difflib

            close = difflib.get_close_matches(dataset, sorted(DATASETS), n=3)
            raise UsageError(f"task: reasoning-gym has no dataset {dataset!r}"
                             + (f"; did you mean {', '.join(close)}?" if close else ""))
        opts = dict(options or {})
        try:
            self.data = reasoning_gym.create_dataset(dataset, seed=1, size=size, **opts)
        except (TypeError, ValueError, AssertionError) as exc:
            raise UsageError(f"task_options: reasoning-gym dataset {dataset!r} refused them: "
                             f"{exc}") from None
        held, train, seen = [], [], set()
        for i, e in enumerate(self.data):
            q = e["question"]
            if _held_out(f"{dataset}:{q}"):
                if q not in seen:
                    held.append(i)
                    seen.add(q)
            else:
                train.append(i)
        if not held or not train:
            raise UsageError(f"task_options: reasoning-gym dataset {dataset!r} with these "
                             f"settings has too few distinct problems ({len(set(seen))} held "
                             f"out, {len(train)} for training) to hold some out")
        self.train_index, self.held_index = train, held
        super().__init__(f"reasoning-gym:{dataset}", (), max_new_tokens)
        self.rewards = (self.reasoning_gym_score,)

    def train_prompts(self, n: int, rng: random.Random) -> list[str]:
        return [str(self.train_index[rng.randrange(len(self.train_index))])
                for _ in range(n)]

    def heldout_prompts(self, n: int = 128, seed: int = 12345) -> list[str]:
        return [str(i) for i in self.held_index[:n]]

    def row(self, prompt: str) -> dict:
        e = self.data[int(prompt)]
        return {"prompt": [{"role": "user", "content": e["question"]}],
                "answer": str(e["answer"]), "entry": int(prompt)}

    def reasoning_gym_score(self, completions, entry, **kwargs) -> list[float]:
        """The dataset's own scorer on each completion's final answer."""
        out = []
        for c, i in zip(completions, entry):
            e = self.data[int(i)]
            text = _text(c)
            numeric = _NUMBER.fullmatch(str(e["answer"]).strip()) is not None
            tagged = re.findall(r"<answer>(.*?)</answer>", text, flags=re.S)
            if numeric:
                got = final_answer(text, True)
            elif tagged:
                got = tagged[-1].strip()
            else:
                lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
                got = lines[-1] if lines else None
            out.append(float(self.data.score_answer(got, e)) if got else 0.0)
        return out


def is_chat_task(name) -> bool:
    return isinstance(name, str) and (name in CHAT_TASKS or name.startswith("reasoning-gym:"))


def make_chat_task(name: str, options: str | None = None):
    if name in CHAT_TASKS:
        if options:
            raise UsageError(f"task_options: the built-in task {name!r} takes none")
        return CHAT_TASKS[name]
    if name.startswith("reasoning-gym:"):
        opts = None
        if options:
            try:
                opts = json.loads(options)
            except json.JSONDecodeError as exc:
                raise UsageError(f"task_options: expected a JSON object, got {options!r} "
                                 f"({exc.msg})") from None
            if not isinstance(opts, dict):
                raise UsageError(f"task_options: expected a JSON object, got {options!r}")
        return ReasoningGymTask(name.split(":", 1)[1], opts)
    raise UsageError(f"task: unknown task {name!r}")
