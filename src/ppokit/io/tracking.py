"""Experiment trackers beside ``metrics.jsonl``: Weights & Biases (``track = "wandb"``).

metrics.jsonl stays the record of a run; a tracker receives a copy of every record (the
numeric fields, under ``train/``, at the record's step). W&B is an optional extra (``pip
install 'ppokit[wandb]'``); it works without an account or network with
``WANDB_MODE=offline`` (the run is written under ``RUN_DIR/wandb/`` and can be uploaded
later with ``wandb sync``; a ``RUN_DIR/wandb`` that is a symbolic link is refused). Every
W&B setting the library reads from the environment (``WANDB_MODE``, ``WANDB_ENTITY``,
``WANDB_DIR``, ...) applies as usual.

A resumed run continues the same W&B run: its id is kept in ``RUN_DIR/wandb_id`` (a short
string, read with a size bound and checked against W&B's id alphabet; anything else starts a
new W&B run, said in the log). Nothing else is read from the run directory.
"""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ppokit.errors import UsageError

from .atomic import atomic_write_text, read_regular

__all__ = ["TRACKERS", "WandbTracker", "check_tracker", "make_tracker"]

TRACKERS = ("none", "wandb")
_ID = re.compile(r"[a-z0-9]{1,64}")
ID_FILE = "wandb_id"
_ALPHABET = string.ascii_lowercase + string.digits


def check_tracker(track: str) -> None:
    """Before any work: the tracker's package is importable (a one-line error naming
    ``track`` and the extra otherwise)."""
    if track == "wandb":
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise UsageError("track: wandb is not installed (pip install 'ppokit[wandb]'); "
                             "use track=none to train without it") from None


class WandbTracker:
    """One W&B run per ppokit run directory; ``log`` copies a metrics record."""

    def __init__(self, run_dir: str | Path, *, project: str, config: dict[str, Any],
                 resume: bool, log: Callable[[str], None] = print):
        import wandb

        from .rundir import run_subdir

        self.run_dir = Path(run_dir)
        run_subdir(self.run_dir, "wandb")  # W&B writes there: never a link out of it
        run_id = self._stored_id(log) if resume else None
        if run_id is None:
            # from os.urandom: the training RNG streams are not touched
            run_id = "".join(secrets.choice(_ALPHABET) for _ in range(8))
            atomic_write_text(self.run_dir / ID_FILE, run_id + "\n")
        try:
            self.run = wandb.init(project=project, dir=str(self.run_dir), id=run_id,
                                  name=self.run_dir.name, config=config, resume="allow",
                                  reinit="create_new")
        except Exception as exc:  # no login, no network, a W&B server error, ...
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise UsageError(f"track: W&B could not start a run ({type(exc).__name__}: "
                             f"{first[:200]}); log in with `wandb login`, or set "
                             "WANDB_MODE=offline to log without an account") from None
        self.id = run_id

    def _stored_id(self, log: Callable[[str], None]) -> str | None:
        path = self.run_dir / ID_FILE
        try:
            text = read_regular(path, 256).decode("ascii").strip()
        except FileNotFoundError:
            text = None
        except (OSError, UsageError, UnicodeDecodeError):
            text = ""
        if text is not None and _ID.fullmatch(text):
            return text
        log(f"{path}: no valid W&B run id; the resumed run logs to a new W&B run")
        return None

    def log(self, record: dict[str, Any], step: int) -> None:
        scalars = {f"train/{k}": v for k, v in record.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


def make_tracker(track: str, run_dir: str | Path, *, project: str, config: dict[str, Any],
                 resume: bool, log: Callable[[str], None] = print) -> WandbTracker | None:
    if track == "none":
        return None
    if track == "wandb":
        return WandbTracker(run_dir, project=project, config=config, resume=resume, log=log)
    raise UsageError(f"track: expected one of {', '.join(TRACKERS)}, got {track!r}")
