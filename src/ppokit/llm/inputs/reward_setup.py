"""The reward side of a token run, set up from its configuration: which reward functions
score it (:func:`reward_set`), what they receive (:func:`reward_arguments`, TRL's keyword
convention), and the rule that a resumed or evaluated run names its reward code again
(:func:`check_reward_named_again`). ``cfg`` is the run's
:class:`ppokit.llm.training.config.LLMConfig`, read by field name (inputs sits below
training, docs/architecture.md#layers)."""

from __future__ import annotations

from ppokit.errors import UsageError

from .task import make_task

__all__ = ["reward_set", "reward_arguments", "check_reward_named_again"]


def check_reward_named_again(cfg, saved: dict | None, reward_fn) -> None:
    """A resumed run whose reward is code (or a reward model elsewhere on disk) needs the
    user to name it again: nothing a run directory says is imported or read."""
    saved = saved if isinstance(saved, dict) else {}
    if reward_fn is not None:
        return
    for key, flag in (("reward", "--reward"), ("reward_model", "--reward-model")):
        old = saved.get(key)
        if old and not getattr(cfg, key) and not (cfg.reward or cfg.reward_model):
            if key == "reward" and "python:" in str(old):
                again = ("the reward functions again (reward_funcs= in Python, or "
                         "--reward module:function)")
            elif key == "reward":
                again = " ".join(f"--reward {e}" for e in str(old).split(","))
                again += " again (or reward_funcs= in Python)"
            else:
                again = f"{flag} {old} again (or reward_funcs= in Python)"
            raise UsageError(f"{flag}: this run was trained with {key} {old!r}; ppokit does "
                             "not load code or models named inside a run directory: pass "
                             f"{again}")


def reward_set(cfg, reward_fn=None, task=None, log=print):
    """The :class:`ppokit.llm.inputs.rewards.RewardSet` of a configuration: ``reward_fn`` (a
    callable or a list) when given, else the config's ``reward`` entries and
    ``reward_model``, else the built-in task's rewards and weights."""
    from .rewards import RewardModelScorer, RewardSet, reward_entries

    weights = cfg.reward_weights
    if reward_fn is not None:
        if cfg.reward_model:
            raise UsageError("reward_model: give it in reward_funcs (a directory there is a "
                             "reward model) together with your functions, not beside them")
        entries = list(reward_fn) if isinstance(reward_fn, (list, tuple)) else [reward_fn]
    else:
        entries = reward_entries(cfg.reward)
        if cfg.reward_model:
            entries.append(RewardModelScorer(cfg.reward_model))
    if not entries:
        if cfg.prompts is not None:
            raise UsageError("reward: with --prompts give --reward module:function or "
                             "--reward-model PATH")
        task = task or make_task(cfg.task, cfg.task_options)
        entries, weights = list(task.rewards), weights or task.reward_weights
    return RewardSet(entries, weights, log=log)


def reward_arguments(rows: list[dict], texts: list[str], completion_ids) -> tuple[list, dict]:
    """``(completions, keyword arguments)`` of the reward functions for one batch: a
    conversational prompt's completion is ``[{"role": "assistant", "content": text}]``;
    every column other than ``prompt`` is passed under its own name."""
    from .data import is_conversation
    from .rewards import BASE_KEYS

    comps = [[{"role": "assistant", "content": t}] if is_conversation(r["prompt"]) else t
             for r, t in zip(rows, texts)]
    kwargs = {"prompts": [r["prompt"] for r in rows], "completions": comps,
              "completion_ids": [list(i) for i in completion_ids]}
    for k in sorted({k for r in rows for k in r} - {"prompt", *BASE_KEYS}):
        kwargs[k] = [r.get(k) for r in rows]
    return comps, kwargs
