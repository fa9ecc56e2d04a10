"""Reading a run's ``metrics.jsonl`` into a table that the report rules can query.

One JSON object per line, one line per training iteration. A run killed mid-write can leave
a partial last line; it is skipped (any other unreadable line is an error, since it means the
file is not what ppokit wrote). Values that are missing, ``null`` or not finite numbers are
simply absent from a metric's series.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ppokit.errors import UsageError

__all__ = ["MetricsTable", "read_metrics_table", "metrics_path"]

# A schedule counts as "annealed away" once it has fallen below this share of its peak: the
# last iterations of a linear schedule legitimately show tiny clip fractions and KL.
ANNEAL_FLOOR = 0.25


def metrics_path(run: str | Path) -> Path:
    """``RUN_DIR/metrics.jsonl`` (or the file itself when given a ``.jsonl`` path). Inside
    a run directory the file must not be a link (a run directory is data: ppokit follows
    no link in it); a file named directly may be a link the user made."""
    p = Path(run)
    if p.is_dir():
        p = p / "metrics.jsonl"
        if not os.path.lexists(p):
            raise UsageError(f"{run}: no metrics.jsonl in this directory")
        return p
    if p.is_file():
        return Path(os.path.realpath(p))
    if p.exists():
        raise UsageError(f"{run}: not a regular file or a run directory")
    raise UsageError(f"{run}: no such run directory")


def read_metrics_table(run: str | Path) -> MetricsTable:
    """Read a run directory's (or a file's) metrics; skip a partial last line. A line that
    is not a JSON object (garbage, or nesting too deep to be a metrics record) is an error
    naming the line. The file is read in chunks, with the bounds of
    :func:`ppokit.io.metrics.metric_lines` (a regular file, no link, at most
    ``MAX_METRICS`` bytes)."""
    from ppokit.io.metrics import MAX_LINE, metric_lines

    path = metrics_path(run)
    records: list[dict] = []
    skipped_partial = False
    try:
        for i, line, last in metric_lines(path):
            if line is None:
                raise UsageError(f"{path}: line {i} is longer than {MAX_LINE} bytes, not a "
                                 "metrics record")
            if not line.strip():
                continue
            try:
                obj = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError:
                raise UsageError(f"{path}: line {i} is not UTF-8 text") from None
            except RecursionError:
                raise UsageError(f"{path}: line {i} is nested too deeply to be a metrics "
                                 "record") from None
            except ValueError:  # JSONDecodeError, or an integer too long to convert
                if last:
                    skipped_partial = True
                    continue
                raise UsageError(f"{path}: line {i} is not valid JSON") from None
            if not isinstance(obj, dict):
                raise UsageError(f"{path}: line {i} is not a JSON object")
            records.append(obj)
    except MemoryError:
        raise UsageError(f"{path}: too many records to hold in memory") from None
    table = MetricsTable(records, source=str(path))
    table.skipped_partial_line = skipped_partial
    if Path(run).is_dir() or Path(run).name == "metrics.jsonl":
        from .sidefiles import read_side_files

        table.side = read_side_files(Path(run) if Path(run).is_dir() else Path(run).parent)
    return table


def as_number(v) -> float | None:
    """``v`` as a float when it is a finite number (not a bool); else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # an integer too large for a float
        return None
    return f if math.isfinite(f) else None


_INT64 = 2**63 - 1


@dataclass
class MetricsTable:
    """Per-iteration records plus the queries the rules need.

    ``labels[i]`` is how iteration ``i`` is named in evidence: its ``iteration`` field when
    the trainer writes one, else its 1-based position in the file. ``side``: what the run
    directory holds besides the metrics (:func:`ppokit.diagnose.sidefiles.read_side_files`).
    """

    records: Sequence[dict]
    source: str = ""
    skipped_partial_line: bool = False
    side: dict = field(default_factory=dict)
    labels: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.records = list(self.records)
        labels = []
        for i, r in enumerate(self.records):
            it = r.get("iteration")
            ok = isinstance(it, int) and not isinstance(it, bool) and abs(it) <= _INT64
            labels.append(it if ok else i + 1)
        self.labels = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.records)

    def has(self, name: str) -> bool:
        return any(as_number(r.get(name)) is not None for r in self.records)

    def raw(self, name: str) -> list:
        return [r.get(name) for r in self.records]

    def column(self, name: str) -> np.ndarray:
        """All iterations; NaN where the value is missing or not a finite number."""
        out = [as_number(r.get(name)) for r in self.records]
        return np.asarray([np.nan if v is None else v for v in out], dtype=np.float64)

    def nonfinite(self, name: str) -> np.ndarray:
        """Indices where ``name`` is present as NaN/inf (JSON ``NaN``/``Infinity``)."""
        idx = []
        for i, r in enumerate(self.records):
            v = r.get(name)
            if isinstance(v, float) and not math.isfinite(v):
                idx.append(i)
        return np.asarray(idx, dtype=np.int64)

    def active(self) -> np.ndarray:
        """Boolean mask of iterations where learning rate and clip range (when logged) are
        still at least ``ANNEAL_FLOOR`` of their peak, i.e. not in an annealing tail."""
        mask = np.ones(len(self), dtype=bool)
        for name in ("learning_rate", "clip_range"):
            col = self.column(name)
            if np.all(np.isnan(col)):
                continue
            peak = np.nanmax(col)
            if not peak > 0:
                continue
            ok = ~np.isnan(col) & (col >= ANNEAL_FLOOR * peak)
            # A missing value (not logged that iteration) does not exclude it.
            mask &= ok | np.isnan(col)
        return mask

    def series(self, name: str, *, active_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``(positions, values)`` of the finite values of ``name`` (positions index records)."""
        col = self.column(name)
        keep = ~np.isnan(col)
        if active_only:
            keep &= self.active()
        pos = np.flatnonzero(keep)
        return pos, col[pos]
