"""One policy's score on held-out prompts (:func:`score_policy`): what the token trainer
logs as ``eval/...`` while it trains, and what ``ppokit llm eval``
(:mod:`ppokit.llm.evaluation.evaluate`, which imports it from here) compares between the
trained and the reference policy."""

from __future__ import annotations

import torch

from ..modeling.rollout import encode_prompts, generate

__all__ = ["score_policy", "evaluate_heldout"]


@torch.no_grad()
def score_policy(model, tokenizer, prompts: list, reward_fn, *, max_new_tokens: int,
                 temperature: float = 1.0, seed: int = 0, batch_size: int = 128,
                 per_sample: bool = False) -> dict:
    """Mean score (and each reward function's mean, ``reward/NAME``), mean response
    length and truncated share of one policy on ``prompts`` (prompt rows, or plain
    strings); ``reward_fn``: a :class:`ppokit.llm.inputs.rewards.RewardSet`, a reward function or
    a list of them. ``per_sample``: also ``scores``, ``truncated`` (one per prompt, in
    order) and ``per_function`` (``{name: [n]}``, NaN where a function returned None)."""
    from ..inputs.data import render_prompt
    from ..inputs.reward_setup import reward_arguments
    from ..inputs.rewards import RewardSet, per_function_stats

    rewards = reward_fn if isinstance(reward_fn, RewardSet) else RewardSet(
        list(reward_fn) if isinstance(reward_fn, (list, tuple)) else [reward_fn])
    rows = [{"prompt": p} if isinstance(p, str) else p for p in prompts]
    gen = torch.Generator().manual_seed(seed)
    scores, lengths, trunc, samples, per_all = [], [], [], [], {}
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        texts = [render_prompt(tokenizer, r["prompt"]) for r in chunk]
        ids, mask = encode_prompts(tokenizer, texts)
        roll = generate(model, ids, mask, max_new_tokens=max_new_tokens,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                        temperature=temperature, generator=gen)
        decoded = [tokenizer.decode(r, skip_special_tokens=True) for r in roll.response_ids]
        _, kwargs = reward_arguments(chunk, decoded, roll.response_ids)
        total, per = rewards(kwargs.pop("prompts"), kwargs.pop("completions"),
                             kwargs.pop("completion_ids"), kwargs)
        scores += total.tolist()
        for k, v in per.items():
            per_all.setdefault(k, []).append(v)
        lengths += roll.lengths.tolist()
        trunc += roll.truncated.tolist()
        samples += list(zip(texts, decoded))
    n = len(scores)
    per_all = {k: torch.cat(v) for k, v in per_all.items()}
    stats = per_function_stats(per_all)
    from ppokit.core.stats import mean_interval

    out = {"score_mean": sum(scores) / n, "score_ci95": list(mean_interval(scores)),
           "response_length_mean": sum(lengths) / n,
           "truncated_frac": sum(trunc) / n, "samples": samples[:8], "n": n,
           **{k: v for k, v in stats.items() if not k.endswith("_std")}}
    if per_sample:
        out.update(scores=scores, truncated=[bool(t) for t in trunc],
                   per_function={k: v.tolist() for k, v in per_all.items()})
    return out


def evaluate_heldout(tr) -> dict:
    """``eval/...``: the trainer ``tr``'s policy's mean score (and each reward function's,
    length, truncated share) on ``n_eval_prompts`` held-out rows, sampled at the training
    temperature with a generator of its own (the same seed each time, so the series
    compares policies, and the run's own random streams are untouched)."""
    if tr.agent is not None:
        return tr.agent.evaluate(tr)
    rows = (tr.eval_rows or [])[: tr.cfg.n_eval_prompts]
    if not rows:
        return {}
    with tr.autocast():
        out = score_policy(tr.policy, tr.tok, rows, tr.rewards,
                           max_new_tokens=tr.max_new_tokens,
                           temperature=tr.cfg.temperature, seed=tr.cfg.seed + 7919)
    return {f"eval/{k}": float(v) for k, v in out.items() if isinstance(v, float)}
