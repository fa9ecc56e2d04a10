"""``ppokit llm compare``: several algorithm presets trained on one task with one budget,
over several seeds, and what a reader needs to choose between them — the held-out score
before and after, its curve over the iterations, and what each run cost.

Every run is an ordinary run directory, ``OUT/ALGO-sSEED``, trained with the same
configuration but for ``algo`` and ``seed``, the held-out score measured every
``eval_every`` iterations on the same held-out prompts with the same sampling seed
(:meth:`TokenTrainer.evaluate_heldout`; iteration 0 is the starting policy), then
evaluated at the end as ``ppokit llm eval`` does (``eval.json``). A run that already holds
its ``eval.json`` is read, not trained again, and one that was stopped (Ctrl-C or SIGTERM
checkpoints it; or a crash after its last checkpoint) goes on from its newest checkpoint:
the same command continues an interrupted comparison where it stopped. ``OUT/compare.md``
holds the table, ``OUT/compare.json`` every figure and ``OUT/compare.png`` the curves (mean
over the seeds, and each seed's).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ppokit.errors import UsageError
from ppokit.io.atomic import atomic_write_text

__all__ = ["parse_seeds", "compare", "summarise", "table"]

CURVE_KEY = "eval/score_mean"


def parse_seeds(text: str) -> list[int]:
    """``"0-2"`` → [0, 1, 2]; ``"0,3,5"`` → [0, 3, 5]; ``"1"`` → [1]."""
    out: list[int] = []
    try:
        for part in str(text).split(","):
            part = part.strip()
            if "-" in part[1:]:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError
                out.extend(range(lo, hi + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        out = []
    if not out or any(s < 0 for s in out) or len(set(out)) != len(out):
        raise UsageError(f"--seeds: expected distinct seeds >= 0 as a range or a list "
                         f"(0-2, or 0,3,5), got {text!r}")
    return out


def _run(algo: str, seed: int, base: dict, run_dir: str, log, stop=None) -> dict:
    """Train one run to its end and evaluate it; read a finished one back; continue one
    that was stopped (a signal, a crash) from its newest checkpoint. ``stop``: a
    :class:`ppokit.io.GracefulStop` (a signal checkpoints the run and ends the comparison:
    :class:`ppokit.io.Interrupted`)."""
    from ppokit.io import find_checkpoint

    from ..training.config_values import config_from_values
    from ..training.runfiles import config_from_run
    from ..training.trainer import TokenTrainer
    from .evaluate import evaluate_lm_run

    done = os.path.join(run_dir, "eval.json")
    curve_file = os.path.join(run_dir, "compare_curve.json")
    start_file = os.path.join(run_dir, "compare_start.json")
    if os.path.isfile(done) and os.path.isfile(curve_file):
        log(f"{algo} seed {seed}: finished earlier ({run_dir}), read back")
        return {**_read_json(curve_file), "eval": _read_json(done)}
    if os.path.exists(run_dir):
        ckpt = find_checkpoint(os.path.join(run_dir, "checkpoints"), log=lambda m: None)[0] \
            if os.path.isdir(os.path.join(run_dir, "checkpoints")) else None
        if ckpt is None or not os.path.isfile(start_file):
            raise UsageError(f"{run_dir}: a run directory without a comparison run to "
                             f"continue (no checkpoint, or not started by ppokit llm "
                             f"compare); remove it or choose another --out")
        cfg = config_from_run(run_dir, reward=base.get("reward"))
        if cfg.algo != algo or cfg.seed != seed:
            raise UsageError(f"{run_dir}: holds {cfg.algo} seed {cfg.seed}, not {algo} seed "
                             f"{seed}; remove it or choose another --out")
        start = _read_json(start_file)["start"]
        tr = TokenTrainer(cfg, run_dir, resume=True, log=lambda m: None)
        log(f"{algo} seed {seed}: continued from iteration {tr.iteration}")
    else:
        cfg = config_from_values(("compare", {**base, "algo": algo, "seed": seed}))
        tr = TokenTrainer(cfg, run_dir, log=lambda m: None)
        start = tr.evaluate_heldout().get(CURVE_KEY)
        atomic_write_text(start_file, json.dumps({"start": start}))
    cfg = tr.cfg  # resolved
    try:
        tr.train(progress=False, stop=stop)
        wall = tr.elapsed
    finally:
        tr.close()
    recs = _metrics(run_dir)  # every iteration, those before a stop included
    curve = [[0, start]] + [[r["iteration"], r[CURVE_KEY]] for r in recs if CURVE_KEY in r]
    kept = {"algo": algo, "seed": seed, "iterations": len(recs), "wall_s": wall,
            "curve": curve,
            "completions": sum(r.get("dynamic_generated", cfg.prompts_per_iter
                                     * cfg.samples_per_prompt) for r in recs),
            "response_tokens": sum(r["response_tokens"] for r in recs)}
    ev = evaluate_lm_run(run_dir, reward=cfg.reward, log=lambda m: None)
    atomic_write_text(curve_file, json.dumps(kept))
    log(f"{algo} seed {seed}: held-out {ev['reference_score_mean']:.3f} -> "
        f"{ev['score_mean']:.3f} in {len(recs)} iterations, {wall:.0f} s")
    return {**kept, "eval": ev}


def _read_json(path: str) -> dict:
    """A JSON file of a run directory, read as data (a regular file, no link followed)."""
    from ppokit.io.atomic import read_regular

    try:
        return json.loads(read_regular(path).decode())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable comparison file ({exc}); remove the run "
                         "directory to train it again") from None


def _metrics(run_dir: str) -> list[dict]:
    """The run's ``metrics.jsonl`` records, in order (read as data)."""
    from ppokit.io.atomic import read_regular

    text = read_regular(os.path.join(run_dir, "metrics.jsonl"), max_size=1 << 30)
    return [json.loads(x) for x in text.decode().splitlines() if x.strip()]


