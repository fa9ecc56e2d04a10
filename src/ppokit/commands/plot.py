"""``ppokit plot RUN_DIR...``: overlay the learning curves of several runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from ppokit.errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", default="learning_curves.png", help="output PNG path")
    p.add_argument("--title", default=None)


def run(args: argparse.Namespace) -> int:
    from ppokit.io.plots import plot_runs

    for d in args.run_dirs:
        if not (Path(d) / "metrics.jsonl").exists():
            raise UsageError(f"{d}: no metrics.jsonl (not a ppokit run directory)")
    out = plot_runs(args.run_dirs, args.out, title=args.title)
    print(f"wrote {out}")
    return 0
