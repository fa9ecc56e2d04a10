"""``ppokit plot`` on language-model run directories: the figures people watch, per
iteration — the reward (the weighted total, and each reward function's mean for a single
run), the KL to the reference, the response length and the truncated share."""

from __future__ import annotations

import io
import math
from pathlib import Path

__all__ = ["is_llm_run", "plot_llm_runs"]


def is_llm_run(run_dir) -> bool:
    """A language-model run directory keeps its frozen starting policy in ``reference/``."""
    return (Path(run_dir) / "reference").is_dir()


def _series(recs: list[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in recs:
        x, y = r.get("iteration"), r.get(key)
        if (isinstance(x, (int, float)) and isinstance(y, (int, float))
                and not isinstance(y, bool) and math.isfinite(y)):
            xs.append(float(x))
            ys.append(float(y))
    return xs, ys


def plot_llm_runs(run_dirs: list, out, title: str | None = None) -> Path:
    """One figure of four panels over the runs' ``metrics.jsonl``; the image format
    follows ``out``'s suffix. Written atomically."""
    from ppokit.io.atomic import atomic_write_bytes
    from ppokit.io.metrics import read_metrics
    from ppokit.io.plots import figure_format

    fmt = figure_format(out)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {str(d): read_metrics(d) for d in run_dirs}
    panels = [("score_mean", "reward (weighted total)"), ("kl_ref", "KL to reference (nats)"),
              ("response_length_mean", "response length (tokens)"),
              ("truncated_frac", "truncated share")]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (key, label) in zip(axes.flat, panels):
        for name, recs in runs.items():
            ax.plot(*_series(recs, key), label=Path(name).name)
            if key == "score_mean" and len(runs) == 1:
                parts = sorted({k for r in recs for k in r
                                if k.startswith("reward/") and not k.endswith("_std")})
                if len(parts) > 1:
                    for k in parts:
                        ax.plot(*_series(recs, k), label=k, alpha=0.7)
        ax.set_title(label)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(loc="best", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=fmt, dpi=100)
    finally:
        plt.close(fig)
    out = Path(out)
    atomic_write_bytes(out, buf.getvalue())
    return out
