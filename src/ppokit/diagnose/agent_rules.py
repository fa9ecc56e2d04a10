"""The report's rules for agent runs (a language model acting over several turns, whose
``metrics.jsonl`` logs ``episode/...`` and ``tool/...``; docs/agents.md). Like the other
language-model rules they compare the end of a series (the median of its last third)
with a limit, never single points:

* ``episodes-truncated``: most episodes end at ``max_turns`` (or the model's context)
  rather than by the environment's own end: the task is not finished within the turns
  given, so the returns are mostly the critic's guesses (PPO) or failures (GRPO).
* ``tool-failures``: a quarter or more of the tool calls fail (bad JSON, an unknown tool,
  wrong arguments, an exception, a timeout): the model spends turns on malformed calls.
"""

from __future__ import annotations

from .finding import Finding, evidence
from .lm_rules import start_end
from .metrics import MetricsTable
from .thresholds import Thresholds

__all__ = ["AGENT_RULES"]

TRUNCATED_END = 0.5
TOOL_FAILED_SHARE = 0.25


def rule_episodes_truncated(table: MetricsTable, th: Thresholds) -> list[Finding]:
    pos, v = table.series("episode/truncated_frac")
    if len(v) < th.min_iterations:
        return []
    end = start_end(v)[1]
    if end < TRUNCATED_END:
        return []
    return [Finding(
        "episodes-truncated", "warning",
        f"{end:.0%} of the episodes (median over the last third) end at the turn limit or "
        "the model's context, not by the environment's own end: the task is not finished "
        "in the turns given. Raise max_turns (or max_new_tokens, if turns are cut), make "
        "the environment end failed episodes itself (terminated), or start from a model "
        "that finishes more often (a warm start on demonstrations).",
        [evidence(table, "episode/truncated_frac", pos, v, end=end)])]


def rule_tool_failures(table: MetricsTable, th: Thresholds) -> list[Finding]:
    pos, calls = table.series("tool/calls_per_episode")
    fpos, failed = table.series("tool/failed_per_episode")
    if len(calls) < th.min_iterations or len(failed) != len(calls):
        return []
    c1, f1 = start_end(calls)[1], start_end(failed)[1]
    if c1 <= 0 or f1 / c1 < TOOL_FAILED_SHARE:
        return []
    return [Finding(
        "tool-failures", "warning",
        f"{f1 / c1:.0%} of the tool calls fail (last third: {f1:.2f} of {c1:.2f} calls per "
        "episode): malformed JSON, unknown tools, wrong arguments, exceptions or timeouts, "
        "each read by the model as an error message. Check that the prompt or chat template "
        "shows the tools and their call format (tool_format), and the tools' own errors in "
        "samples.jsonl.",
        [evidence(table, "tool/failed_per_episode", fpos, failed, end=f1),
         evidence(table, "tool/calls_per_episode", pos, calls, end=c1)])]


AGENT_RULES = {
    "episodes-truncated": (rule_episodes_truncated, "agents: most episodes end at the turn "
                           "limit"),
    "tool-failures": (rule_tool_failures, "agents: a quarter or more of the tool calls "
                      "fail"),
}
