"""`ppokit train --seeds`: several seeds, one run directory each, a summary and a plot."""

import json

import pytest

from ppokit.cli import main
from ppokit.commands.seeds import parse_seeds
from ppokit.errors import UsageError


def test_parse_seeds():
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("0,3,7") == [0, 3, 7]
    assert parse_seeds("1-2,5") == [1, 2, 5]
    for bad in ("3-1", "a", "1,1", "", "0-x"):
        with pytest.raises(UsageError, match="--seeds"):
            parse_seeds(bad)


def test_train_two_seeds_in_parallel(tmp_path, capsys):
    root = tmp_path / "seeds"
    rc = main(["train", "--seeds", "0,1", "--total-steps", "512", "--run-dir", str(root),
               "--eval-episodes", "1", "--set", "tensorboard=false"])
    assert rc == 0
    summary = json.loads((root / "summary.json").read_text())
    assert summary["seeds"] == [0, 1] and summary["failed"] == []
    assert summary["total_steps"] == 2 * 512 and len(summary["eval_mean_returns"]) == 2
    assert (root / "summary.png").stat().st_size > 0
    for s in (0, 1):
        cfg = json.loads((root / f"s{s}" / "config.json").read_text())
        assert cfg["seed"] == s
    # the two seeds are different runs
    m0 = (root / "s0" / "metrics.jsonl").read_text()
    m1 = (root / "s1" / "metrics.jsonl").read_text()
    assert m0 != m1
    assert "2/2 seeds" in capsys.readouterr().out


def test_seeds_errors(capsys):
    assert main(["train", "--seeds", "0-1", "--seed", "3"]) == 2
    assert main(["train", "--parallel", "2"]) == 2
    assert main(["train", "--seeds", "0-1", "--parallel", "0"]) == 2
