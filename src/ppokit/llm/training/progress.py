"""The token trainer's progress: a live bar on a terminal, plain lines in a log.

On a terminal, a rich progress bar with the figures people watch and the elapsed and
remaining time. Off a terminal (CI logs, ``nohup``, ``| tee``) a bar cannot redraw, so one
plain line is printed every ``every`` seconds (``PPOKIT_LOG_EVERY``, 30; and after the last
iteration) with the same figures: never a half-rendered bar.
"""

from __future__ import annotations

import sys
import time

__all__ = ["Progress", "recipe_line"]


def _figures(rec: dict) -> str:
    clip = rec.get("clipfrac")
    return (f"score {rec['score_mean']:.3f}  kl_ref {rec['kl_ref']:.3f}  "
            f"len {rec['response_length_mean']:.1f}  clip "
            + ("-" if clip is None else f"{clip:.3f}"))


def _clock(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    """Progress of ``total`` iterations from ``start`` (quiet when disabled); ``tty``:
    whether to draw a bar (default: whether stderr is a terminal)."""

    def __init__(self, total: int, start: int, enabled: bool = True, *, tty: bool | None = None,
                 every: float | None = None, stream=None):
        self.enabled = enabled
        self.total, self.start = total, start
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        if every is None:
            from ppokit.cliutil import log_every

            every = log_every()
        self.every = every
        self._p = None
        self._t0 = self._last = None
        self._done = start

    def __enter__(self):
        if self.enabled and self.tty:
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
        self._t0 = self._last = time.monotonic()
        return self

    def advance(self, rec: dict) -> None:
        if not self.enabled:
            return
        self._done += 1
        if self._p is not None:
            self._p.update(self._task, advance=1, description=_figures(rec))
            return
        now = time.monotonic()
        if now - self._last >= self.every or self._done >= self.total:
            self._last = now
            elapsed = now - self._t0
            rate = elapsed / max(self._done - self.start, 1)
            print(f"llm train: iteration {self._done}/{self.total}  {_figures(rec)}  "
                  f"elapsed {_clock(elapsed)}  remaining "
                  f"{_clock(rate * (self.total - self._done))}", file=self.stream, flush=True)

    def __exit__(self, *exc):
        if self._p is not None:
            self._p.__exit__(*exc)
        return False


def recipe_line(cfg, max_new_tokens: int) -> str:
    """What one iteration does, said when training starts (the preset, the batch, the
    generation cap and temperature: what ``config.json`` records)."""
    kl = ("no KL term" if cfg.kl_mode == "none" or not cfg.kl_coef
          else f"KL to the reference in the {cfg.kl_mode}, beta {cfg.kl_coef:g}")
    extra = "".join([", dynamic sampling" if cfg.dynamic_sampling else "",
                     f", rollout_is={cfg.rollout_is}" if cfg.rollout_is != "none" else ""])
    return (f"recipe: {cfg.algo} ({cfg.policy_loss} loss, {cfg.advantage_estimator} "
            f"advantages, {kl}{extra}); {cfg.prompts_per_iter} prompts x "
            f"{cfg.samples_per_prompt} completions an iteration, at most {max_new_tokens} "
            f"new tokens each (max_new_tokens), temperature {cfg.temperature:g}, learning "
            f"rate {cfg.learning_rate:g}" + (f", LoRA r={cfg.lora_r}" if cfg.lora_r else ""))
