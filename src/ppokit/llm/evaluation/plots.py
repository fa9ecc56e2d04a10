"""``ppokit plot`` on language-model run directories: the figures people watch, per
iteration — the reward (the weighted total, and each reward function's mean for a single
run), the KL to the reference, the response length and the truncated share."""

from __future__ import annotations

import io
import math
from pathlib import Path

__all__ = ["PANELS", "is_llm_run", "panels_with_data", "plot_llm_runs"]


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


# each panel: its title and the metrics that can fill it, the first one a run logs (an
# agent run logs its episodes' truncated share, not the per-response one)
PANELS = (("reward (weighted total)", ("score_mean", "episode/return_mean")),
          ("KL to reference (nats)", ("kl_ref",)),
          ("response length (tokens)", ("response_length_mean", "episode/tokens_mean")),
          ("truncated share", ("truncated_frac", "episode/truncated_frac")))


def panels_with_data(runs: dict) -> list[tuple[str, str]]:
    """``(title, metric)`` of every panel of :data:`PANELS` that some run has points
    for, with the first of its metrics that one logs: a panel without data is not
    drawn."""
    out = []
    for label, keys in PANELS:
        key = next((k for k in keys for recs in runs.values() if _series(recs, k)[0]),
                   None)
        if key is not None:
            out.append((label, key))
    return out


def plot_llm_runs(run_dirs: list, out, title: str | None = None) -> Path:
    """One figure of up to four panels over the runs' ``metrics.jsonl`` (those with
    data, :func:`panels_with_data`); the image format follows ``out``'s suffix. Written
    atomically."""
    from ppokit.io.atomic import atomic_write_bytes
    from ppokit.io.metrics import read_metrics
    from ppokit.io.plots import figure_format

    fmt = figure_format(out)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {str(d): read_metrics(d) for d in run_dirs}
    panels = panels_with_data(runs) or [(PANELS[0][0], PANELS[0][1][0])]
    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + 1) // 2
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.5 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.remove()
    for ax, (label, key) in zip(axes.flat, panels):
        for name, recs in runs.items():
            ax.plot(*_series(recs, key), label=Path(name).name)
            if key == "score_mean" and len(runs) == 1:
                parts = sorted({k for r in recs for k in r
                                if k.startswith("reward/") and not k.endswith("_std")})
                if len(parts) > 1:
                    for k in parts:
                        ax.plot(*_series(recs, k), label=k, alpha=0.7)
        ax.set_title(f"{label} ({key})" if key.startswith("episode/") else label)
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
