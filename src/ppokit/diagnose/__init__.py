"""``ppokit report``: read a run's metrics together and name what looks wrong.

>>> from ppokit.diagnose import report
>>> findings = report("runs/cartpole")          # doctest: +SKIP
>>> [f.code for f in findings]                   # doctest: +SKIP

Each :class:`Finding` has a stable ``code`` (see :data:`CODES`), a ``severity``, a message
saying what the pattern usually means and what to look at, and the evidence: which metrics,
which iterations, which values. Rules use windows and trends, never single iterations, and
leave annealed tails of the learning-rate / clip-range schedules out of the rules about step
size (see :mod:`ppokit.diagnose.rules`).
"""

from __future__ import annotations

from pathlib import Path

from .metrics import MetricsTable, read_metrics_table
from .rules import CODES, RULES, SEVERITIES, Finding, Thresholds, diagnose

__all__ = ["CODES", "RULES", "SEVERITIES", "Finding", "MetricsTable", "Thresholds",
           "diagnose", "read_metrics_table", "report"]


def report(run: str | Path, thresholds: Thresholds | None = None) -> list[Finding]:
    """Findings for a run directory (or a ``metrics.jsonl`` path)."""
    return diagnose(read_metrics_table(run), thresholds)
