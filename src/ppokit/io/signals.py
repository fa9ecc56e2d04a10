"""Stopping a run cleanly: SIGINT / SIGTERM finish the current iteration, write a
checkpoint and end with the conventional status (130 / 143) after printing the run
directory and the exact command that resumes it. A second signal ends the process at once
(its last complete checkpoint stays intact: checkpoints are written atomically)."""

from __future__ import annotations

import signal
import sys
import threading

__all__ = ["GracefulStop", "Interrupted"]

_NAMES = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}


class Interrupted(Exception):
    """Training stopped at an iteration boundary because of a signal; a checkpoint of that
    iteration has been written."""

    def __init__(self, signum: int, iteration: int, checkpoint=None):
        self.signum = signum
        self.iteration = iteration
        self.checkpoint = checkpoint
        self.exit_code = 128 + int(signum)
        super().__init__(f"stopped by {_NAMES.get(signum, signum)} after iteration {iteration}")


class GracefulStop:
    """While entered (in the main thread), the first SIGINT or SIGTERM only sets
    :attr:`signum`; the trainer checks it between iterations. A second one raises
    ``KeyboardInterrupt`` (SIGINT) or ``SystemExit(143)`` (SIGTERM) at once."""

    def __init__(self, log=None):
        self.signum: int | None = None
        self._old: dict[int, object] = {}
        self._log = log or (lambda m: print(m, file=sys.stderr, flush=True))

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            self._restore()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        self.signum = signum
        self._log(f"received {_NAMES.get(signum, signum)}: finishing the current iteration "
                  "and writing a checkpoint (send it again to stop at once)")

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def _restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()

    def __exit__(self, *exc) -> None:
        self._restore()
