"""Run directories: metrics, checkpoints (atomic, pickle-free) and plots."""

from .atomic import atomic_write_bytes, atomic_write_text
from .checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    optimizer_from_flat,
    optimizer_to_flat,
    save_checkpoint,
)
from .metrics import WALL_CLOCK_FIELDS, MetricsWriter, read_metrics, truncate_metrics

__all__ = ["WALL_CLOCK_FIELDS", "MetricsWriter", "atomic_write_bytes", "atomic_write_text",
           "latest_checkpoint", "list_checkpoints", "load_checkpoint", "optimizer_from_flat",
           "optimizer_to_flat", "read_metrics", "save_checkpoint", "truncate_metrics"]
