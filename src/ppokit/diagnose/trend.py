"""Robust summaries of a metric's course over a run: thirds, medians, rank trends.

Findings are never based on one iteration: a rule looks at medians over a window (a third of
the run, or the whole non-annealed part) and at rank correlation with time, which a single
spike cannot move much.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ranks", "spearman", "thirds", "rel_change", "slope"]


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1 with ties given their average rank."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x), dtype=np.float64)
    r[order] = np.arange(len(x), dtype=np.float64)
    sx = x[order]
    i = 0
    while i < len(sx):
        j = i
        while j + 1 < len(sx) and sx[j + 1] == sx[i]:
            j += 1
        if j > i:
            r[order[i:j + 1]] = (i + j) / 2.0
        i = j + 1
    return r


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation; 0 when either side is constant or fewer than 3 points."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(x) < 3 or len(x) != len(y):
        return 0.0
    rx, ry = ranks(x), ranks(y)
    rx -= rx.mean()
    ry -= ry.mean()
    den = float(np.sqrt((rx * rx).sum() * (ry * ry).sum()))
    return float((rx * ry).sum() / den) if den > 0 else 0.0


def thirds(values: np.ndarray) -> tuple[float, float, float]:
    """Medians of the first, middle and last third of ``values`` (n >= 3)."""
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    k = max(1, n // 3)
    return (float(np.median(v[:k])), float(np.median(v[k:n - k] if n - 2 * k > 0 else v)),
            float(np.median(v[n - k:])))


def rel_change(first: float, last: float, scale: float | None = None) -> float:
    """``(last − first) / scale`` with ``scale`` defaulting to ``max(|first|, |last|)``."""
    s = max(abs(first), abs(last)) if scale is None else scale
    return 0.0 if s <= 0 else (last - first) / s


def slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of ``y`` on ``x`` (0 for fewer than two distinct ``x``)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(x) < 2 or np.ptp(x) == 0:
        return 0.0
    xc = x - x.mean()
    return float((xc * (y - y.mean())).sum() / (xc * xc).sum())
