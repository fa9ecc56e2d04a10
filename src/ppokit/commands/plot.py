"""``ppokit plot RUN_DIR...``: overlay the learning curves of several runs.

Every argument is checked before anything is drawn: each RUN_DIR must hold a readable
``metrics.jsonl`` and ``--out`` must name a file in an existing directory, in an image
format matplotlib writes. Runs with no row that has both ``global_step`` and
``episode_return_mean`` are named on stderr and left out; when no run has one there is
nothing to plot and no file is written (exit status 2). Runs of one configuration that end
at different steps are averaged only where all of them have data; the legend says up to
which step, the longer runs' remainders are drawn on their own, and a note on stderr says so.
Language-model run directories (``ppokit llm train``) get their own panels: reward, KL to
the reference, response length and truncated share per iteration
(:mod:`ppokit.llm.evaluation.plots`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ppokit.errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", default=None,
                   help="output image path; the format follows the suffix (default: "
                        "RUN_DIR/plot.png for one run, plot.png in the runs' common "
                        "directory for several)")
    p.add_argument("--title", default=None)


def _check_out(out: str) -> Path:
    from ppokit.io.plots import figure_format

    if not out.strip() or "\0" in out:
        raise UsageError(f"--out: expected a file path, got {out!r}")
    path = Path(out)
    if path.is_dir() and not path.is_symlink():
        raise UsageError(f"--out: {out} is a directory; give a file path such as "
                         f"{os.path.join(out, 'curves.png')}")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"--out: no such directory {str(parent)!r}")
    try:
        figure_format(path)
    except ValueError as exc:
        raise UsageError(f"--out: {exc}") from None
    return path


def default_out(run_dirs: list[str]) -> str:
    """Next to the runs: ``RUN_DIR/plot.png`` for one, else ``plot.png`` in the directory
    that holds them all (the current one when they share none)."""
    if len(run_dirs) == 1:
        return os.path.join(run_dirs[0], "plot.png")
    try:
        common = os.path.commonpath([os.path.abspath(d) for d in run_dirs])
    except ValueError:  # different drives
        common = ""
    if common in {os.path.abspath(d) for d in run_dirs}:  # one run inside another
        common = os.path.dirname(common)
    return os.path.join(common or ".", "plot.png")


def run(args: argparse.Namespace) -> int:
    from ppokit.io.plots import curve, plot_runs

    for d in args.run_dirs:
        if not Path(d).is_dir():
            raise UsageError(f"RUN_DIR: no such directory {d!r}")
    out = _check_out(args.out if args.out is not None else default_out(args.run_dirs))
    from ppokit.llm.evaluation.plots import is_llm_run, plot_llm_runs

    llm_runs = [d for d in args.run_dirs if is_llm_run(d)]
    if llm_runs:  # language-model runs: reward, KL, length and truncation per iteration
        if len(llm_runs) != len(args.run_dirs):
            raise UsageError("cannot draw environment runs and language-model runs in one "
                             f"figure ({llm_runs[0]} is a language-model run); plot them "
                             "separately")
        for d in llm_runs:
            if not (Path(d) / "metrics.jsonl").is_file():
                raise UsageError(f"{d}: no metrics.jsonl yet (no finished iteration)")
        plot_llm_runs(llm_runs, out, title=args.title)
        print(f"wrote {out}")
        return 0
    have, lacking = [], []
    for d in args.run_dirs:
        m = Path(d) / "metrics.jsonl"
        if not os.path.lexists(m):
            raise UsageError(f"{d}: no metrics.jsonl (not a ppokit run directory)")
        try:
            x, _ = curve(d)
        except (OSError, RecursionError, UnicodeError) as exc:
            why = getattr(exc, "strerror", None) or type(exc).__name__
            raise UsageError(f"{d}: cannot read metrics.jsonl ({why})") from None
        (have if len(x) else lacking).append(d)
    if not have:
        raise UsageError(f"nothing to plot: no row of metrics.jsonl in {', '.join(lacking)} "
                         "has both global_step and episode_return_mean (no finished "
                         "episode yet); no file written")
    for d in lacking:
        print(f"ppokit plot: {d}: no row with both global_step and episode_return_mean; "
              "left out", file=sys.stderr)
    notes: list[str] = []
    plot_runs(have, out, title=args.title, notes=notes)
    for note in notes:
        print(f"ppokit plot: {note}", file=sys.stderr)
    print(f"wrote {out}")
    return 0
