"""docs/llm_quickstart.md runs: its ```python blocks are executed in order, in one
namespace, in a temporary directory (a block starting with ``# file: NAME.py`` is written to
NAME.py instead), then its ``ppokit llm`` command lines; the reward must rise on the
random-initialised model, from Python and from the command line."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "llm_quickstart.md"


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def _mean(xs):
    return sum(xs) / len(xs)


@pytest.mark.slow
def test_the_llm_quickstart_runs_and_raises_the_reward(tmp_path, monkeypatch, capsys):
    from ppokit.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    text = DOC.read_text()
    ns: dict = {"__name__": "llm_quickstart"}
    for i, block in enumerate(blocks(text, "python")):
        first = block.splitlines()[0]
        if first.startswith("# file: "):
            (tmp_path / first.removeprefix("# file: ").strip()).write_text(block)
            continue
        exec(compile(block, f"llm_quickstart.md block {i}", "exec"), ns)  # noqa: S102
    hist = ns["run"].history
    assert _mean([r["score_mean"] for r in hist[-10:]]) > \
        _mean([r["score_mean"] for r in hist[:10]]) + 0.2
    ev = ns["ev"]
    assert ev["score_mean"] > ev["reference_score_mean"] + 0.2
    assert (tmp_path / "my_model_grpo" / "config.json").is_file()

    commands = [shlex.split(line) for b in blocks(text, "bash") for line in b.splitlines()
                if line.startswith("ppokit llm")]
    assert len(commands) == 2
    for argv in commands:
        assert main(argv[1:]) == 0
    out = capsys.readouterr().out
    assert "reward/correct" in out and "reward/is_number" in out
    with open(tmp_path / "runs" / "quickstart-cli" / "metrics.jsonl") as f:
        recs = [json.loads(x) for x in f]
    assert _mean([r["score_mean"] for r in recs[-10:]]) > \
        _mean([r["score_mean"] for r in recs[:10]]) + 0.2
    ev_cli = json.loads((tmp_path / "runs" / "quickstart-cli" / "eval.json").read_text())
    assert ev_cli["score_mean"] > ev_cli["reference_score_mean"] + 0.2
