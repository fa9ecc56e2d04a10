"""Rewards for token-level RL: Python functions (TRL's calling convention), learned reward
models, or a built-in task's rules; several at once with weights.

**The calling convention.** A reward function is called with keyword arguments only::

    fn(prompts=[...], completions=[...], completion_ids=[...], <column>=[...], ...)

one list entry per completion: ``prompts`` are the dataset's prompts (a string, or the
list of messages of a conversational prompt, repeated for each completion of a group),
``completions`` the decoded completions (a string, or ``[{"role": "assistant", "content":
text}]`` when the prompt is a conversation), ``completion_ids`` the generated token ids
(EOS excluded), and every other dataset column under its own name. A function that takes
``**kwargs`` receives all of them; one that does not receives the ones it names, and a
required parameter ppokit does not pass is an error before training starts.

It returns one value per completion: a finite number, or ``None`` when the function does
not apply to that completion. The score of a completion is ``sum_i w_i r_i`` over the
functions that returned a number (``reward_weights``, default all 1); a completion no
function scored gets 0 (with a warning). A wrong count, a NaN or a value of another type is
an error that names the function.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable

import torch

from ppokit.errors import UsageError, UserCodeError

__all__ = ["load_reward_callable", "RewardModelScorer", "check_scores", "RewardSet",
           "reward_entries", "reward_label"]

BASE_KEYS = ("prompts", "completions", "completion_ids")
FLOAT32_MAX = 3.4028234663852886e38


def _brief(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def load_reward_callable(spec: str, flag: str = "--reward") -> Callable:
    """Import ``module:function`` (e.g. ``ppokit.llm.inputs.task:reverse_score``) with
    :func:`ppokit.plugins.import_user_module` (the current directory first, as for
    ``python -m``). Nothing is imported from a run directory: the user names the
    function."""
    if not isinstance(spec, str) or ":" not in spec:
        raise UsageError(f"{flag}: expected 'module:function', got {spec!r}")
    mod_name, _, fn_name = spec.partition(":")
    if not mod_name or not fn_name:
        raise UsageError(f"{flag}: expected 'module:function', got {spec!r}")
    from ppokit.plugins import import_user_module

    mod = import_user_module(mod_name, flag, spec)
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise UsageError(f"{flag}: {mod_name!r} has no callable {fn_name!r}")
    return fn


def reward_entries(reward) -> list:
    """A config's ``reward`` as a list of entries (``module:function`` strings, reward-model
    directories, callables): a comma-separated string is split."""
    if reward is None:
        return []
    if isinstance(reward, str):
        return [s.strip() for s in reward.split(",") if s.strip()]
    if callable(reward):
        return [reward]
    if isinstance(reward, (list, tuple)):
        out = []
        for r in reward:
            out += reward_entries(r) if isinstance(r, str) else [r]
        return out
    raise UsageError(f"reward: expected a callable, 'module:function', a reward-model "
                     f"directory or a list of them, got {type(reward).__name__}")


def reward_label(entry) -> str:
    """What a run directory records of a reward entry (never code to import)."""
    if isinstance(entry, str):
        return entry
    mod = getattr(entry, "__module__", None) or "?"
    name = getattr(entry, "__qualname__", None) or type(entry).__name__
    return f"python:{mod}.{name}"


def _name_of(entry, fn) -> str:
    if isinstance(entry, str):
        return entry.rpartition(":")[2] if ":" in entry else "reward_model"
    return getattr(fn, "__name__", None) or type(fn).__name__


def check_scores(scores, n: int, name: str = "reward", call: str = "") -> torch.Tensor:
    """One reward function's return value as a float32 ``[n]`` tensor, NaN where it said
    ``None``; a wrong count, type, a non-finite number or one beyond float32's range is a
    one-line :class:`UserCodeError` naming the function (and ``call``, which call it was)."""
    where = f"reward function {name!r}" + (f" ({call})" if call else "")
    if isinstance(scores, torch.Tensor) or type(scores).__module__ == "numpy":
        try:
            s = torch.as_tensor(scores).detach().to("cpu", torch.float64).reshape(-1)
        except (TypeError, ValueError, RuntimeError):
            raise UserCodeError(f"{where}: returned an array that is not numeric") from None
        vals = s.tolist()
        if not all(math.isfinite(v) for v in vals):
            bad = [i for i, v in enumerate(vals) if not math.isfinite(v)][:5]
            raise UserCodeError(f"{where}: returned NaN or inf at indices {bad} (return None "
                                "for a completion the function does not apply to)")
    elif isinstance(scores, (list, tuple)):
        vals = []
        for i, v in enumerate(scores):
            if v is None:
                vals.append(math.nan)
                continue
            if isinstance(v, bool) or not _is_number(v):
                raise UserCodeError(f"{where}: element {i} is {type(v).__name__} "
                                    f"{v!r:.40}, expected a float or None")
            try:
                f = float(v)
            except OverflowError:  # an int too large for a float
                f = math.inf
            if not math.isfinite(f):
                raise UserCodeError(f"{where}: element {i} is {f} (return None for a "
                                    "completion the function does not apply to)")
            vals.append(f)
    else:
        raise UserCodeError(f"{where}: returned {type(scores).__name__}, expected a list of "
                            f"{n} floats or None (one per completion)")
    if len(vals) != n:
        raise UserCodeError(f"{where}: returned {len(vals)} values, expected {n} (one per "
                            "completion)")
    big = [i for i, v in enumerate(vals) if abs(v) > FLOAT32_MAX]
    if big:
        raise UserCodeError(f"{where}: element {big[0]} is {vals[big[0]]:g}, beyond the "
                            f"float32 range (|r| <= {FLOAT32_MAX:.3g}) the rewards are "
                            "computed in")
    return torch.tensor(vals, dtype=torch.float32)


def _is_number(v) -> bool:
    if isinstance(v, (int, float)):
        return True
    try:  # numpy / torch scalars
        float(v)
    except (TypeError, ValueError):
        return False
    return not isinstance(v, str) and hasattr(v, "__float__")


class _Func:
    """One reward function with its name, weight and the keywords it accepts."""

    def __init__(self, name: str, fn: Callable, weight: float):
        self.name, self.fn, self.weight = name, fn, weight
        self.takes_all, self.params, self.required = True, set(), set()
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without a signature: pass everything
            return
        ps = sig.parameters.values()
        positional_only = [p.name for p in ps if p.kind is p.POSITIONAL_ONLY]
        if positional_only:
            raise UsageError(f"reward function {name!r}: parameter {positional_only[0]!r} is "
                             "positional-only; rewards are called with keyword arguments "
                             "(def f(prompts, completions, **kwargs))")
        self.takes_all = any(p.kind is p.VAR_KEYWORD for p in ps)
        self.params = {p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                         p.KEYWORD_ONLY)}
        self.required = {p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                           p.KEYWORD_ONLY)
                         and p.default is p.empty}

    def check(self, available: list[str]) -> None:
        missing = sorted(self.required - set(available))
        if missing:
            raise UsageError(
                f"reward function {self.name!r}: required parameter {missing[0]!r} is not "
                f"passed; rewards are called with keyword arguments {', '.join(available)} "
                "(write def f(prompts, completions, **kwargs))")
        if not self.takes_all and not self.params & set(available):
            raise UsageError(f"reward function {self.name!r}: takes none of the keyword "
                             f"arguments {', '.join(available)}")

    def __call__(self, kwargs: dict, call: str = ""):
        """The function's scores of one batch, checked (:func:`check_scores`); what it
        raises is a :class:`UserCodeError` naming it and ``call``."""
        n = len(kwargs["completions"])
        if not self.takes_all:
            kwargs = {k: v for k, v in kwargs.items() if k in self.params}
        try:
            scores = self.fn(**kwargs)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's code: named, traceback kept
            where = f" ({call})" if call else ""
            raise UserCodeError(f"reward function {self.name!r}{where}: raised "
                                f"{_brief(exc)}") from exc
        return check_scores(scores, n, self.name, call)


class RewardSet:
    """Reward functions with weights: ``(total [n], {name: [n] with NaN for None})``."""

    def __init__(self, entries: list, weights=None, *, log=print):
        entries = list(entries)
        if not entries:
            raise UsageError("reward: no reward function given")
        if weights is None:
            weights = [1.0] * len(entries)
        weights = list(weights)
        if len(weights) != len(entries):
            raise UsageError(f"reward_weights: {len(weights)} weights for {len(entries)} "
                             "reward functions")
        self.log = log
        self.labels = [reward_label(e) for e in entries]
        self.funcs: list[_Func] = []
        seen: dict[str, int] = {}
        for e, w in zip(entries, weights):
            fn = self._resolve(e)
            name = _name_of(e, fn)
            seen[name] = seen.get(name, 0) + 1
            if seen[name] > 1:
                name = f"{name}_{seen[name]}"
            self.funcs.append(_Func(name, fn, float(w)))
        self._warned_unscored = False
        self.calls = 0
        # what the calls are for, said in errors ("the check before training",
        # "iteration 3"); the trainer sets it
        self.when = ""

    @staticmethod
    def _resolve(e) -> Callable:
        if callable(e):
            return e
        if isinstance(e, str):
            if ":" not in e and os.path.isdir(e):
                return RewardModelScorer(e)
            return load_reward_callable(e)
        raise UsageError(f"reward: expected a callable, 'module:function' or a reward-model "
                         f"directory, got {type(e).__name__}")

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.funcs]

    def check_signatures(self, columns) -> None:
        """Before training: every function can be called with what ppokit passes."""
        available = list(BASE_KEYS) + [c for c in columns if c not in BASE_KEYS
                                       and c != "prompt"]
        for f in self.funcs:
            f.check(available)

    def __call__(self, prompts: list, completions: list, completion_ids: list | None = None,
                 columns: dict | None = None) -> tuple[torch.Tensor, dict]:
        n = len(completions)
        kwargs = dict(columns or {})
        kwargs.update(prompts=prompts, completions=completions,
                      completion_ids=completion_ids if completion_ids is not None
                      else [[] for _ in range(n)])
        self.calls += 1
        call = f"call {self.calls}" + (f", {self.when}" if self.when else "")
        per = {}
        for f in self.funcs:
            per[f.name] = f(kwargs, call)
        stacked = torch.stack([per[f.name] for f in self.funcs])
        weights = torch.tensor([f.weight for f in self.funcs])[:, None]
        scored = ~torch.isnan(stacked)
        total = torch.where(scored, stacked * weights, torch.zeros(())).sum(0)
        none_scored = ~scored.any(0)
        if bool(none_scored.any()) and not self._warned_unscored:
            self._warned_unscored = True
            self.log(f"warning: every reward function returned None for "
                     f"{int(none_scored.sum())} of {n} completions; they score 0")
        return total, per


def per_function_stats(per: dict) -> dict:
    """``reward/NAME`` (mean over the completions it scored) and ``reward/NAME_std``."""
    out = {}
    for name, v in per.items():
        ok = v[~torch.isnan(v)]
        out[f"reward/{name}"] = float(ok.mean()) if ok.numel() else math.nan
        out[f"reward/{name}_std"] = float(ok.std()) if ok.numel() > 1 else 0.0
    return out


class RewardModelScorer:
    """Scores ``prompt + completion + EOS`` with a sequence-classification reward model
    saved by ``ppokit llm rm`` (or any local ``AutoModelForSequenceClassification`` dir
    with one label). Plain-text prompts only."""

    def __init__(self, path: str, batch_size: int = 64):
        from transformers import AutoModelForSequenceClassification

        from ..modeling.models import check_local_dir, load_tokenizer

        check_local_dir(path, "--reward-model")
        self.tokenizer = load_tokenizer(path)
        try:
            self.model = AutoModelForSequenceClassification.from_pretrained(
                path, trust_remote_code=False, local_files_only=True, use_safetensors=True)
        except Exception as exc:  # noqa: BLE001
            raise UsageError(f"--reward-model: cannot load {path!r}: {exc}") from None
        self.model.eval()
        self.batch_size = batch_size
        self.__name__ = "reward_model"

    @torch.no_grad()
    def __call__(self, prompts: list[str], completions: list[str]) -> list[float]:
        from ..modeling.pairs import encode_pairs, reward_forward

        if any(not isinstance(x, str) for x in (*prompts, *completions)):
            raise UsageError("reward_model: scores plain-text prompts and completions; "
                             "conversational (chat) prompts need a reward function")
        out = []
        for i in range(0, len(prompts), self.batch_size):
            ids, attn, _ = encode_pairs(self.tokenizer, prompts[i:i + self.batch_size],
                                        completions[i:i + self.batch_size])
            out.extend(reward_forward(self.model, ids, attn).tolist())
        return out
