"""The environment trainer's progress, shared by ``ppokit train`` and
``ppokit.train(progress=True)``: on a terminal a live bar (rich) with the steps done, the
latest figures and the time left; off a terminal (CI logs, ``nohup``, ``| tee``), where a
bar cannot redraw, one plain line every ``PPOKIT_LOG_EVERY`` seconds (30; and after the
last iteration) with the same figures."""

from __future__ import annotations

import sys
import time

from ppokit.cliutil import log_every

__all__ = ["train_with_progress"]


def _clock(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _progress_columns(width: int) -> tuple[list, bool]:
    """The bar's columns for a terminal ``width`` columns wide; the second value says
    whether the compact layout (for about 80 columns) was chosen."""
    from rich.progress import BarColumn, TextColumn, TimeRemainingColumn

    if width >= 110:
        return [TextColumn("[bold]{task.description}"), BarColumn(),
                TextColumn("{task.completed:>9,.0f}/{task.total:,.0f} steps"),
                TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                TextColumn("left")], False
    return [TextColumn("[bold]{task.fields[short]}"), BarColumn(bar_width=10),
            TextColumn("{task.percentage:>3.0f}%"), TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(), TextColumn("left")], True


def _info(r: dict, mean_return, compact: bool, games: bool = False) -> str:
    """The progress bar's figures; ``games``: the return is the game score (Atari)."""
    if compact:
        sps = r["sps"]
        rate = "-" if sps is None else (f"{sps / 1000:.1f}k/s" if sps >= 1000
                                        else f"{sps:.0f}/s")
        return (f"{'score' if games else 'ret'} {_fmt(mean_return, '.1f')} "
                f"kl {_fmt(r['approx_kl'], '.4f')} "
                f"clip {_fmt(r['clipfrac'], '.3f')} {rate}")
    return (f"{_fmt(r['sps'], '.0f')} sps  {'game score' if games else 'return'} "
            f"{_fmt(mean_return, '.1f')}"
            f"  kl {_fmt(r['approx_kl'], '.4f')}  clip {_fmt(r['clipfrac'], '.3f')}")


def train_with_progress(trainer, stop=None, on_iteration=None, console=None) -> None:
    """``trainer.train`` with a live progress bar (steps done, the latest figures, and the
    estimated time left; a compact layout on terminals narrower than 110 columns);
    ``on_iteration`` runs after the bar's update and its result is passed on (a callback
    may stop training). Off a terminal: plain lines instead (the module says when)."""
    from rich.console import Console
    from rich.progress import Progress

    console = console or Console(stderr=True)
    if not console.is_terminal:
        return _train_with_lines(trainer, stop, on_iteration, console.file)
    cols, compact = _progress_columns(console.width)
    total = trainer.cfg.num_iterations * trainer.cfg.rollout_size
    with Progress(*cols, console=console, transient=False) as prog:
        task = prog.add_task(f"{trainer.cfg.algo} {trainer.cfg.env_id}", total=total,
                             completed=trainer.global_step, info="",
                             short=trainer.cfg.env_id[:24])

        def on_iter(r: dict) -> None:
            prog.update(task, completed=r["global_step"],
                        info=_info(r, trainer.mean_recent_return, compact,
                                  trainer.reports_games))
            return on_iteration(r) if on_iteration is not None else None

        trainer.train(on_iter, stop=stop)


def _train_with_lines(trainer, stop, on_iteration, stream=None, every: float | None = None
                      ) -> None:
    """``trainer.train`` printing one plain line every ``every`` seconds (default
    :func:`log_every`) and after the last iteration."""
    stream = stream or sys.stderr
    every = log_every() if every is None else every
    cfg = trainer.cfg
    total = cfg.num_iterations * cfg.rollout_size
    start_step = trainer.global_step
    t0 = last = time.monotonic()

    def on_iter(r: dict):
        nonlocal last
        now = time.monotonic()
        step = r["global_step"]
        if now - last >= every or step >= total:
            last = now
            elapsed = now - t0
            done = max(step - start_step, 1)
            left = elapsed / done * max(total - step, 0)
            print(f"{cfg.algo} {cfg.env_id}: step {step:,}/{total:,} ({100 * step / total:.0f}%)"
                  f"  {_info(r, trainer.mean_recent_return, False, trainer.reports_games)}"
                  f"  elapsed {_clock(elapsed)}  remaining {_clock(left)}",
                  file=stream, flush=True)
        return on_iteration(r) if on_iteration is not None else None

    trainer.train(on_iter, stop=stop)
