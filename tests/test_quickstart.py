"""docs/quickstart.md runs: its ```python blocks are executed in order, in one namespace,
in a temporary directory, with the step budgets cut down (a block starting with
``# file: NAME.py`` is written to NAME.py instead)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "quickstart.md"

# (pattern, replacement): small budgets, evaluations that still happen within them
SMALL = [(r"total_steps=[\d_]+", "total_steps=1024"), (r"\.learn\([\d_]+\)", ".learn(512)"),
         (r"eval_every=\d+", "eval_every=2"), (r"episodes=10\b", "episodes=3")]


def blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_every_python_block_of_the_quickstart_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    code = blocks(DOC.read_text())
    assert len(code) >= 8
    ns: dict = {"__name__": "quickstart"}
    for i, block in enumerate(code):
        first = block.splitlines()[0]
        if first.startswith("# file: "):
            (tmp_path / first.removeprefix("# file: ").strip()).write_text(block)
            continue
        for pattern, repl in SMALL:
            block = re.sub(pattern, repl, block)
        exec(compile(block, f"quickstart.md block {i}", "exec"), ns)  # noqa: S102
    assert (tmp_path / "cartpole_agent" / "checkpoints").is_dir()
    assert (ns["agent"].run_dir / "best").is_dir()
    assert "corridor" in sys.modules
