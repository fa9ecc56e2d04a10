"""A finding of ``ppokit report`` and the evidence it carries (shared by every rule)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from .metrics import MetricsTable

__all__ = ["Finding", "MAX_POINTS"]


@dataclass
class Finding:
    """One named problem: ``code`` (stable), ``severity``, ``message`` (what and what to look
    at) and ``evidence`` (which metric, which iterations, which values)."""

    code: str
    severity: str
    message: str
    evidence: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


MAX_POINTS = 12


def evidence(table: MetricsTable, metric: str, pos: np.ndarray, values: np.ndarray,
              **summary) -> dict:
    """Evidence for one metric: at most ``MAX_POINTS`` evenly spaced (iteration, value) pairs
    of the window the rule looked at, plus the summary figures it used."""
    pos = np.asarray(pos)
    values = np.asarray(values, dtype=np.float64)
    if len(pos) > MAX_POINTS:
        pick = np.unique(np.linspace(0, len(pos) - 1, MAX_POINTS).round().astype(int))
        pos, values = pos[pick], values[pick]
    return {
        "metric": metric,
        "iterations": [int(table.labels[p]) for p in pos],
        "values": [round_figure(v) for v in values],
        "summary": {k: round_figure(v) if isinstance(v, float) else v for k, v in summary.items()},
    }


def round_figure(v: float) -> float | None:
    """6 significant digits; None for a value that is not finite (keeps the JSON strict)."""
    v = float(v)
    return float(f"{v:.6g}") if np.isfinite(v) else None


def iteration_numbers(table: MetricsTable, pos: np.ndarray) -> str:
    if len(pos) == 0:
        return "-"
    return f"{table.labels[pos[0]]}–{table.labels[pos[-1]]}"
