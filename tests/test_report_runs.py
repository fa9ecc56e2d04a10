"""ppokit report on real CartPole runs trained by ``ppokit train``.

The CartPole-v1 preset is the RL-zoo's (lr 1e-3 and clip 0.2 both annealed linearly to 0,
20 epochs). A learning rate 30x too high must give a KL or clip-fraction finding, 100x too
low must give ``clipfrac-zero``, and the preset must give no warning at all.
"""

from __future__ import annotations

import pytest

from ppokit.cli import main
from ppokit.diagnose import report

STEP_FINDINGS = {"kl-high", "clipfrac-high", "kl-rising-return-flat"}


def train(tmp_path, name: str, steps: int, seed: int = 0, **overrides) -> str:
    run = tmp_path / name
    argv = ["train", "--env", "CartPole-v1", "--total-steps", str(steps), "--seed", str(seed),
            "--run-dir", str(run), "--no-progress", "--eval-episodes", "0",
            "--set", "tensorboard=false"]
    for k, v in overrides.items():
        argv += ["--set", f"{k}={v}"]
    assert main(argv) == 0
    return str(run)


def warnings(run: str) -> list[str]:
    return [f.code for f in report(run) if f.severity in ("warning", "error")]


def clipfrac_zero_cause(run: str) -> str | None:
    for f in report(run):
        if f.code == "clipfrac-zero":
            return f.evidence[0]["summary"]["cause"]
    return None


def step_too_large(run: str) -> bool:
    """A KL / clip-fraction finding that blames steps that are too large: KL or clip
    fraction too high, or the clip fraction stuck at 0 *because* an oversized update
    collapsed the policy (seen with seed 2: approx_kl 2.6 at iteration 10, then a
    deterministic policy)."""
    return bool(set(warnings(run)) & STEP_FINDINGS) or \
        clipfrac_zero_cause(run) == "collapsed-policy"


def test_short_real_runs(tmp_path):
    """Fast version (15k steps each, ~60 iterations): preset clean, lr/100 clipfrac-zero."""
    assert warnings(train(tmp_path, "preset", 15_000)) == []
    low = train(tmp_path, "lr-low", 15_000, learning_rate=1e-5)
    assert "clipfrac-zero" in warnings(low)
    assert clipfrac_zero_cause(low) == "small-steps"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_preset_run_has_no_warning(tmp_path, seed):
    assert warnings(train(tmp_path, "preset", 100_000, seed=seed)) == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_learning_rate_30x_too_high(tmp_path, seed):
    run = train(tmp_path, "lr30x", 100_000, seed=seed, learning_rate=3e-2)
    assert step_too_large(run), warnings(run)


@pytest.mark.slow
def test_learning_rate_100x_too_low(tmp_path):
    low = train(tmp_path, "lr-low", 100_000, learning_rate=1e-5)
    assert "clipfrac-zero" in warnings(low)
    assert clipfrac_zero_cause(low) == "small-steps"


@pytest.mark.slow
def test_short_learning_rate_30x_too_high(tmp_path):
    run = train(tmp_path, "lr30x", 30_000, learning_rate=3e-2)
    assert step_too_large(run), warnings(run)


@pytest.mark.slow
def test_reward_hacking_run_flags_length_reward_coupling(tmp_path):
    """Token-level PPO against a length-biased reward model without a KL anchor (the
    reward-hacking demo, shortened): reward, KL to the reference and length rise together."""
    pytest.importorskip("transformers")
    from ppokit.llm.evaluation.demo import run_reward_hacking_demo

    out = tmp_path / "rh"
    run_reward_hacking_demo(str(out), iterations=40, plot=False, log=lambda *a: None)
    found = warnings(str(out / "beta0"))
    assert "length-reward-coupling" in found
    assert "truncation-high" in found


@pytest.mark.slow
def test_collapsed_seed_is_reported_and_said_at_the_end(tmp_path, capsys):
    """Seed 18 of the preset collapses after reaching 500 (tests/data/README.md); the
    fresh run gets the return-collapse finding and train's last lines say so."""
    run = train(tmp_path, "s18", 100_000, seed=18)
    assert "return-collapse" in warnings(run)
    assert "the final policy is not the best" in capsys.readouterr().err


@pytest.mark.slow
def test_provoked_length_hacking_run_is_named(tmp_path, monkeypatch):
    """GRPO with a reward that pays 0.1 per character on top of the task's score (the
    recorded llm_length_hacking run, shortened to 60 iterations): the report names the
    length explosion, the truncations and the fall of the task's own reward."""
    pytest.importorskip("transformers")
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).parent.parent)   # tests._lm_rewards importable
    run = tmp_path / "lenhack"
    assert main(["llm", "train", "--algo", "grpo", "--iterations", "60",
                 "--max-new-tokens", "24", "--reward", "ppokit.llm.inputs.task:reverse_score",
                 "--reward", "tests._lm_rewards:length_bonus", "--eval-every", "10",
                 "--run-dir", str(run), "--no-progress", "--no-eval"]) == 0
    found = set(warnings(str(run)))
    assert {"length-explosion", "truncation-high", "reward-hacking"} <= found
