"""Held-out evaluation: score the trained policy and the reference (warm-start) policy on
the same prompts with the same sampling settings and seed."""

from __future__ import annotations

import json
import os

import torch

from ppokit.errors import UsageError

from .checkpoint import atomic_write_text, latest_checkpoint
from .rollout import encode_prompts, generate

__all__ = ["score_policy", "evaluate_run"]


@torch.no_grad()
def score_policy(model, tokenizer, prompts: list[str], reward_fn, *, max_new_tokens: int,
                 temperature: float = 1.0, seed: int = 0, batch_size: int = 128) -> dict:
    """Mean score, mean response length and truncated share of one policy on ``prompts``."""
    from .rewards import check_scores

    gen = torch.Generator().manual_seed(seed)
    scores, lengths, trunc, samples = [], [], [], []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        ids, mask = encode_prompts(tokenizer, chunk)
        roll = generate(model, ids, mask, max_new_tokens=max_new_tokens,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                        temperature=temperature, generator=gen)
        comps = [tokenizer.decode(r, skip_special_tokens=True) for r in roll.response_ids]
        scores += check_scores(reward_fn(chunk, comps), len(chunk)).tolist()
        lengths += roll.lengths.tolist()
        trunc += roll.truncated.tolist()
        samples += list(zip(chunk, comps))
    n = len(scores)
    return {"score_mean": sum(scores) / n, "response_length_mean": sum(lengths) / n,
            "truncated_frac": sum(trunc) / n, "samples": samples[:8], "n": n}


def evaluate_run(run_dir: str, *, n_prompts: int | None = None, temperature: float | None = None,
                 seed: int = 1234, greedy: bool = True, log=print) -> dict:
    """Score ``RUN_DIR``'s trained policy and its reference on the held-out prompts; write
    ``RUN_DIR/eval.json`` and return it."""
    from .models import load_policy
    from .trainer import config_from_run

    cfg = config_from_run(run_dir)
    if n_prompts is not None:
        from dataclasses import replace

        cfg = replace(cfg, n_eval_prompts=n_prompts)
    pol_dir = os.path.join(run_dir, "policy")
    if not os.path.isdir(pol_dir):
        ck = latest_checkpoint(run_dir)
        if ck is None:
            raise UsageError(f"eval: {run_dir!r} has no trained policy and no checkpoint")
        pol_dir = os.path.join(ck, "policy")
    ref_dir = os.path.join(run_dir, "reference")
    if not os.path.isdir(ref_dir):
        raise UsageError(f"eval: {run_dir!r} has no reference/ directory")
    policy, tok = load_policy(pol_dir)
    reference, _ = load_policy(ref_dir)
    rcfg = cfg.resolved()
    holder = _EvalSetup(rcfg)
    temp = rcfg.temperature if temperature is None else temperature
    kw = {"max_new_tokens": holder.max_new_tokens, "seed": seed}
    out = {"run_dir": run_dir, "n_prompts": len(holder.prompts), "temperature": temp}
    pol = score_policy(policy, tok, holder.prompts, holder.reward_fn, temperature=temp, **kw)
    ref = score_policy(reference, tok, holder.prompts, holder.reward_fn, temperature=temp, **kw)
    out.update({"score_mean": pol["score_mean"], "reference_score_mean": ref["score_mean"],
                "response_length_mean": pol["response_length_mean"],
                "reference_response_length_mean": ref["response_length_mean"],
                "truncated_frac": pol["truncated_frac"],
                "reference_truncated_frac": ref["truncated_frac"]})
    if greedy:
        out["greedy_score_mean"] = score_policy(policy, tok, holder.prompts, holder.reward_fn,
                                                temperature=0.0, **kw)["score_mean"]
        out["reference_greedy_score_mean"] = score_policy(
            reference, tok, holder.prompts, holder.reward_fn, temperature=0.0, **kw)["score_mean"]
    out["samples"] = [{"prompt": p, "completion": c} for p, c in pol["samples"]]
    atomic_write_text(os.path.join(run_dir, "eval.json"), json.dumps(out, indent=2) + "\n")
    return out


class _EvalSetup:
    """Held-out prompts, reward function and generation cap of a run's config."""

    def __init__(self, cfg):
        from .rewards import RewardModelScorer, load_reward_callable
        from .task import ReverseTask, reverse_score
        from .trainer import prompt_sets

        task = ReverseTask() if cfg.prompts is None else None
        if cfg.reward_model:
            self.reward_fn = RewardModelScorer(cfg.reward_model)
        elif cfg.reward:
            self.reward_fn = load_reward_callable(cfg.reward)
        else:
            self.reward_fn = reverse_score
        self.prompts = prompt_sets(cfg)[1]
        self.max_new_tokens = cfg.max_new_tokens or (task.max_new_tokens if task else 64)
