"""Learning-curve figures from ``metrics.jsonl`` (matplotlib, Agg backend)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .metrics import read_metrics

__all__ = ["curve", "plot_learning_curve", "plot_runs"]


def curve(run_dir: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """``(global_step, episode_return_mean)`` of the iterations that finished episodes."""
    recs = [r for r in read_metrics(run_dir) if r.get("episode_return_mean") is not None]
    x = np.array([r["global_step"] for r in recs], dtype=np.float64)
    y = np.array([r["episode_return_mean"] for r in recs], dtype=np.float64)
    return x, y


def _label(run_dir: Path) -> str:
    try:
        cfg = json.loads((run_dir / "config.json").read_text())
        return f"{cfg['algo']} {cfg['env_id']}"
    except (OSError, ValueError, KeyError):
        return run_dir.name


def _smooth(y: np.ndarray, k: int = 5) -> np.ndarray:
    if len(y) < k:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    out = np.empty_like(y)
    out[k - 1:] = (c[k:] - c[:-k]) / k
    out[: k - 1] = [y[: i + 1].mean() for i in range(k - 1)]
    return out


def plot_runs(run_dirs: list[str | Path], out: str | Path, title: str | None = None) -> Path:
    """Overlay runs; runs with the same algorithm and env are one curve: the mean over
    seeds (interpolated on a common step grid) with the min–max spread shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for d in run_dirs:
        d = Path(d)
        x, y = curve(d)
        if len(x):
            groups.setdefault(_label(d), []).append((x, _smooth(y)))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, runs in groups.items():
        if len(runs) == 1:
            ax.plot(runs[0][0], runs[0][1], label=label)
            continue
        lo = max(r[0][0] for r in runs)
        hi = min(r[0][-1] for r in runs)
        grid = np.linspace(lo, hi, 200) if hi > lo else np.array([lo])
        ys = np.stack([np.interp(grid, x, y) for x, y in runs])
        ax.plot(grid, ys.mean(0), label=f"{label} (mean of {len(runs)})")
        ax.fill_between(grid, ys.min(0), ys.max(0), alpha=0.25)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episode return (mean per iteration, smoothed)")
    if title:
        ax.set_title(title)
    if groups:
        ax.legend(loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_learning_curve(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    return plot_runs([run_dir], run_dir / "learning_curve.png", title=run_dir.name)
