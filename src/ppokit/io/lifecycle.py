"""The life of a run, the same for every trainer: one loop from the current iteration to
the last, with its checkpoints, time limit, early stops and signals; writing a checkpoint
once per iteration; what a resume tidies in the run directory; what a failure leaves.

A trainer inherits :class:`RunLifecycle` and keeps only what is its own — collecting or
generating, labelling, updating, and what its checkpoint holds. It provides:

* ``run_dir``, ``rundir`` (:class:`~ppokit.io.rundir.RunDir`), ``log``, ``iteration``,
  ``elapsed`` (seconds of training so far);
* ``plan()`` — the run's :class:`Plan`: its last iteration, the checkpoint interval and the
  time limit (seconds or ``None``), read afresh each iteration (a run may be extended);
* ``run_iteration()`` — one iteration, returning its metrics record;
* ``write_checkpoint()`` — the trainer's state under :meth:`checkpoint_path`;
* ``resume_command()`` — the command that continues the run;

and may override ``stop_requested(rec)`` (a reason to end training after ``rec``: an
evaluation target reached, a callback's verdict), ``finish()`` (after the last
iteration's checkpoint: an exported policy), ``agree(flag)`` (ranks decide together) and
``release()`` (what to close when training fails).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from .checkpoint import remove_leftovers, set_aside_newer
from .metrics import missing_iterations, truncate_metrics
from .rundir import fail_run
from .signals import GracefulStop, Interrupted

__all__ = ["RunLifecycle", "Plan", "STOP", "asks_to_stop"]

STOP = "stop"  # what a callback returns to end training, in either trainer


def asks_to_stop(verdict, stops_on: bool) -> bool:
    """Whether a callback's return value ends training: :data:`STOP` (``"stop"``) in
    either trainer; also the boolean each trainer's callbacks have taken (``stops_on``:
    ``False`` for the environment trainer, as Stable-Baselines3's callbacks, ``True`` for
    the language-model trainer). ``None`` (no return) never stops."""
    if isinstance(verdict, str):
        return verdict == STOP
    return isinstance(verdict, bool) and verdict is stops_on


class Plan(NamedTuple):
    total_iterations: int
    checkpoint_every: int
    time_limit: float | None = None


class RunLifecycle:
    """The loop, checkpoints, stops and resume tidying both trainers share (module doc)."""

    _saved_iteration: int | None = None
    stopped_early: bool = False
    stop_reason: str | None = None

    # ------------------------------------------------------------------ the trainer's part
    def plan(self) -> Plan:  # pragma: no cover - every trainer defines it
        raise NotImplementedError

    def run_iteration(self) -> dict:  # pragma: no cover - every trainer defines it
        raise NotImplementedError

    def write_checkpoint(self) -> Path:  # pragma: no cover - every trainer defines it
        raise NotImplementedError

    def resume_command(self) -> str:  # pragma: no cover - every trainer defines it
        raise NotImplementedError

    def stop_requested(self, rec: dict) -> str | None:
        """Why training ends after the iteration that recorded ``rec`` (None: it goes on)."""
        return None

    def finish(self) -> None:
        """After the last checkpoint of a run that reached its end or stopped early."""

    def agree(self, flag: bool) -> bool:
        """``flag`` as all ranks see it (one process: itself)."""
        return bool(flag)

    def release(self) -> None:
        """Close what training holds open, before a failure's clean-up."""

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_path(self, iteration: int) -> Path:
        return Path(self.run_dir) / "checkpoints" / f"iter_{iteration:09d}"

    def last_checkpoint(self) -> Path | None:
        """The checkpoint this process last wrote or resumed from (None: none yet)."""
        if self._saved_iteration is None:
            return None
        return self.checkpoint_path(self._saved_iteration)

    def checkpoint(self) -> Path:
        """This iteration's checkpoint, written once however often it is asked for; from
        then on a failure keeps the run directory."""
        if self._saved_iteration == self.iteration:
            return self.checkpoint_path(self.iteration)
        path = self.write_checkpoint()
        self._saved_iteration = self.iteration
        self.rundir.started()
        return path

    def checkpoint_due(self) -> bool:
        plan = self.plan()
        return (self.iteration % plan.checkpoint_every == 0
                or self.iteration >= plan.total_iterations)

    # ------------------------------------------------------------------ the loop
    def run_to_end(self, stop: GracefulStop | None = None) -> None:
        """Iterate until ``total_iterations``, the time limit or an early stop, then write
        the last checkpoint and :meth:`finish`. With ``stop`` (a :class:`GracefulStop`), a
        signal ends training at the next iteration boundary: a checkpoint is written and
        :class:`Interrupted` raised. A failure says what becomes of the run directory
        (:func:`~ppokit.io.rundir.fail_run`). The run directory's lock is held meanwhile."""
        self.rundir.reacquire()
        self.stopped_early, self.stop_reason = False, None
        try:
            self._loop(stop)
        except BaseException as exc:
            self.release()
            fail_run(exc, self.rundir, self.last_checkpoint(), self.resume_command())
        finally:
            self.rundir.close()

    def _loop(self, stop: GracefulStop | None) -> None:
        while self.iteration < self.plan().total_iterations:
            limit = self.plan().time_limit
            if self.agree(limit is not None and self.elapsed >= limit):
                self.stop_reason = f"time limit of {limit:.0f} s reached"
                self.log(f"{self.stop_reason} at iteration {self.iteration}")
                break
            rec = self.run_iteration()
            reason = self.stop_requested(rec)
            if self.agree(reason is not None):
                self.checkpoint()
                self.stopped_early = True
                self.stop_reason = reason or "another rank stopped"
                break
            if self.checkpoint_due():
                self.checkpoint()
            if self.agree(stop is not None and stop.requested):
                raise Interrupted(stop.signum or 2, self.iteration, self.checkpoint())
        self.checkpoint()
        self.finish()

    # ------------------------------------------------------------------ resume
    def tidy_resumed(self, ckpt: Path, damaged: list, files: tuple[str, ...] = (
            "metrics.jsonl",)) -> None:
        """After a resume from ``ckpt``: newer (damaged or unfinished) checkpoints set
        aside, half-written ones removed, and each of ``files`` (metrics records) cut back
        to the resumed iteration, saying what was skipped or is missing."""
        root = Path(self.run_dir) / "checkpoints"
        set_aside_newer(root, ckpt, damaged, self.log)
        remove_leftovers(root)
        for name in files:
            missing: list[int] = []
            skipped = truncate_metrics(os.path.join(self.run_dir, name), self.iteration,
                                       missing)
            if skipped:
                self.log(f"{name}: skipped {len(skipped)} unreadable line(s) "
                         f"(line {', '.join(map(str, skipped[:5]))})")
            if missing and name == files[0]:
                self.log(f"{name}: no record of iteration(s) {missing_iterations(missing)} "
                         f"of the {self.iteration} done (the file was deleted or cut); the "
                         "run goes on from the checkpoint and its learning curve has a gap "
                         "there")
