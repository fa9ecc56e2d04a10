"""The built-in arithmetic task: prompts, verifiable rewards, held-out split, warm-start
demonstrations; and (slow) GRPO raising its held-out accuracy on the tiny model."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppokit.llm.inputs.task import ArithmeticTask, _held_out, answer_format, correct_answer


def test_prompts_rows_and_held_out_split():
    task = ArithmeticTask()
    rng = random.Random(0)
    train = task.train_prompts(500, rng)
    held = task.heldout_prompts(128)
    assert not set(train) & set(held)
    assert all(_held_out(p) for p in held) and not any(_held_out(p) for p in train)
    row = task.row("23+7=")
    assert row == {"prompt": "23+7=", "answer": "30"}
    assert task.row("3-9=")["answer"] == "-6"
    assert task.heldout_prompts(128) == held  # fixed


@given(st.integers(0, 49), st.integers(0, 9), st.sampled_from("+-"), st.text(max_size=6))
def test_rewards_match_a_plain_reading_of_the_answer(a, b, op, junk):
    value = a + b if op == "+" else a - b
    good, bare = f"{value}.", f"{value}"
    ans = [str(value)] * 3
    assert correct_answer([good, bare, junk], ans)[:2] == [1.0, 1.0]
    assert answer_format([good, bare]) == [1.0, 0.0]
    # a completion that gives another number is wrong; one without a number scores 0
    import re

    nums = re.findall(r"-?\d+", junk)
    expected = 1.0 if nums and int(nums[-1]) == value else 0.0
    if re.fullmatch(r"(-?\d+)\.", junk.strip()):
        expected = 1.0 if int(junk.strip()[:-1]) == value else 0.0
    assert correct_answer([junk], [str(value)]) == [expected]


def test_demonstrations_are_noisy_in_digits_and_format():
    task = ArithmeticTask()
    rng = random.Random(0)
    prompts = task.train_prompts(2000, rng)
    demos = [task.demonstration(p, rng) for p in prompts]
    ok = correct_answer(demos, [task.row(p)["answer"] for p in prompts])
    fmt = answer_format(demos)
    assert 0.6 < sum(ok) / len(ok) < 0.95
    assert 0.6 < sum(fmt) / len(fmt) < 0.8


@pytest.mark.slow
def test_grpo_raises_held_out_accuracy_on_the_arithmetic_task(tmp_path):
    from ppokit.cli import main

    run = tmp_path / "arith"
    assert main(["llm", "train", "--algo", "grpo", "--task", "arithmetic", "--run-dir",
                 str(run), "--no-progress", "--iterations", "400", "--time-limit", "0",
                 "--learning-rate", "5e-5"]) == 0
    ev = json.loads((run / "eval.json").read_text())
    # measured 0.328 -> 0.484 after 215 iterations, 0.586 after 400; with the fused
    # forward (the SFT warm start, hence the reference, differs in rounding) 0.430 ->
    # 0.523 after 250 and 0.555 after 400 (format 0.703 -> 0.906)
    assert ev["reward/correct_answer"] >= ev["reference_reward/correct_answer"] + 0.1
    assert ev["reward/answer_format"] >= ev["reference_reward/answer_format"] + 0.1
