"""What a tool call costs in its worker process, against a call in the trainer's process.

    python -m bench.tool_overhead [--calls 2000] [--rss-mb 0]

A user's tool runs in a worker process forked from the trainer
(:mod:`ppokit.llm.agents.toolworker`); ppokit's own tools run in the trainer's process.
This times the same trivial tool (it returns its argument) both ways through
:meth:`ppokit.llm.agents.tools.ToolSet.answer` — one call at a time, as a turn with one
call is answered — and the cost of replacing a worker (what a call past its time limit
adds: the kill, the reap and the next fork), with ``--rss-mb`` megabytes of Python objects
held by the process to show how the fork grows with the trainer's memory. Medians over
five rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time

from ppokit.llm.agents import env as builtin
from ppokit.llm.agents.tools import ToolSet


def echo(expression: str) -> str:
    """Return the expression."""
    return expression


def _per_call(tools: ToolSet, name: str, calls: int) -> float:
    tools.answer([(name, ["12x34"])])  # (the worker forked)
    t0 = time.perf_counter()
    for _ in range(calls):
        tools.answer([(name, ["12x34"])])
    return (time.perf_counter() - t0) / calls


def _respawn(tools: ToolSet, rounds: int = 20) -> float:
    """Seconds to kill the worker and fork the next, less a call."""
    t = []
    for _ in range(rounds):
        tools.answer([("echo", ["1"])])
        t0 = time.perf_counter()
        tools.close()  # (as a timeout does: kill and reap)
        tools.answer([("echo", ["1"])])  # the fork, and a call
        t.append(time.perf_counter() - t0)
    return statistics.median(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rss-mb", type=int, default=0)
    args = ap.parse_args()
    ballast = [bytes(1 << 20) for _ in range(args.rss_mb)]  # the trainer's memory
    inproc, worker, respawn = [], [], []
    for _ in range(5):
        inproc.append(_per_call(ToolSet([builtin.calc], fmt="compact"), "calc", args.calls))
        tools = ToolSet([echo], fmt="compact")
        worker.append(_per_call(tools, "echo", args.calls))
        respawn.append(_respawn(tools))
        tools.close()
    a, b = statistics.median(inproc), statistics.median(worker)
    print(f"in the trainer's process: {a * 1e6:.1f} us a call")
    print(f"in a worker process:      {b * 1e6:.1f} us a call (+{(b - a) * 1e6:.1f} us)")
    print(f"a worker replaced (kill, reap, fork) and a call: "
          f"{statistics.median(respawn) * 1e3:.2f} ms (holding {args.rss_mb} MB more)")
    del ballast


if __name__ == "__main__":
    main()
