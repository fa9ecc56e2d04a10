"""Learning-curve figures from ``metrics.jsonl`` (matplotlib, Agg backend).

A figure is rendered in memory and written with :func:`ppokit.io.atomic.atomic_write_bytes`:
readers see the old file or the new one, and a symbolic link at the output path is
replaced, never written through. Metrics rows without a finite ``global_step`` and
``episode_return_mean`` (iterations that finished no episode, or rows from another tool)
are left out.
"""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path

import numpy as np

from .atomic import atomic_write_bytes
from .metrics import read_metrics

__all__ = ["curve", "figure_format", "plot_learning_curve", "plot_runs"]


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def curve(run_dir: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """``(global_step, episode_return_mean)`` of the iterations that finished episodes,
    in step order; rows lacking either as a finite number are left out."""
    pts = []
    for r in read_metrics(run_dir):
        x, y = _number(r.get("global_step")), _number(r.get("episode_return_mean"))
        if x is not None and y is not None:
            pts.append((x, y))
    pts.sort(key=lambda p: p[0])
    x = np.array([p[0] for p in pts], dtype=np.float64)
    y = np.array([p[1] for p in pts], dtype=np.float64)
    return x, y


def _label(run_dir: Path) -> str:
    """``ALGO ENV`` from the run's config.json (with ``(centralised critic)`` for such a
    run, so that it is not averaged with the same env's other runs), else the directory's
    name."""
    path = run_dir / "config.json"
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > 2**20:
            return run_dir.name
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return run_dir.name
    if not isinstance(cfg, dict):
        return run_dir.name
    algo, env = cfg.get("algo"), cfg.get("env_id")
    if not (isinstance(algo, str) and isinstance(env, str)):
        return run_dir.name
    tail = " (centralised critic)" if cfg.get("centralised_critic") is True else ""
    return f"{algo} {env}"[:80] + tail


def _smooth(y: np.ndarray, k: int = 5) -> np.ndarray:
    if len(y) < k:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    out = np.empty_like(y)
    out[k - 1:] = (c[k:] - c[:-k]) / k
    out[: k - 1] = [y[: i + 1].mean() for i in range(k - 1)]
    return out


def plot_runs(run_dirs: list[str | Path], out: str | Path, title: str | None = None,
              notes: list[str] | None = None) -> Path:
    """Overlay runs; runs with the same algorithm and env are one curve: the mean over
    seeds (interpolated on the step range all of them cover) with the min–max spread
    shaded. Runs of one group that end at different steps are not cut silently: the mean's
    label says where it stops, each run's part beyond it is drawn on its own, and a line is
    appended to ``notes``. The image format follows ``out``'s suffix (PNG without one)."""
    fmt = figure_format(out)
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
    if not groups:
        ax.text(0.5, 0.5, "no finished episodes to plot yet", ha="center", va="center",
                transform=ax.transAxes)
    for label, runs in groups.items():
        if len(runs) == 1:
            ax.plot(runs[0][0], runs[0][1], label=label)
            continue
        lo = max(r[0][0] for r in runs)
        hi = min(r[0][-1] for r in runs)
        longest = max(r[0][-1] for r in runs)
        grid = np.linspace(lo, hi, 200) if hi > lo else np.array([lo])
        ys = np.stack([np.interp(grid, x, y) for x, y in runs])
        text = f"{label} (mean of {len(runs)})"
        if longest > hi:
            text = f"{label} (mean of {len(runs)} up to step {hi:,.0f})"
            if notes is not None:
                ends = sorted({f"{r[0][-1]:,.0f}" for r in runs})
                notes.append(f"{label}: runs end at different steps ({', '.join(ends)}); "
                             f"the mean covers steps up to {hi:,.0f}, beyond that each "
                             "longer run is drawn on its own (thin lines)")
        line, = ax.plot(grid, ys.mean(0), label=text)
        ax.fill_between(grid, ys.min(0), ys.max(0), alpha=0.25, color=line.get_color())
        for x, y in runs:
            beyond = x >= hi
            if x[-1] > hi and beyond.sum() > 0:
                ax.plot(x[beyond], y[beyond], lw=0.8, alpha=0.7, color=line.get_color())
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episode return (mean per iteration, smoothed)")
    if title:
        ax.set_title(title)
    if groups:
        ax.legend(loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=fmt, dpi=100)
    finally:
        plt.close(fig)
    atomic_write_bytes(out, buf.getvalue())
    return out


def figure_format(out: str | Path) -> str:
    """The image format named by ``out``'s suffix (``png`` when it has none); a
    ValueError for one matplotlib cannot write."""
    fmt = Path(out).suffix.lower().lstrip(".") or "png"
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backend_bases import FigureCanvasBase

    known = FigureCanvasBase.get_supported_filetypes()
    if fmt not in known:
        raise ValueError(f"{os.fspath(out)!r}: unknown image format {fmt!r} (known: "
                         f"{', '.join(sorted(known))})")
    return fmt


def plot_learning_curve(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    return plot_runs([run_dir], run_dir / "learning_curve.png", title=run_dir.name)
