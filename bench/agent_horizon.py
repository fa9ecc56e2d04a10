"""The horizon experiment: GRPO against PPO with a critic as episodes lengthen.

GRPO gives every token of an episode the episode's one advantage (its return against the
other episodes of its seed); PPO's critic and token-level GAE give each turn its own. On
the guessing game (``ppokit/GuessNumber-v0``) with ``n = 2^(T-1)`` numbers, bisection
needs up to ``T`` guesses: for each horizon ``T`` both presets train the built-in model
from the same warm start with the same sample budget (``--iterations`` ×
``--seeds-per-iter`` × ``--episodes-per-seed`` episodes), and the bench prints

* the held-out success rate and return before and after (``--eval`` episodes on seeds
  training never draws, the same for both presets);
* the relative variance of the policy-gradient estimate: each iteration the batch's
  episodes are split into four parts, the policy loss's gradient computed on each
  (no step taken), and ``mean ||g_k − ḡ||² / ||ḡ||²`` reported (median over the
  iterations; lower: the direction of an update is better determined);
* the learning curve's points (training success every ``--every`` iterations) in
  ``--out`` (JSON).

    python -m bench.agent_horizon --horizons 2,4,8 --iterations 150
    python -m bench.agent_horizon --from a.json b.json --figure curves.png   # re-plot
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import torch

from ppokit.engine import eager_minibatch_step


class _Recorder:
    """An optimiser that keeps the gradients and changes nothing."""

    def __init__(self, params):
        self.params, self.grad = params, None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        self.grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p))
                               .flatten() for p in self.params])


def gradient_variance(tr, roll, lab, parts: int = 4, seed: int = 0) -> float:
    """``mean_k ||g_k − ḡ||² / ||ḡ||²`` of the policy loss's gradient over ``parts``
    disjoint shares of the batch's sequences (module doc)."""
    batch = tr.labelled_batch(roll, lab)
    forward = tr.forward_adapter(roll)
    spec = replace(tr.update_spec(0.0), vf_coef=0.0, ent_coef=0.0, kl_coef=0.0,
                   kl_anchor="none", max_grad_norm=None, grad_accum=1)
    params = [p for p in tr.policy.parameters() if p.requires_grad]
    rec = _Recorder(params)
    n = batch.n_rows
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    grads = []
    for idx in order.chunk(parts):
        eager_minibatch_step(spec, forward, rec, params, batch.rows(idx))
        grads.append(rec.grad.clone())
    rec.zero_grad()
    g = torch.stack(grads)
    mean = g.mean(0)
    return float(((g - mean) ** 2).sum(1).mean() / mean.pow(2).sum().clamp(min=1e-30))


def run(horizon: int, algo: str, a) -> dict:
    import tempfile

    from ppokit.llm.training.config import LLMConfig
    from ppokit.llm.training.trainer import TokenTrainer

    n = 2 ** (horizon - 1)
    turns = horizon + 2
    cfg = LLMConfig(env="ppokit/GuessNumber-v0", algo=algo, iterations=a.iterations,
                    prompts_per_iter=a.seeds_per_iter, samples_per_prompt=a.episodes_per_seed,
                    max_turns=turns, env_kwargs=json.dumps({"n": n, "max_turns": turns}),
                    learning_rate=a.lr, sft_steps=a.sft_steps, time_limit=0,
                    n_eval_prompts=a.eval, seed=a.seed).resolved()
    variances, curve = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tr = TokenTrainer(cfg, tmp, log=lambda *x: None)
        tr.labels_observer = lambda roll, lab: variances.append(
            gradient_variance(tr, roll, lab, seed=len(variances)))
        before = tr.agent.evaluate(tr)
        t0 = time.perf_counter()
        for rec in tr.train(progress=False):
            if rec["iteration"] % a.every == 0:
                curve.append((rec["iteration"], rec["episode/solved_frac"]))
        seconds = time.perf_counter() - t0
        after = tr.agent.evaluate(tr)
        tr.close()
    key = ("eval/episode/solved_frac", "eval/episode/return_mean", "eval/episode/turns_mean")
    return {"horizon": horizon, "n": n, "algo": algo, "seconds": seconds,
            "before": {k.split("/")[-1]: before[k] for k in key},
            "after": {k.split("/")[-1]: after[k] for k in key},
            "grad_rel_variance": statistics.median(variances), "curve": curve}


def figure(rows: list[dict], path: str) -> None:
    """Training success per iteration, one panel per horizon, one line per preset."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    horizons = sorted({r["horizon"] for r in rows})
    fig, axes = plt.subplots(1, len(horizons), figsize=(3.2 * len(horizons), 2.8),
                             squeeze=False)
    for ax, h in zip(axes[0], horizons):
        for r in (r for r in rows if r["horizon"] == h):
            its, solved = zip(*r["curve"]) if r["curve"] else ((), ())
            ax.plot(its, solved, label=r["algo"].upper())
        ax.set_title(f"T = {h} (n = {2 ** (h - 1)})")
        ax.set_xlabel("iteration")
        ax.set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel("episodes solved (training)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--horizons", default="2,4,8")
    p.add_argument("--algos", default="grpo,ppo")
    p.add_argument("--iterations", type=int, default=150)
    p.add_argument("--seeds-per-iter", type=int, default=8)
    p.add_argument("--episodes-per-seed", type=int, default=8)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--eval", type=int, default=256)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="horizon.json")
    p.add_argument("--figure", default=None, help="also plot the learning curves here")
    p.add_argument("--from", dest="inputs", nargs="+", default=None,
                   help="plot the rows of earlier runs' JSON files instead of training")
    a = p.parse_args()
    if a.inputs:
        rows = [r for path in a.inputs for r in json.load(open(path))]
        figure(rows, a.figure or "horizon.png")
        return
    torch.set_num_threads(1)
    rows = []
    print("| horizon T (n) | preset | held-out solved before → after | return before → after "
          "| turns after | grad. rel. variance (median) | s |")
    print("|---|---|---|---|---|---|---|")
    for horizon in (int(x) for x in a.horizons.split(",")):
        for algo in a.algos.split(","):
            r = run(horizon, algo, a)
            rows.append(r)
            b, f = r["before"], r["after"]
            print(f"| {horizon} ({r['n']}) | {algo} | {b['solved_frac']:.3f} → "
                  f"{f['solved_frac']:.3f} | {b['return_mean']:.3f} → {f['return_mean']:.3f} "
                  f"| {f['turns_mean']:.2f} | {r['grad_rel_variance']:.3f} | "
                  f"{r['seconds']:.0f} |", flush=True)
    with open(a.out, "w") as fh:
        json.dump(rows, fh, indent=1)
    if a.figure:
        figure(rows, a.figure)


if __name__ == "__main__":
    main()
