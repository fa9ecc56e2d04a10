"""The reward-hacking demonstration (docs/theory.md#three-quantities, on the built-in task).

1. Warm start: the built-in tiny model after SFT on noisy demonstrations (the reference).
2. A Bradley–Terry reward model trained on preferences from a *length-biased labeller*:
   each pair holds two noisy answers, one with 1–4 extra digits appended; with probability
   ``prefer_longer`` the labeller prefers the longer answer whatever its correctness,
   otherwise the more correct one. The RM learns that length pays.
3. PPO against that RM twice from the same start: ``β = 0`` (no anchor) and ``β > 0``
   (per-token k1 KL reward to the reference). The true task score (the rule) is logged
   next to the RM reward, the response length and ``kl_ref``.

Without the anchor, response length and RM reward climb while the true score falls; with
it, the drift from the reference is bounded. Each run is an ordinary run directory, so
``ppokit report`` can read it.
"""

from __future__ import annotations

import json
import os
import time

__all__ = ["run_reward_hacking_demo"]


def run_reward_hacking_demo(out_dir: str = "runs/demo-reward-hacking", *, iterations: int = 100,
                            beta: float = 0.5, prefer_longer: float = 0.8, n_pairs: int = 3000,
                            max_new_tokens: int = 16, seed: int = 0, log=print,
                            plot: bool = True, progress: bool = False,
                            sft_steps: int = 150) -> dict:
    """Run the demo; returns a summary dict and writes ``out_dir/summary.json`` and
    ``out_dir/reward_hacking.png``. Run directories: ``out_dir/beta0`` and
    ``out_dir/beta<β>``. In the summary, ``start`` is the first iteration and ``end`` the
    mean of the last tenth of the iterations."""
    import torch

    from ..inputs.task import reverse_score
    from ..modeling.models import quiet_transformers
    from ..training.trainer import LLMConfig, TokenTrainer

    quiet_transformers()
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.perf_counter()
    warm_dir = _warm_start(out_dir, seed, sft_steps, log)
    rm_dir, rm_info = _reward_model(out_dir, n_pairs, prefer_longer, seed, log)

    def true_score(prompts, completions):
        s = reverse_score(prompts, completions)
        return {"true_score_mean": sum(s) / len(s)}

    runs = {}
    for b in (0.0, beta):
        name = "beta0" if b == 0 else f"beta{b:g}"
        log(f"3/3 PPO against the reward model, beta = {b:g} ({iterations} iterations)")
        # warm_dir holds the built-in model, so its defaults are spelled out: the reverse
        # task, full fine-tuning, no divergence guard, temperature 1 (a model path
        # otherwise means a pretrained chat checkpoint)
        cfg = LLMConfig(algo="ppo", model=warm_dir, reward_model=rm_dir, iterations=iterations,
                        task="reverse", lora_r=0, guard_kl=0.0, temperature=1.0,
                        kl_coef=b, kl_mode="reward" if b > 0 else "none",
                        max_new_tokens=max_new_tokens, truncation="penalty",
                        truncation_penalty=0.0, seed=seed, learning_rate=5e-4,
                        checkpoint_every=10**9)
        torch.manual_seed(seed)
        tr = TokenTrainer(cfg, os.path.join(out_dir, name), log=log, monitors=[true_score])
        recs = tr.train(progress=progress)
        runs[name] = recs
    summary = {"rm": rm_info, "seconds": time.perf_counter() - t0,
               "runs": {name: _start_end(recs) for name, recs in runs.items()}}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    log(f"{'run':<10}{'RM reward':>20}{'true score':>20}{'length':>18}{'kl_ref':>18}")
    for name, s in summary["runs"].items():
        cells = "".join(f"{s[k]['start']:>9.3f} → {s[k]['end']:<8.3f}" for k in
                        ("score_mean", "true_score_mean", "response_length_mean", "kl_ref"))
        log(f"{name:<10}{cells}")
    if plot:
        summary["figure"] = _plot(runs, os.path.join(out_dir, "reward_hacking.png"))
        log(f"figure: {summary['figure']}")
    return summary


def _warm_start(out_dir: str, seed: int, sft_steps: int, log) -> str:
    """Step 1: the built-in model fine-tuned on noisy demonstrations; its directory."""
    from ..inputs.task import ReverseTask
    from ..modeling.models import build_char_tokenizer, build_tiny_model, save_policy
    from ..training.sft import builtin_sft

    tok = build_char_tokenizer()
    warm = build_tiny_model(tok, seed=seed)
    log("1/3 warm start: SFT on noisy demonstrations")
    builtin_sft(ReverseTask(), warm, tok, steps=sft_steps, seed=seed)
    warm_dir = os.path.join(out_dir, "warm_start")
    save_policy(warm, tok, warm_dir)
    return warm_dir


def _reward_model(out_dir: str, n_pairs: int, prefer_longer: float, seed: int,
                  log) -> tuple[str, dict]:
    """Step 2: a reward model trained on pairs from a labeller who prefers longer answers;
    its directory and training summary."""
    from ..inputs.prefs import builtin_pairs, split_pairs
    from ..training.rm import build_reward_model, save_reward_model, train_reward_model

    log(f"2/3 reward model on {n_pairs} pairs from a labeller preferring the longer answer "
        f"{prefer_longer:.0%} of the time")
    train_p, eval_p = split_pairs(builtin_pairs(n_pairs, seed=seed, prefer_longer=prefer_longer),
                                  0.1, seed)
    rm, rm_tok = build_reward_model(None, seed=seed)
    rm_info = train_reward_model(rm, rm_tok, train_p, eval_p, epochs=2, seed=seed)
    rm_dir = os.path.join(out_dir, "reward_model")
    save_reward_model(rm, rm_tok, rm_dir, rm_info)
    log(f"   held-out pair accuracy {rm_info['eval_accuracy']:.3f}")
    return rm_dir, rm_info


def _start_end(recs: list[dict]) -> dict:
    """Each figure of a run at its start (the first iteration) and end (the mean of the
    last tenth of the iterations)."""
    k = max(1, len(recs) // 10)

    def avg(rs, key):
        return sum(r[key] for r in rs) / len(rs)

    return {key: {"start": avg(recs[:1], key), "end": avg(recs[-k:], key)}
            for key in ("score_mean", "true_score_mean", "response_length_mean", "kl_ref")}


def _plot(runs: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("score_mean", "reward-model score"), ("true_score_mean", "true task score"),
            ("response_length_mean", "response length (tokens)"), ("kl_ref", "KL to reference")]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, (key, title) in zip(axes, keys):
        for name, recs in runs.items():
            ax.plot([r["iteration"] for r in recs], [r[key] for r in recs], label=name)
        ax.set_title(title)
        ax.set_xlabel("iteration")
    axes[0].legend()
    fig.suptitle("PPO against a length-biased reward model: with and without the KL anchor")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
