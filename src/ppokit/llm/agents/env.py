"""Text environments: where a language model acts over several turns.

A text environment has Gymnasium's shape with text in place of arrays:

* ``reset(seed=None, options=None) -> (observation, info)``
* ``step(assistant_text) -> (observation, reward, terminated, truncated, info)``

An observation is a string (one user message) or a list of chat messages (``{"role":
..., "content": ...}`` with role ``user``, ``system`` or ``tool``); ``reward`` a finite
number; ``terminated`` that the episode reached an end of the task (nothing follows: no
bootstrap), ``truncated`` that it was cut (a turn limit: the critic's value of where it
stopped stands in for the rest). Any ``gymnasium.Env`` whose spaces are
``gymnasium.spaces.Text`` works as it is, a registered id or ``module:Id`` included (the
module is imported only because the user names it); in Python also a factory (a callable
returning an environment) or an instance.

Every value an environment returns is checked where it enters (:class:`CheckedTextEnv`),
and an error names the environment and what was expected; so does anything its
``reset`` or ``step`` raises (``SystemExit`` included; a ``KeyboardInterrupt`` is the
user's Ctrl-C and stops the run as one).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from ppokit.errors import UsageError, UserCodeError

from .toolworker import describe

__all__ = ["CheckedTextEnv", "make_text_env", "text_env_factory", "messages_of",
           "GuessNumberEnv", "ToolArithmeticEnv", "calc", "TEXT_ENVS"]

ROLES = ("user", "system", "tool")


def messages_of(obs: Any, where: str) -> list[dict]:
    """An observation as a list of chat messages (a string is one user message)."""
    if isinstance(obs, str):
        return [{"role": "user", "content": obs}]
    if isinstance(obs, (list, tuple)) and obs and all(
            isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)
            for m in obs):
        return [{"role": m["role"], "content": m["content"]} for m in obs]
    raise UserCodeError(f"{where}: expected an observation that is a string or a non-empty "
                        f"list of messages {{'role': one of {', '.join(ROLES)}, 'content': "
                        f"str}}, got {type(obs).__name__} {str(obs)[:80]!r}")


class CheckedTextEnv:
    """A text environment whose every return is checked (module doc); ``label`` names it
    in errors."""

    def __init__(self, env: Any, label: str):
        for name in ("reset", "step"):
            if not callable(getattr(env, name, None)):
                raise UsageError(f"env: {label} has no {name}() method; a text environment "
                                 "has Gymnasium's reset(seed=...) and step(text)")
        self.env, self.label = env, label

    def reset(self, seed: int | None = None) -> tuple[list[dict], dict]:
        where = f"env {self.label}: reset(seed={seed})"
        try:
            out = self.env.reset(seed=seed)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: the user's code failed
            raise UserCodeError(f"{where} raised {describe(exc)}") from exc
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
            raise UserCodeError(f"{where}: expected (observation, info), got "
                                f"{type(out).__name__}")
        return messages_of(out[0], where), out[1]

    def step(self, text: str) -> tuple[list[dict] | None, float, bool, bool, dict]:
        where = f"env {self.label}: step()"
        try:
            out = self.env.step(text)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: the user's code failed
            raise UserCodeError(f"{where} raised {describe(exc)}") from exc
        if not (isinstance(out, tuple) and len(out) == 5):
            raise UserCodeError(f"{where}: expected (observation, reward, terminated, "
                                f"truncated, info), got {type(out).__name__}")
        obs, reward, term, trunc, info = out
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) \
                or not math.isfinite(float(reward)):
            raise UserCodeError(f"{where}: expected a finite number as the reward, got "
                                f"{reward!r}")
        for name, flag in (("terminated", term), ("truncated", trunc)):
            if not isinstance(flag, bool):
                raise UserCodeError(f"{where}: expected {name} to be True or False, got "
                                    f"{flag!r}")
        if not isinstance(info, dict):
            raise UserCodeError(f"{where}: expected info to be a dict, got "
                                f"{type(info).__name__}")
        end = term or trunc
        messages = None if end and obs in (None, "") else messages_of(obs, where)
        return messages, float(reward), term, trunc, info

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def text_env_factory(env: Any, env_kwargs: dict | None = None) -> tuple[Callable, str]:
    """``(factory, label)`` of what the user named: a registered id or ``module:Id``
    (Gymnasium's ``make``; the module imported only because it is named here, by
    :func:`ppokit.plugins.import_user_module`), ppokit's own text environments
    (:data:`TEXT_ENVS`), a factory, or an instance (then every call returns that one
    instance: one environment at a time). What the user's code raises while the
    environment is made is one line naming it (:func:`ppokit.plugins.user_code`)."""
    from ppokit.plugins import import_user_module, user_code

    kw = dict(env_kwargs or {})
    if isinstance(env, str):
        name = env.strip()
        if name in TEXT_ENVS:
            return (lambda: TEXT_ENVS[name](**kw)), name
        if ":" in name:
            module, name = name.split(":", 1)
            import_user_module(module, "env", env)
        return _registered(env, name, kw), env
    if not isinstance(env, type) and callable(getattr(env, "reset", None)) \
            and callable(getattr(env, "step", None)):
        return (lambda: env), type(env).__name__
    if callable(env):
        label = getattr(env, "__name__", type(env).__name__)

        def made():
            with user_code(f"env {label}", "the factory"):
                return env(**kw)
        return made, label
    raise UsageError(f"env: expected a text environment id, module:Id, a factory or an "
                     f"instance, got {type(env).__name__}")


def _registered(env: str, name: str, kw: dict) -> Callable:
    """The factory of the registered id ``name`` (named ``env``): ``gymnasium.make``. A
    registered class that is not a ``gymnasium.Env`` (which ``make`` refuses) is refused
    here, before any work."""
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    from ppokit.plugins import user_code

    if name not in gymnasium.registry:
        raise UsageError(f"env: {env!r} is not a registered environment; known text "
                         f"environments: {', '.join(TEXT_ENVS)} (or module:Id)")
    entry = gymnasium.registry[name].entry_point
    if isinstance(entry, str):
        with user_code(f"env {env!r}", f"loading its entry point {entry!r}"):
            entry = load_env_creator(entry)
    if isinstance(entry, type) and not issubclass(entry, gymnasium.Env):
        raise UsageError(f"env {env!r}: its class {entry.__qualname__} does not subclass "
                         "gymnasium.Env, which an environment made from a registered id must "
                         "(from Python, a class with reset() and step() works as a factory: "
                         "env=MyEnv)")

    def made():
        with user_code(f"env {env!r}", "making it (gymnasium.make)"):
            return gymnasium.make(name, **kw)
    return made


def make_text_env(env: Any, env_kwargs: dict | None = None) -> CheckedTextEnv:
    factory, label = text_env_factory(env, env_kwargs)
    return CheckedTextEnv(factory(), label)


# ----------------------------------------------------------------------------- built-in

class GuessNumberEnv:
    """Guess a number in ``1..n``: each guess is answered ``higher``, ``lower`` or
    ``correct``; reward 1 for the correct guess (the episode terminates), ``-guess_cost``
    for each other guess; the episode is truncated after ``max_turns`` guesses. Optimal
    play (bisection) needs ``floor(log2(n)) + 1`` guesses at most (5 for n = 16; about
    ``log2(n) - 1`` on average). The texts use only the
    built-in model's characters, so the built-in tiny model can play (``demonstration``
    plays noisy bisection for its warm start)."""

    def __init__(self, n: int = 16, max_turns: int = 8, guess_cost: float = 0.1):
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= 10**6:
            raise UsageError(f"env_kwargs: n: expected an integer in [2, 1000000], got {n!r}")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) \
                or not 1 <= max_turns <= 1000:
            raise UsageError(f"env_kwargs: max_turns: expected an integer in [1, 1000], got "
                             f"{max_turns!r}")
        if isinstance(guess_cost, bool) or not isinstance(guess_cost, (int, float)) \
                or not 0 <= guess_cost <= 1:
            raise UsageError(f"env_kwargs: guess_cost: expected a number in [0, 1], got "
                             f"{guess_cost!r}")
        self.n, self.max_turns, self.guess_cost = n, max_turns, float(guess_cost)
        self.rng = random.Random(0)
        self.target, self.turns = 1, 0

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.rng = random.Random(seed)
        self.target, self.turns = self.rng.randint(1, self.n), 0
        return f"guess 1-{self.n}:", {"target": self.target}

    def step(self, text: str):
        self.turns += 1
        guess = _first_int(text)
        if guess == self.target:
            return "correct", 1.0, True, False, {"guesses": self.turns}
        if guess is None:
            feedback = "a number"
        else:
            feedback = "higher" if guess < self.target else "lower"
        return (feedback + ":", -self.guess_cost, False, self.turns >= self.max_turns, {})

    def demonstration(self, rng: random.Random, noise: float = 0.3) -> list[str]:
        """The assistant turns of one game from the current reset, by bisection with a
        random guess now and then (the warm start's imperfect demonstrations)."""
        lo, hi, turns = 1, self.n, []
        for _ in range(self.max_turns):
            guess = rng.randint(lo, hi) if rng.random() < noise else (lo + hi) // 2
            turns.append(str(guess))
            if guess == self.target:
                break
            lo, hi = (guess + 1, hi) if guess < self.target else (lo, guess - 1)
        return turns


def _first_int(text: str) -> int | None:
    digits = ""
    for ch in text.strip():
        if ch.isdigit():
            digits += ch
        elif digits:
            break
    return int(digits) if digits and len(digits) <= 9 else None


def calc(expression: str) -> int:
    """Compute a sum, difference or product of whole numbers.

    Args:
        expression: two whole numbers joined by +, - or x (times), e.g. 37x48
    """
    for op, fn in (("x", lambda a, b: a * b), ("+", lambda a, b: a + b),
                   ("-", lambda a, b: a - b)):
        a, sep, b = expression.strip().partition(op)
        if sep and a.strip().isdigit() and b.strip().isdigit():
            return fn(int(a), int(b))
    raise ValueError(f"expected two whole numbers joined by +, - or x, got {expression!r}")


class ToolArithmeticEnv:
    """Multiply two ``digits``-digit numbers: ``37x48=``. The answer is the first whole
    number of the model's turn that is not a tool call; reward 1 if it is the product,
    else 0, and the episode terminates. A model with the ``calc`` tool (:func:`calc`,
    compact format ``calc:37x48``) reads the product in the tool's reply and copies it; a
    model without it has to multiply in its head, which the built-in tiny model cannot.
    ``demonstration`` gives the two turns of the tool's use for the warm start (with
    ``tools=False``, the product as the only turn: the baseline without the tool)."""

    def __init__(self, digits: int = 2, max_turns: int = 3, tools: bool = True):
        if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 6:
            raise UsageError(f"env_kwargs: digits: expected an integer in [1, 6], got "
                             f"{digits!r}")
        self.digits, self.max_turns, self.tools = digits, max_turns, bool(tools)
        self.rng = random.Random(0)
        self.a = self.b = self.turns = 0

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.rng = random.Random(seed)
        lo, hi = 10 ** (self.digits - 1), 10 ** self.digits - 1
        self.a, self.b, self.turns = self.rng.randint(lo, hi), self.rng.randint(lo, hi), 0
        return f"{self.a}x{self.b}=", {}

    def step(self, text: str):
        self.turns += 1
        ok = _first_int(text) == self.a * self.b
        return "", float(ok), True, False, {"correct": ok}

    def demonstration(self, rng: random.Random) -> list[str]:
        answer = str(self.a * self.b)
        return [f"calc:{self.a}x{self.b}", answer] if self.tools else [answer]


def _textworld(**kw):
    from .textworld_env import TextWorldEnv

    return TextWorldEnv(**kw)


TEXT_ENVS: dict[str, Callable[..., Any]] = {"ppokit/GuessNumber-v0": GuessNumberEnv,
                                            "ppokit/ToolArithmetic-v0": ToolArithmeticEnv,
                                            "textworld": _textworld}
