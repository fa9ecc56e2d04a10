"""What a language-model run directory holds besides checkpoints, and how it is read back.

A run keeps its own copy of the prompts it trains and evaluates on (``train_prompts.jsonl``,
``eval_prompts.jsonl``), so that resuming or evaluating it reads nothing outside the run
directory. Its configuration is read back from the newest intact checkpoint (verified with
it), never from ``config.json``, which is a copy for people; and the reward is never taken
from it when it names code or a model elsewhere on disk: the user names it again.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields

from ppokit.errors import UsageError
from ppokit.io.atomic import atomic_write_text, read_regular
from ppokit.io.checkpoint import find_checkpoint, load_checkpoint, no_checkpoint_message

from ..inputs.task import make_task
from .config import LLMConfig
from .presets import DEPRECATED

__all__ = ["TRAIN_PROMPTS", "EVAL_PROMPTS", "config_from_run", "run_prompt_sets", "prompt_sets",
           "load_prompts",
           "write_prompts", "resume_command", "RESUMABLE", "UNNAMED"]

TRAIN_PROMPTS = "train_prompts.jsonl"
EVAL_PROMPTS = "eval_prompts.jsonl"
MAX_PROMPTS_FILE = 2**31
# what may differ from the saved configuration when a run is resumed or evaluated
RESUMABLE = ("iterations", "time_limit", "checkpoint_every", "samples_logged", "reward",
             "reward_model", "n_eval_prompts", "temperature", "learning_rate", "env",
             "tools")
# an agent run's environment module or tools, recorded but not named again: nothing a run
# directory names is imported (the trainer asks for them: ppokit/llm/training/setup.py)
UNNAMED = "unnamed:"
# fields added after runs were first saved, with the value those runs trained with (a
# resumed run goes on as it started, whatever today's default)
ADDED_FIELDS = {"kl_estimator": "k3", "guard_kl": 0.0, "guard_grad_norm": 0.0,
                "temperature": 1.0, "n_epochs": 2, "policy_loss": "clip",
                "clip_range_high": None}


def resume_command(run_dir: str, cfg: LLMConfig, world: int = 1) -> str:
    """The command that continues a run: its reward named again (a run directory never
    names code that ppokit imports), on as many ranks."""
    cmd = f"ppokit llm train --resume {run_dir}"
    env = cfg.env.removeprefix(UNNAMED) if isinstance(cfg.env, str) else None
    if env and ":" in env and not env.startswith("python:"):
        cmd += f" --env {env}"
    tools = cfg.tools.removeprefix(UNNAMED) if isinstance(cfg.tools, str) else None
    if tools and "python:" not in tools:
        cmd += f" --set tools={tools}"
    if isinstance(cfg.reward, str) and cfg.reward:
        cmd += "".join(f" --reward {e.strip()}" for e in cfg.reward.split(",") if e.strip())
    elif cfg.reward is not None:
        cmd = f"{cmd} with your reward functions (Python: reward_funcs=...)"
    if cfg.reward_model:
        cmd += f" --reward-model {cfg.reward_model}"
    from ppokit.plugins import resume_flags

    cmd += resume_flags(policy_loss=cfg.policy_loss,
                        advantage_estimator=cfg.advantage_estimator)
    return cmd + (f" --nproc {world}" if world > 1 else "")


def write_prompts(path: str, rows: list) -> None:
    """The run's copy of its prompt rows (a plain string is written as ``{"prompt": s}``)."""
    atomic_write_text(path, "".join(json.dumps({"prompt": r} if isinstance(r, str) else r)
                                    + "\n" for r in rows))


def _read_prompts(path: str) -> list[dict]:
    from ..inputs.data import check_rows

    if not os.path.lexists(path):
        raise UsageError(f"run dir: {os.path.dirname(path)} has no {os.path.basename(path)}")
    out = []
    for i, line in enumerate(read_regular(path, MAX_PROMPTS_FILE).decode().splitlines(), 1):
        try:
            row = json.loads(line)
            row["prompt"]  # noqa: B018 - a row without a prompt is not a prompt line
        except (ValueError, KeyError, TypeError, RecursionError):
            raise UsageError(f"run dir: {path}:{i}: not a prompt line") from None
        out.append(row)
    if not out:
        return []
    return check_rows(out, f"run dir: {os.path.basename(path)}")


