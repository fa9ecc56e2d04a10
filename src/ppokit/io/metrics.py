"""``metrics.jsonl``: one JSON object per training iteration.

Written line by line (flushed after each), so a run killed at any moment leaves at most a
partial last line, which :func:`read_metrics` skips (as it skips, and reports, any garbage
line). NaN and infinities are written as ``null`` (strict JSON). Wall-clock fields
(``sps``, ``time``) are the only fields that differ between two runs with the same seed,
machine and thread count (see ``WALL_CLOCK_FIELDS``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from .atomic import atomic_write_text, open_append, read_regular

MAX_METRICS = 4 * 2**30  # bytes; a metrics file is read whole

__all__ = ["MetricsWriter", "read_metrics", "truncate_metrics", "WALL_CLOCK_FIELDS"]

WALL_CLOCK_FIELDS = ("sps", "time")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_metrics(path: str | Path, skipped: list[int] | None = None) -> list[dict[str, Any]]:
    """All complete records of a metrics file (``RUN_DIR`` or the ``.jsonl`` itself).

    A partial last line (the writer was killed mid-line) and any line that is not a JSON
    object (garbage, nesting too deep to parse) are skipped, never fatal; their 1-based
    line numbers are appended to ``skipped`` when given. A file that is a link, a FIFO or a
    device is refused (:class:`ppokit.errors.UsageError`).
    """
    path = Path(path)
    if not path.is_dir() and not os.path.lexists(path):
        return []  # (a run directory not created yet)
    if path.is_dir():  # checked again: the directory may have appeared meanwhile
        path = path / "metrics.jsonl"
    if not os.path.lexists(path):
        return []
    data = read_regular(path, MAX_METRICS)
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:  # no newline at the end: the last line is partial
        if skipped is not None:
            skipped.append(len(lines))
        lines.pop()
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            rec = None
        if isinstance(rec, dict):
            out.append(rec)
        elif skipped is not None:
            skipped.append(i)
    if skipped is not None:
        skipped.sort()
    return out


def truncate_metrics(path: str | Path, last_iteration: int) -> list[int]:
    """Keep only complete records with ``iteration <= last_iteration`` (atomic rewrite);
    returns the line numbers of the unreadable lines that were dropped."""
    skipped: list[int] = []
    recs = [r for r in read_metrics(path, skipped) if _iteration(r) <= last_iteration]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in recs))
    return skipped


def _iteration(rec: dict) -> float:
    it = rec.get("iteration")
    return it if isinstance(it, (int, float)) and not isinstance(it, bool) else math.inf


class MetricsWriter:
    """Appends records to ``metrics.jsonl`` and, when available, TensorBoard; ``tracker``
    (see :mod:`ppokit.io.tracking`) gets a copy of every record and is closed with the
    writer."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True, *,
                 name: str = "metrics.jsonl", step_key: str = "global_step", tracker=None):
        self.path = Path(run_dir) / name
        self.step_key = step_key
        self.tracker = tracker
        self.fh = open_append(self.path)
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(Path(run_dir) / "tb"))
            except Exception:  # tensorboard not installed: JSONL only
                self.tb = None

    def write(self, record: dict[str, Any]) -> None:
        rec = {k: _clean(v) for k, v in record.items()}
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()
        if self.tb is not None:
            step = int(rec[self.step_key])
            for k, v in rec.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != self.step_key:
                    self.tb.add_scalar(f"train/{k}", v, step)
        if self.tracker is not None:
            self.tracker.log(rec, step=int(rec[self.step_key]))

    def close(self) -> None:
        if self.fh.closed:
            return
        self.fh.close()
        if self.tb is not None:
            self.tb.close()
        if self.tracker is not None:
            self.tracker.close()
