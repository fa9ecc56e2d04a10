"""bench.diagnostics: the corpus's targets on a representative subset of real runs (slow),
and its table's bookkeeping on recorded results (fast)."""

from __future__ import annotations

import pytest
from bench.diagnostics import healthy, main, meets_targets, planted, table

# one of each kind: environment presets, the SB3-style API, a resumed run, a task solved
# early, the token trainer, an agent, a check; and planted bugs read by report and check
SUBSET = ["cartpole-s0", "cartpole-a2c", "solved-early-s0", "cartpole-resumed",
          "sb3-cartpole", "llm-grpo", "llm-eval-every", "agent-tools", "check-lm",
          "env-lr-x100-s0", "env-lr-div100-s0", "env-entropy-collapse-s1",
          "env-action-independent", "check-truncation-as-termination", "llm-length-exploit",
          "llm-dead-groups", "check-template-drops-prompt", "agent-one-turn"]


def test_corpus_sizes_and_names():
    h, p = healthy(), planted()
    assert len(h) >= 40 and len(p) >= 30
    names = [r.name for r in h + p]
    assert len(set(names)) == len(names) and set(SUBSET) <= set(names)
    assert all(r.expect for r in p) and not any(r.expect for r in h)


def test_table_counts_misses_and_false_alarms():
    runs = [r for r in healthy() + planted() if r.name in ("cartpole-s0", "acrobot",
                                                           "env-lr-div100-s0",
                                                           "env-action-independent")]
    found = {"cartpole-s0": {"codes": {}, "not_learned": [], "error": ""},
             "acrobot": {"codes": {"return-flat": "WARN"}, "not_learned": ["return-flat"],
                         "error": ""},
             "env-lr-div100-s0": {"codes": {"clipfrac-zero": "WARN"}, "not_learned": [],
                                  "error": ""},
             "env-action-independent": {"codes": {}, "not_learned": [], "error": ""}}
    text, tot = table(runs, found)
    assert tot["healthy_ok"] == 1 and tot["not_learned"] == 1
    assert tot["unexplained_warn"] == ["acrobot:return-flat"]
    assert tot["named"] == 1 and tot["misses"] == ["env-action-independent"]
    assert not meets_targets(tot) and "acrobot" in text


@pytest.mark.slow
def test_corpus_subset_meets_the_targets(tmp_path, capsys):
    rc = main(["--dir", str(tmp_path), "--names", ",".join(SUBSET)])
    out = capsys.readouterr().out
    assert rc == 0, out
