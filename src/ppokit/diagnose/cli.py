"""``ppokit report RUN_DIR [--json]``."""

from __future__ import annotations

import argparse
import json
import sys

from ppokit.errors import UsageError

from .metrics import read_metrics_table
from .rules import RULES, Finding, diagnose


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", nargs="?",
                        help="a run directory holding metrics.jsonl (or the file itself)")
    parser.add_argument("--json", action="store_true",
                        help="print the findings as a JSON list of {code, severity, message, "
                             "evidence}")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1 when there is any warning or error")
    parser.add_argument("--list-codes", action="store_true",
                        help="list the finding codes and exit")


def _summary_text(ev: dict) -> str:
    s = ", ".join(f"{k}={v}" for k, v in ev.get("summary", {}).items())
    its = ev.get("iterations") or []
    span = f" (it. {its[0]}–{its[-1]})" if its else ""
    return f"{ev['metric']}: {s}{span}"


def _print_plain(findings: list[Finding], source: str, n: int, out=None) -> None:
    """The report off a terminal (a log, a pipe): no table to wrap at 80 columns, each
    finding as its severity and code, then its message and evidence, indented."""
    import textwrap

    out = out or sys.stdout
    print(f"ppokit report {source}: {n} iterations read", file=out)
    if not findings:
        print("No findings: none of the known problem patterns shows in these metrics.",
              file=out)
        return
    for f in findings:
        print(f"\n{f.severity.upper()}  {f.code}  (docs/checks.md, row {f.code})", file=out)
        print(textwrap.fill(f.message, width=100, initial_indent="    ",
                            subsequent_indent="    "), file=out)
        for e in f.evidence:
            print(f"    evidence: {_summary_text(e)}", file=out)


def _print_table(findings: list[Finding], source: str, n: int) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # metric names and paths come from the file: print them as text, never as markup
    console = Console()
    if not console.is_terminal:
        return _print_plain(findings, source, n)
    console.print(f"[bold]ppokit report[/bold] {escape(source)}: {n} iterations read")
    if not findings:
        console.print("No findings: none of the known problem patterns shows in these metrics.")
        return
    style = {"error": "bold red", "warning": "yellow", "info": "cyan"}
    table = Table(show_lines=True)
    table.add_column("severity")
    table.add_column("code", no_wrap=True)
    table.add_column("finding and advice", ratio=3)
    table.add_column("evidence", ratio=2)
    for f in findings:
        table.add_row(f"[{style[f.severity]}]{f.severity}[/]", f.code, escape(f.message),
                      escape("\n".join(_summary_text(e) for e in f.evidence)))
    console.print(table)


def run(args: argparse.Namespace) -> int:
    if args.list_codes:
        for code, (_, desc) in RULES.items():
            print(f"{code:24s} {desc}")
        return 0
    if args.run_dir is None:
        raise UsageError("RUN_DIR: expected a run directory (or its metrics.jsonl); "
                         "--list-codes alone lists the finding codes")
    table = read_metrics_table(args.run_dir)
    if len(table) == 0:
        raise UsageError(f"{args.run_dir}: metrics.jsonl has no complete line")
    findings = diagnose(table)
    if args.json:
        json.dump([f.to_dict() for f in findings], sys.stdout, indent=2, allow_nan=False,
                  ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        _print_table(findings, table.source, len(table))
    if args.strict and any(f.severity in ("error", "warning") for f in findings):
        return 1
    return 0
