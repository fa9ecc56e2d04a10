"""The token trainer's progress: a live bar on a terminal, plain lines in a log.

On a terminal, a rich progress bar with the figures people watch and the elapsed and
remaining time. Off a terminal (CI logs, ``nohup``, ``| tee``) a bar cannot redraw, so one
plain line is printed every ``every`` seconds (``PPOKIT_LOG_EVERY``, 30; and after the last
iteration) with the same figures: never a half-rendered bar. The figures include the speed,
as the environment trainer shows its steps/s: completion tokens per second of generation
and of training, and the share of the time in generation, scoring and training, over the
iterations so far (:class:`PhaseSpeed`; each iteration's own are in ``metrics.jsonl``).
"""

from __future__ import annotations

import sys
import time

__all__ = ["Progress", "PhaseSpeed", "recipe_line"]

PHASES = ("generation", "scoring", "training")  # an iteration's parts, timed by the trainer


def _figures(rec: dict) -> str:
    clip = rec.get("clipfrac")
    # generation ahead of training: the batch's lag in policy versions and the share of
    # its generation hidden behind training
    ahead = (f"  lag {rec['staleness_mean']:.0f}  overlap {rec['overlap_frac']:.0%}"
             if "staleness_mean" in rec else "")
    return (f"score {rec['score_mean']:.3f}  kl_ref {rec['kl_ref']:.3f}  "
            f"len {rec['response_length_mean']:.1f}  clip "
            + ("-" if clip is None else f"{clip:.3f}") + ahead)


def _rate(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


class PhaseSpeed:
    """Tokens per second of generation and of training, and the share of the time each
    phase took, over the iterations :meth:`add` has seen (the records' ``response_tokens``
    and ``time_generation`` / ``time_scoring`` / ``time_training``)."""

    def __init__(self):
        self.tokens = 0.0
        self.time = dict.fromkeys(PHASES, 0.0)

    def add(self, rec: dict) -> None:
        if "response_tokens" not in rec or any(f"time_{p}" not in rec for p in PHASES):
            return
        self.tokens += float(rec["response_tokens"])
        for p in PHASES:
            self.time[p] += float(rec[f"time_{p}"])

    def per_s(self, phase: str) -> float | None:
        t = self.time[phase]
        return self.tokens / t if t > 0 else None

    def shares(self) -> dict[str, float] | None:
        total = sum(self.time.values())
        return {p: t / total for p, t in self.time.items()} if total > 0 else None

    def line(self) -> str:
        """``gen 1.2k tok/s  train 850 tok/s (gen 61% score 4% train 35%)``; ``""``
        before any timed iteration."""
        shares = self.shares()
        if shares is None:
            return ""
        gen, train = self.per_s("generation"), self.per_s("training")
        return (f"gen {'-' if gen is None else _rate(gen)} tok/s  train "
                f"{'-' if train is None else _rate(train)} tok/s (gen "
                f"{shares['generation']:.0%} score {shares['scoring']:.0%} train "
                f"{shares['training']:.0%})")

    def summary(self) -> str:
        """The final summary's sentence: ``""`` before any timed iteration."""
        shares = self.shares()
        if shares is None:
            return ""
        gen, train = self.per_s("generation"), self.per_s("training")
        return (f"{self.tokens:,.0f} completion tokens: generation {gen or 0:,.0f} tokens/s, "
                f"training {train or 0:,.0f} tokens/s; time in generation "
                f"{shares['generation']:.0%}, scoring {shares['scoring']:.0%}, training "
                f"{shares['training']:.0%}")


def _clock(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    """Progress of ``total`` iterations from ``start`` (quiet when disabled); ``tty``:
    whether to draw a bar (default: whether stderr is a terminal). ``time_limit``: the
    run's limit on training seconds (the records' ``wall_time``), which ends it before
    ``total`` when it comes first: the time remaining then says so."""

    def __init__(self, total: int, start: int, enabled: bool = True, *, tty: bool | None = None,
                 every: float | None = None, stream=None, time_limit: float | None = None):
        self.enabled = enabled
        self.total, self.start = total, start
        self.time_limit = time_limit
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        if every is None:
            from ppokit.cliutil import log_every

            every = log_every()
        self.every = every
        self._p = None
        self._t0 = self._last = None
        self._done = start
        self.speed = PhaseSpeed()  # over this process's iterations

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
        self.speed.add(rec)
        figures = "  ".join(x for x in (_figures(rec), self.speed.line()) if x)
        left = self._limit_left(rec)
        if self._p is not None:
            if left is not None:
                figures += f"  time limit in {_clock(left)}"
            self._p.update(self._task, advance=1, description=figures)
            return
        now = time.monotonic()
        if now - self._last >= self.every or self._done >= self.total:
            self._last = now
            elapsed = now - self._t0
            rate = elapsed / max(self._done - self.start, 1)
            remaining = rate * (self.total - self._done)
            until = ""
            if left is not None and left < remaining:  # the time limit ends the run first
                remaining, until = left, " (time limit)"
            print(f"llm train: iteration {self._done}/{self.total}  {figures}  "
                  f"elapsed {_clock(elapsed)}  remaining {_clock(remaining)}{until}",
                  file=self.stream, flush=True)

    def _limit_left(self, rec: dict) -> float | None:
        """Training seconds left before the time limit (None: no limit, or no clock)."""
        if self.time_limit is None or "wall_time" not in rec:
            return None
        return max(self.time_limit - float(rec["wall_time"]), 0.0)

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
                     f", rollout_is={cfg.rollout_is}" if cfg.rollout_is != "none" else "",
                     f", generation up to {cfg.max_staleness} update(s) ahead "
                     "(max_staleness)" if cfg.max_staleness else ""])
    return (f"recipe: {cfg.algo} ({cfg.policy_loss} loss, {cfg.advantage_estimator} "
            f"advantages, {kl}{extra}); {cfg.prompts_per_iter} prompts x "
            f"{cfg.samples_per_prompt} completions an iteration, at most {max_new_tokens} "
            f"new tokens each (max_new_tokens), temperature {cfg.temperature:g}, learning "
            f"rate {cfg.learning_rate:g}" + (f", LoRA r={cfg.lora_r}" if cfg.lora_r else ""))
