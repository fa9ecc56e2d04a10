"""Held-out evaluation: score the trained policy and the reference (warm-start) policy on
the same prompts with the same sampling settings and seed (an agent run's held-out
episodes: :mod:`.agent_eval`)."""

from __future__ import annotations

import json
import os

from ppokit.errors import UsageError
from ppokit.io.atomic import atomic_write_text

from ..training.heldout import score_policy
from .runmodels import eval_models, resolved_for_eval, run_checkpoint

__all__ = ["score_policy", "evaluate_lm_run"]


def evaluate_lm_run(run_dir: str, *, n_prompts: int | None = None, temperature: float | None = None,
                 seed: int = 1234, greedy: bool = True, log=print, reward: str | None = None,
                 reward_model: str | None = None, reward_fn=None, env=None, tools=None) -> dict:
    """Score ``RUN_DIR``'s trained policy (its newest intact checkpoint) and its reference
    on the run's held-out prompts; write ``RUN_DIR/eval.json`` and return it. An agent run
    (``env`` set) plays held-out episodes instead (:mod:`.agent_eval`).

    Only the run's own files are read. A run trained with a reward function or a reward
    model gets it from the caller (``reward`` / ``reward_model`` / ``reward_fn``), never
    from the run directory; likewise an agent run's environment module and tools
    (``env`` / ``tools``)."""
    from ppokit.io import RunLock

    from ..training.runfiles import config_from_run

    if not os.path.isdir(run_dir):
        raise UsageError(f"RUN_DIR: no such directory {run_dir!r}")
    if n_prompts is not None and n_prompts < 1:
        raise UsageError(f"--n-prompts: expected an integer >= 1, got {n_prompts}")
    if temperature is not None and not (temperature >= 0 and temperature < float("inf")):
        raise UsageError(f"--temperature: expected a finite number >= 0, got {temperature}")
    with RunLock(run_dir, "eval"):
        cfg = config_from_run(run_dir, n_eval_prompts=n_prompts, reward=reward,
                              reward_model=reward_model,
                              env=env if isinstance(env, str) else None)
        if cfg.env is not None:
            from ..training.runfiles import UNNAMED
            from .agent_eval import evaluate_agent_run

            if reward or reward_model or reward_fn is not None:
                raise UsageError(f"--reward: {run_dir} is an agent run (env "
                                 f"{cfg.env.removeprefix(UNNAMED)}); its rewards are its "
                                 "environment's")
            out = evaluate_agent_run(run_dir, cfg, env=env, tools=tools, temperature=temperature,
                                     seed=seed, greedy=greedy, log=log)
        else:
            if env is not None or tools is not None:
                raise UsageError(f"--{'env' if env is not None else 'tools'}: {run_dir} is a "
                                 "prompt run, not an agent run (it has no environment)")
            out = _evaluate_prompts(run_dir, cfg, temperature=temperature, seed=seed,
                                    greedy=greedy, log=log, reward_fn=reward_fn)
        atomic_write_text(os.path.join(run_dir, "eval.json"), json.dumps(out, indent=2) + "\n")
    return out


def _evaluate_prompts(run_dir: str, cfg, *, temperature, seed: int, greedy: bool, log,
                      reward_fn) -> dict:
    """``eval.json`` of a prompt run (:func:`evaluate_lm_run`)."""
    from ..inputs.reward_setup import check_reward_named_again

    ckpt, tensors, state = run_checkpoint(run_dir, log)
    check_reward_named_again(cfg, state.get("config"), reward_fn)
    rcfg = resolved_for_eval(cfg)
    holder = _EvalSetup(rcfg, run_dir, reward_fn)
    policy, reference, tok = eval_models(run_dir, rcfg, tensors, ckpt)
    temp = rcfg.temperature if temperature is None else temperature
    kw = {"max_new_tokens": holder.max_new_tokens, "seed": seed}
    out = {"run_dir": run_dir, "checkpoint": ckpt.name, "n_prompts": len(holder.prompts),
           "temperature": temp}
    pol = score_policy(policy, tok, holder.prompts, holder.reward_fn, temperature=temp, **kw)
    ref = score_policy(reference, tok, holder.prompts, holder.reward_fn, temperature=temp, **kw)
    per = {k: pol[k] for k in pol if k.startswith("reward/")}
    per.update({"reference_" + k: ref[k] for k in ref if k.startswith("reward/")})
    out.update(per)
    out.update({"score_mean": pol["score_mean"], "reference_score_mean": ref["score_mean"],
                "score_ci95": pol["score_ci95"], "reference_score_ci95": ref["score_ci95"],
                "response_length_mean": pol["response_length_mean"],
                "reference_response_length_mean": ref["response_length_mean"],
                "truncated_frac": pol["truncated_frac"],
                "reference_truncated_frac": ref["truncated_frac"]})
    if greedy:
        for key, model in (("greedy", policy), ("reference_greedy", reference)):
            res = score_policy(model, tok, holder.prompts, holder.reward_fn,
                               temperature=0.0, **kw)
            out[f"{key}_score_mean"] = res["score_mean"]
            out[f"{key}_score_ci95"] = res["score_ci95"]
    out["samples"] = [{"prompt": p, "completion": c} for p, c in pol["samples"]]
    return out


class _EvalSetup:
    """Held-out prompts, reward function and generation cap of a run's config."""

    def __init__(self, cfg, run_dir: str, reward_fn=None):
        from ..inputs.reward_setup import reward_set
        from ..inputs.task import make_task
        from ..training.runfiles import run_prompt_sets

        task = make_task(cfg.task, cfg.task_options) if cfg.prompts is None else None
        self.reward_fn = reward_set(cfg, reward_fn, task)
        self.prompts = run_prompt_sets(run_dir, cfg)[1][: cfg.n_eval_prompts]
        if not self.prompts:
            raise UsageError(f"eval: {run_dir!r} holds no held-out prompts (it was trained "
                             "with eval_fraction=0 and no eval prompts)")
        self.max_new_tokens = cfg.max_new_tokens or (task.max_new_tokens if task else 64)
