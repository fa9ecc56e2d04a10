"""``ppokit llm compare``: the seeds it parses, the files it writes, a finished run read
back rather than trained again; and (slow) every new preset learning the built-in task."""

from __future__ import annotations

import json

import pytest

from ppokit.cli import main
from ppokit.errors import UsageError
from ppokit.llm.evaluation.compare import compare, parse_seeds


def test_parse_seeds():
    assert parse_seeds("0-2") == [0, 1, 2]
    assert parse_seeds("0,3,5") == [0, 3, 5]
    assert parse_seeds("7") == [7]
    for bad in ("", "2-0", "a", "1,1", "-1", "0-"):
        with pytest.raises(UsageError, match="--seeds"):
            parse_seeds(bad)


def test_compare_writes_its_table_and_reads_finished_runs_back(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["llm", "compare", "--algos", "grpo,dapo", "--seeds", "0", "--iterations", "2",
            "--eval-every", "1", "--n-eval-prompts", "8", "--prompts-per-iter", "4",
            "--sft-steps", "5", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "| grpo |" in text and "| dapo |" in text
    for f in ("compare.md", "compare.json", "compare.png", "grpo-s0/eval.json",
              "dapo-s0/metrics.jsonl"):
        assert (out / f).is_file(), f
    data = json.loads((out / "compare.json").read_text())
    runs = {r["algo"]: r for r in data["runs"]}
    assert [x for x, _ in runs["grpo"]["curve"]] == [0, 1, 2]
    assert runs["dapo"]["completions"] >= 2 * 4 * 4  # dynamic sampling: every round counted
    row = data["summary"]["rows"][0]
    assert row["score"] == runs["grpo"]["eval"]["score_mean"]
    assert row["reference"] == runs["grpo"]["eval"]["reference_score_mean"]
    # run again: both runs are read back, the table is the same
    assert main(argv) == 0
    text2 = capsys.readouterr().out
    assert text2.count("read back") == 2
    assert json.loads((out / "compare.json").read_text())["summary"]["rows"] == \
        data["summary"]["rows"]


def test_compare_refuses_bad_input_before_training(tmp_path):
    with pytest.raises(UsageError, match="--algos"):
        compare(["grpo", "nope"], [0], {"eval_every": 1}, str(tmp_path / "a"))
    with pytest.raises(UsageError, match="--eval-every"):
        compare(["grpo"], [0], {}, str(tmp_path / "b"))
    with pytest.raises(UsageError, match="rollout_is"):
        compare(["grpo"], [0], {"eval_every": 1, "rollout_is": "tis"}, str(tmp_path / "c"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()
    (tmp_path / "d" / "grpo-s0").mkdir(parents=True)  # a run directory of something else
    with pytest.raises(UsageError, match="without a comparison run to continue"):
        compare(["grpo"], [0], {"eval_every": 1, "iterations": 1}, str(tmp_path / "d"))


class _StopNow:
    """A signal already received (what GracefulStop holds after Ctrl-C)."""

    requested = True
    signum = 15


def test_a_stopped_comparison_goes_on_where_it_stopped(tmp_path):
    from ppokit.io import Interrupted

    base = {"iterations": 3, "eval_every": 1, "n_eval_prompts": 8, "prompts_per_iter": 4,
            "sft_steps": 5}
    out = str(tmp_path / "cmp")
    with pytest.raises(Interrupted):
        compare(["grpo"], [0], base, out, log=lambda m: None, stop=_StopNow())
    assert not (tmp_path / "cmp" / "grpo-s0" / "eval.json").exists()
    said = []
    summary = compare(["grpo"], [0], base, out, log=said.append)
    assert said[0] == "grpo seed 0: continued from iteration 1"
    data = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    run = data["runs"][0]
    assert run["iterations"] == 3 and [x for x, _ in run["curve"]] == [0, 1, 2, 3]
    assert summary["rows"][0]["score"] == run["eval"]["score_mean"]
    with pytest.raises(UsageError, match="holds grpo seed 0, not dapo seed 0"):
        import shutil

        shutil.copytree(tmp_path / "cmp" / "grpo-s0", tmp_path / "other" / "dapo-s0")
        (tmp_path / "other" / "dapo-s0" / "eval.json").unlink()
        compare(["dapo"], [0], base, str(tmp_path / "other"), log=lambda m: None)


@pytest.mark.slow  # about 2 minutes on one thread
def test_each_new_preset_learns_the_built_in_task(tmp_path):
    """GSPO, CISPO and DAPO each raise the held-out score of the built-in reverse task (seed
    0, 150 iterations; the reference starts at 0.55)."""
    summary = compare(["gspo", "cispo", "dapo"], [0],
                      {"iterations": 150, "eval_every": 50, "time_limit": 0},
                      str(tmp_path / "cmp"), log=lambda m: None)
    for row in summary["rows"]:
        assert row["score"] > row["reference"] + 0.1, row
