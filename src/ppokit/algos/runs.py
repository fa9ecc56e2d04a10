"""A run directory read back: its newest intact checkpoint and the configuration it was
trained with (the trainer writes them; evaluation, loading and resuming read them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ppokit.errors import UsageError
from ppokit.io.checkpoint import find_checkpoint, load_checkpoint, no_checkpoint_message
from ppokit.plugins import reading_run

from .config import TrainConfig, config_from_dict

__all__ = ["BEST_DIR", "load_run_checkpoint", "load_run_config"]

BEST_DIR = "best"  # the best policy of the evaluations during training (a checkpoint root)


def load_run_checkpoint(run_dir: str | Path, log: Callable[[str], None] | None = None,
                        *, best: bool = False) -> tuple[TrainConfig, dict, dict, dict]:
    """``(config, tensors, arrays, state)`` of a run's newest intact checkpoint (``best``:
    of the best policy the evaluations during training kept, ``best/``). The config is the
    checkpoint's own (verified with it), never ``config.json``, which is a copy for people
    to read."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"RUN_DIR: no such run directory {str(run_dir)!r}")
    if best and not (run_dir / BEST_DIR).is_dir():
        raise UsageError(f"--best: {run_dir} has no best/ policy (it is kept when the run "
                         "evaluates during training: eval_every > 0)")
    ckpt, damaged = find_checkpoint(run_dir / (BEST_DIR if best else "checkpoints"), log=log)
    if ckpt is None:
        raise UsageError(no_checkpoint_message(run_dir, damaged))
    tensors, arrays, st = load_checkpoint(ckpt)
    if not isinstance(st.get("config"), dict):
        raise UsageError(f"run dir: checkpoint {ckpt} holds no configuration")
    with reading_run():  # a loss or estimator of the user's is needed to train, not to read
        cfg = config_from_dict(st["config"])
    return cfg, tensors, arrays, st


def load_run_config(run_dir: str | Path) -> TrainConfig:
    """The configuration a run's newest intact checkpoint was trained with."""
    return load_run_checkpoint(run_dir)[0]
