"""The token trainer's progress bar: the figures people watch, elapsed and remaining time."""

from __future__ import annotations

__all__ = ["Progress"]


class Progress:
    """A rich progress bar with the figures people watch (quiet when disabled)."""

    def __init__(self, total: int, start: int, enabled: bool = True):
        self.enabled = enabled
        self.total, self.start = total, start
        self._p = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._p = Progress(TextColumn("[bold]llm train"), BarColumn(), MofNCompleteColumn(),
                               TextColumn("elapsed"), TimeElapsedColumn(),
                               TextColumn("remaining"), TimeRemainingColumn(),
                               TextColumn("{task.description}"))
            self._p.__enter__()
            self._task = self._p.add_task("", total=self.total, completed=self.start)
        return self

    def advance(self, rec: dict) -> None:
        if self._p is None:
            return
        clip = rec.get("clipfrac")
        desc = (f"score {rec['score_mean']:.3f}  kl_ref {rec['kl_ref']:.3f}  "
                f"len {rec['response_length_mean']:.1f}  clip "
                + ("-" if clip is None else f"{clip:.3f}"))
        self._p.update(self._task, advance=1, description=desc)

    def __exit__(self, *exc):
        if self._p is not None:
            self._p.__exit__(*exc)
        return False