def compare(algos: list[str], seeds: list[int], base: dict, out_dir: str, *,
            log=print, stop=None) -> dict:
    """Train every ``algo`` × ``seed`` with the configuration ``base`` (any
    :class:`LLMConfig` keys but ``algo`` and ``seed``; ``eval_every`` is required) under
    ``out_dir``; write the table, the figures and the plot; return the summary."""
    from ..training.config import ALGOS

    bad = [a for a in algos if a not in ALGOS]
    if bad or not algos:
        raise UsageError(f"--algos: expected presets among {', '.join(ALGOS)}, got "
                         f"{','.join(algos) or 'none'}")
    if not base.get("eval_every"):
        raise UsageError("--eval-every: the comparison's curves need a held-out score every "
                         "N iterations (N >= 1)")
    from ..training.config_values import config_from_values

    for a in algos:  # every run's configuration checked before the first one trains
        config_from_values(("compare", {**base, "algo": a, "seed": seeds[0]})).resolved()
    os.makedirs(out_dir, exist_ok=True)
    runs = [_run(a, s, base, os.path.join(out_dir, f"{a}-s{s}"), log, stop)
            for a in algos for s in seeds]
    summary = summarise(runs, algos)
    summary["config"] = {k: v for k, v in base.items() if not callable(v)}
    atomic_write_text(os.path.join(out_dir, "compare.json"),
                      json.dumps({"summary": summary, "runs": runs}, indent=1, default=str))
    atomic_write_text(os.path.join(out_dir, "compare.md"), table(summary) + "\n")
    _plot(runs, algos, os.path.join(out_dir, "compare.png"))
    return summary


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def summarise(runs: list[dict], algos: list[str]) -> dict:
    """Per algorithm, means over the seeds: the held-out score (sampled) of the reference
    and of the trained policy, the gain (with its standard deviation over the seeds and
    each seed's), the greedy scores, and the cost."""
    rows = []
    for a in algos:
        rs = [r for r in runs if r["algo"] == a]
        ev = [r["eval"] for r in rs]
        gains = [e["score_mean"] - e["reference_score_mean"] for e in ev]
        sd = (math.sqrt(sum((x - _mean(gains)) ** 2 for x in gains) / (len(gains) - 1))
              if len(gains) > 1 else 0.0)
        rows.append({"algo": a, "seeds": [r["seed"] for r in rs],
                     "reference": _mean([e["reference_score_mean"] for e in ev]),
                     "score": _mean([e["score_mean"] for e in ev]),
                     "score_per_seed": [e["score_mean"] for e in ev],
                     "gain": _mean(gains), "gain_sd": sd, "gain_per_seed": gains,
                     "greedy_reference": _mean([e.get("reference_greedy_score_mean", math.nan)
                                                for e in ev]),
                     "greedy": _mean([e.get("greedy_score_mean", math.nan) for e in ev]),
                     "iterations": _mean([r["iterations"] for r in rs]),
                     "completions": _mean([r["completions"] for r in rs]),
                     "wall_s": _mean([r["wall_s"] for r in rs]),
                     "n_prompts": ev[0]["n_prompts"]})
    return {"rows": rows}


def table(summary: dict) -> str:
    """The summary as a Markdown table (means over the seeds)."""
    lines = ["| algo | held-out before | after | gain (± sd over seeds) | each seed's gain | "
             "greedy before → after | iterations | completions generated | train s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        seeds = ", ".join(f"{x:+.3f}" for x in r["gain_per_seed"])
        lines.append(f"| {r['algo']} | {r['reference']:.3f} | {r['score']:.3f} | "
                     f"{r['gain']:+.3f} ± {r['gain_sd']:.3f} | {seeds} | "
                     f"{r['greedy_reference']:.3f} → {r['greedy']:.3f} | "
                     f"{r['iterations']:.0f} | {r['completions']:.0f} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def _plot(runs: list[dict], algos: list[str], path: str) -> None:
    """Held-out score against iterations: each seed thin, the mean over seeds thick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, a in enumerate(algos):
        color = f"C{i}"
        rs = [r for r in runs if r["algo"] == a]
        for r in rs:
            xs, ys = zip(*[(x, y) for x, y in r["curve"] if y is not None])
            ax.plot(xs, ys, color=color, alpha=0.25, lw=1)
        its = sorted({x for r in rs for x, y in r["curve"] if y is not None})
        mean = [_mean([y for r in rs for x, y in r["curve"] if x == it and y is not None])
                for it in its]
        ax.plot(its, mean, color=color, lw=2.2, label=f"{a} (mean of {len(rs)})")
    ax.set_xlabel("iteration")
    ax.set_ylabel("held-out score (sampled)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
