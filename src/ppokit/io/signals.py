"""Stopping a run cleanly: SIGINT / SIGTERM finish the current iteration, write a
checkpoint and end with the conventional status (130 / 143) after printing the run
directory and the exact command that resumes it. A second signal ends the process at once
(its last complete checkpoint stays intact: checkpoints are written atomically).

:func:`request_stop` asks for the same stop from another thread, as if the signal had
arrived: a training run inside a Ray task stops this way when its launcher is stopped."""

from __future__ import annotations

import signal
import sys
import threading

__all__ = ["GracefulStop", "Interrupted", "request_stop", "clear_stop_request",
           "signal_name", "training"]

_NAMES = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}
_ACTIVE: list[GracefulStop] = []  # entered, innermost last
_requested: int | None = None  # a stop asked for before any GracefulStop was entered


def signal_name(signum: int) -> str:
    return _NAMES.get(signum, str(signum))


def training() -> bool:
    """Whether a :class:`GracefulStop` is entered (a run is training) in this process."""
    return bool(_ACTIVE)


def request_stop(signum: int) -> None:
    """Stop the training of this process as the first ``signum`` would (callable from any
    thread): the entered :class:`GracefulStop` records it, or the next one entered does."""
    global _requested
    if _ACTIVE:
        _ACTIVE[-1]._record(signum)
    else:
        _requested = signum


def clear_stop_request() -> None:
    """Forget a :func:`request_stop` no :class:`GracefulStop` has taken yet."""
    global _requested
    _requested = None


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
        self._record(signum)

    def _record(self, signum: int) -> None:
        if self.signum is not None:
            return
        self.signum = signum
        self._log(f"received {_NAMES.get(signum, signum)}: finishing the current iteration "
                  "and writing a checkpoint (send it again to stop at once)")

    def __enter__(self) -> GracefulStop:
        global _requested
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        _ACTIVE.append(self)
        if _requested is not None:
            self._record(_requested)
            _requested = None
        return self

    def _restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()

    def __exit__(self, *exc) -> None:
        self._restore()
        if self in _ACTIVE:
            _ACTIVE.remove(self)
