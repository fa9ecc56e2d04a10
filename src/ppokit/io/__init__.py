"""Run directories: one layer for every kind of run (environment and language-model).

* :mod:`.rundir` — the lock held by every writer, unique default names, undoing a failed
  start, refusing links and special files;
* :mod:`.atomic` — crash-safe writes, link-proof bounded reads;
* :mod:`.checkpoint` — atomic, pickle-free checkpoints with a manifest over every file,
  verification with fallback to the newest intact one, RNG capture;
* :mod:`.metrics` — ``metrics.jsonl`` (+ TensorBoard) and its tolerant reader;
* :mod:`.signals` — SIGINT / SIGTERM finish the iteration, checkpoint and say how to resume;
* :mod:`.plots` — learning-curve figures.
"""

from .atomic import atomic_write_bytes, atomic_write_text, read_regular
from .checkpoint import (
    CheckpointError,
    capture_rng,
    find_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    optimizer_from_flat,
    optimizer_to_flat,
    restore_rng,
    save_checkpoint,
    verify_checkpoint,
)
from .metrics import WALL_CLOCK_FIELDS, MetricsWriter, read_metrics, truncate_metrics
from .rundir import RunDir, RunLock, check_tree, unique_run_dir
from .signals import GracefulStop, Interrupted

__all__ = ["WALL_CLOCK_FIELDS", "CheckpointError", "GracefulStop", "Interrupted",
           "MetricsWriter", "RunDir", "RunLock", "atomic_write_bytes", "atomic_write_text",
           "capture_rng", "check_tree", "find_checkpoint", "latest_checkpoint",
           "list_checkpoints", "load_checkpoint", "optimizer_from_flat", "optimizer_to_flat",
           "read_metrics", "read_regular", "restore_rng", "save_checkpoint",
           "truncate_metrics", "unique_run_dir", "verify_checkpoint"]
