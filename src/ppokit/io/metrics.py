"""``metrics.jsonl``: one JSON object per training iteration.

Written line by line (flushed after each), so a run killed at any moment leaves at most a
partial last line, which :func:`read_metrics` skips. NaN and infinities are written as
``null`` (strict JSON). Wall-clock fields (``sps``, ``time``) are the only fields that differ
between two runs with the same seed, machine and thread count (see ``WALL_CLOCK_FIELDS``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .atomic import atomic_write_text

__all__ = ["MetricsWriter", "read_metrics", "truncate_metrics", "WALL_CLOCK_FIELDS"]

WALL_CLOCK_FIELDS = ("sps", "time")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete records of a metrics file; a partial or corrupt line is skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break  # a partial last line: the writer was killed mid-line
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


def truncate_metrics(path: str | Path, last_iteration: int) -> None:
    """Keep only complete records with ``iteration <= last_iteration`` (atomic rewrite)."""
    recs = [r for r in read_metrics(path) if int(r.get("iteration", 0)) <= last_iteration]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in recs))


class MetricsWriter:
    """Appends records to ``metrics.jsonl`` and, when available, TensorBoard."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
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
            step = int(rec["global_step"])
            for k, v in rec.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "global_step":
                    self.tb.add_scalar(f"train/{k}", v, step)

    def close(self) -> None:
        self.fh.close()
        if self.tb is not None:
            self.tb.close()
