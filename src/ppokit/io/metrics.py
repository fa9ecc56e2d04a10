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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ppokit.errors import WRITE_FAULTS, UsageError, write_fault

from .atomic import atomic_write_lines, open_append, open_regular

# bytes of a metrics file: ppokit's records are about 1 KiB each, so this is half a million
# iterations and more; a larger file is refused rather than read into memory
MAX_METRICS = 512 * 2**20
MAX_LINE = 2**20  # a longer line is not a record ppokit wrote (it is skipped, unread)
_CHUNK = 2**20

__all__ = ["MetricsWriter", "read_metrics", "truncate_metrics", "metric_lines",
           "missing_iterations", "WALL_CLOCK_FIELDS", "MAX_METRICS"]

WALL_CLOCK_FIELDS = ("sps", "time")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def metric_lines(path: str | Path) -> Iterator[tuple[int, bytes | None, bool]]:
    """``(line number, line, last)`` for each line of a metrics file, read in chunks: a
    regular file (no link, no FIFO or device) of at most :data:`MAX_METRICS` bytes. A line
    longer than :data:`MAX_LINE` comes as ``None`` (never held whole); ``last`` marks a
    final line without its newline (a writer killed mid-line)."""
    path = Path(path)
    fd = open_regular(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > MAX_METRICS:
            raise UsageError(f"{path}: {size} bytes, more than the {MAX_METRICS} a metrics "
                             "file may have")
        n, buf, long_line, read = 0, b"", False, 0
        while True:
            chunk = fh.read(_CHUNK)
            read += len(chunk)
            if read > MAX_METRICS:
                raise UsageError(f"{path}: more than the {MAX_METRICS} bytes a metrics file "
                                 "may have")
            if not chunk:
                break
            parts = (buf + chunk).split(b"\n")
            buf = parts.pop()
            for part in parts:
                n += 1
                yield n, None if long_line else part, False
                long_line = False
            if len(buf) > MAX_LINE:
                buf, long_line = b"", True
        if buf or long_line:
            yield n + 1, None if long_line else buf, True


def _record(line: bytes | None) -> dict | None:
    if line is None:
        return None
    try:
        rec = json.loads(line.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) else None


def read_metrics(path: str | Path, skipped: list[int] | None = None) -> list[dict[str, Any]]:
    """All complete records of a metrics file (``RUN_DIR`` or the ``.jsonl`` itself).

    A partial last line (the writer was killed mid-line) and any line that is not a JSON
    object (garbage, nesting too deep to parse, a line too long to be a record) are
    skipped, never fatal; their 1-based line numbers are appended to ``skipped`` when
    given. A file that is a link, a FIFO or a device, or larger than :data:`MAX_METRICS`,
    is refused (:class:`ppokit.errors.UsageError`).
    """
    path = Path(path)
    if not path.is_dir() and not os.path.lexists(path):
        return []  # (a run directory not created yet)
    if path.is_dir():  # checked again: the directory may have appeared meanwhile
        path = path / "metrics.jsonl"
    if not os.path.lexists(path):
        return []
    out = []
    try:
        for i, line, last in metric_lines(path):
            rec = None if last else _record(line)
            if rec is not None:
                out.append(rec)
            elif skipped is not None and (line is None or line.strip()):
                skipped.append(i)
    except MemoryError:
        raise UsageError(f"{path}: too many records to hold in memory") from None
    return out


def truncate_metrics(path: str | Path, last_iteration: int,
                     missing: list[int] | None = None) -> list[int]:
    """Keep only complete records with ``iteration <= last_iteration`` (an atomic rewrite,
    streamed); returns the line numbers of the unreadable lines that were dropped.
    ``missing`` receives the iterations in ``1..last_iteration`` that no record kept covers
    (a file deleted or cut short: the learning curve has a gap there)."""
    skipped: list[int] = []
    seen = set()

    def kept():
        if not os.path.lexists(path):
            return
        for i, line, last in metric_lines(path):
            rec = None if last else _record(line)
            if rec is None:
                if line is None or line.strip():
                    skipped.append(i)
                continue
            it = _iteration(rec)
            if it <= last_iteration:
                if isinstance(it, int):
                    seen.add(it)
                yield json.dumps(rec) + "\n"

    atomic_write_lines(path, kept())
    if missing is not None:
        missing.extend(k for k in range(1, last_iteration + 1) if k not in seen)
    return skipped


def missing_iterations(missing: list[int]) -> str:
    """``[1, 2, 3, 7]`` → ``"1-3, 7"`` (at most five ranges, then "...")."""
    ranges: list[list[int]] = []
    for k in missing:
        if ranges and k == ranges[-1][1] + 1:
            ranges[-1][1] = k
        else:
            ranges.append([k, k])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges[:5])
    return text + (", ..." if len(ranges) > 5 else "")


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
        from .rundir import run_subdir

        # never a link out of the run directory (checked before anything is opened)
        tb_dir = run_subdir(run_dir, "tb") if tensorboard else None
        self.fh = open_append(self.path)
        self.tb = None
        if tb_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(tb_dir))
            except Exception:  # tensorboard not installed: JSONL only
                self.tb = None

    def write(self, record: dict[str, Any]) -> None:
        rec = {k: _clean(v) for k, v in record.items()}
        line = json.dumps(rec) + "\n"
        try:
            self.fh.write(line)
            self.fh.flush()
        except OSError as exc:  # a partial line is skipped by every reader
            if exc.errno in WRITE_FAULTS:
                raise write_fault(exc, self.path, len(line.encode())) from exc
            raise
        if self.tb is not None:
            step = int(rec[self.step_key])
            try:
                for k, v in rec.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool) \
                            and k != self.step_key:
                        self.tb.add_scalar(f"train/{k}", v, step)
            except OSError as exc:  # (TensorBoard's writer thread failed and says so here)
                if exc.errno in WRITE_FAULTS:
                    raise write_fault(exc, self.path.parent / "tb") from exc
                raise
        if self.tracker is not None:
            self.tracker.log(rec, step=int(rec[self.step_key]))

    def close(self) -> None:
        if self.fh.closed:
            return
        self.fh.close()
        if self.tb is not None:
            try:
                self.tb.close()
            except OSError as exc:  # (said by write() already, or after the run's end)
                if exc.errno not in WRITE_FAULTS:
                    raise
        if self.tracker is not None:
            self.tracker.close()