def run_prompt_sets(run_dir: str, cfg: LLMConfig) -> tuple[list[dict] | None, list[dict]]:
    """``(train_prompts, held_out_prompts)`` of an existing run: its own copies for a
    prompts file, the fixed sets of the built-in task otherwise."""
    if cfg.prompts is None:
        return prompt_sets(cfg)
    return (_read_prompts(os.path.join(run_dir, TRAIN_PROMPTS)),
            _read_prompts(os.path.join(run_dir, EVAL_PROMPTS)))


def config_from_run(run_dir: str, **overrides) -> LLMConfig:
    """The configuration of ``run_dir``'s newest intact checkpoint, without its
    ``reward`` / ``reward_model`` (code or paths the user must name again), with the
    non-``None`` ``overrides`` applied (only the :data:`RESUMABLE` fields)."""
    from ppokit.io.rundir import check_run_dir, is_llm_run_dir

    run_dir = str(run_dir)
    check_run_dir(run_dir)
    if not is_llm_run_dir(run_dir):
        raise UsageError(f"RUN_DIR: {run_dir} is an environment run, not a language-model "
                         f"run: continue it with `ppokit train --resume {run_dir}` (evaluate "
                         f"it with `ppokit eval {run_dir}`)")
    ckpt, damaged = find_checkpoint(os.path.join(run_dir, "checkpoints"))
    if ckpt is None:
        raise UsageError(no_checkpoint_message(run_dir, damaged))
    data = load_checkpoint(ckpt)[2].get("config")
    if not isinstance(data, dict):
        raise UsageError(f"run dir: checkpoint {ckpt} holds no configuration")
    known = {f.name for f in fields(LLMConfig)}
    data = {DEPRECATED.get(k, k): v for k, v in data.items() if k != "minibatches"}
    data = {k: v for k, v in data.items() if k in known}
    data = {**ADDED_FIELDS, **data}
    data["reward"] = data["reward_model"] = None
    env, tools = data.get("env"), data.get("tools")
    if isinstance(env, str) and ":" in env and not env.startswith("python:"):
        given = overrides.get("env")
        if given is not None and given != env:
            raise UsageError(f"--env: this run acts in {env!r}, not {given!r}")
        data["env"] = env if given == env else UNNAMED + env  # a module to import
    if tools is not None:
        data["tools"] = UNNAMED + str(tools)
    for k, v in overrides.items():
        if v is None or k == "env":
            continue
        if k not in RESUMABLE:
            raise UsageError(f"--{k.replace('_', '-')}: cannot be changed for an existing "
                             f"run (its saved configuration is used); only "
                             f"{', '.join('--' + r.replace('_', '-') for r in RESUMABLE)} can")
        data[k] = v
    try:
        return LLMConfig(**data)
    except TypeError as exc:
        raise UsageError(f"run dir: checkpoint {ckpt} holds an unusable configuration "
                         f"({exc})") from None


def prompt_sets(cfg: LLMConfig) -> tuple[list[dict] | None, list[dict]]:
    """``(train_rows, held_out_rows)``. Built-in task: train rows are drawn on the fly
    (``None``) and the held-out set is fixed. A prompts dataset without ``eval_prompts``
    holds out its last ``eval_fraction`` of rows (:func:`ppokit.llm.inputs.data.split_rows`)."""
    from ..inputs.data import load_rows, split_rows

    if cfg.prompts is None:
        task = make_task(cfg.task, cfg.task_options)
        return None, [task.row(p) for p in task.heldout_prompts(cfg.n_eval_prompts)]
    rows = load_rows(cfg.prompts, "prompts")
    if cfg.eval_prompts:
        return rows, load_rows(cfg.eval_prompts, "eval_prompts")
    return split_rows(rows, cfg.eval_fraction, "prompts")


def load_prompts(path: str) -> list:
    """The prompts of a dataset file (strings, or message lists for conversations)."""
    from ..inputs.data import load_rows

    return [r["prompt"] for r in load_rows(path, "prompts")]
