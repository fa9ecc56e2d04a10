"""ppokit report: synthetic metric streams for every pattern, clean streams, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ppokit.cli import main
from ppokit.diagnose import CODES, MetricsTable, Thresholds, diagnose, read_metrics_table, report


def healthy_env_run(n: int = 120, seed: int = 0) -> list[dict]:
    """A plausible healthy PPO run: lr and clip anneal linearly to 0, return rises and
    plateaus, clip fraction and KL shrink with the schedule, the critic learns."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        frac = 1.0 - i / n
        prog = min(1.0, i / (0.4 * n))
        ret = 20 + 480 * prog ** 1.5 + rng.normal(0, 15)
        out.append({
            "iteration": i + 1,
            "global_step": 256 * (i + 1),
            "episode_return_mean": float(min(500.0, ret)),
            "policy_loss": float(rng.normal(-0.01, 0.005)),
            "value_loss": float(60 * np.exp(-3 * prog) + 2 + abs(rng.normal(0, 1))),
            "entropy": float(0.69 - 0.15 * prog + rng.normal(0, 0.01)),
            "approx_kl": float(abs(0.01 * frac + rng.normal(0, 0.002))),
            "approx_kl_k1": float(rng.normal(0, 0.005)),
            "clipfrac": float(np.clip(0.15 * frac + rng.normal(0, 0.03), 0, 1)),
            "clip_active_frac": float(np.clip(0.05 * frac + rng.normal(0, 0.01), 0, 1)),
            "explained_variance": float(np.clip(0.2 + 0.7 * prog + rng.normal(0, 0.05), -1, 1)),
            "learning_rate": 1e-3 * frac,
            "clip_range": 0.2 * frac,
            "early_stop": None,
        })
    return out


def healthy_lm_run(n: int = 60, seed: int = 0) -> list[dict]:
    """A healthy token-level PPO run: score rises, KL to the reference stays small and
    bounded, length steady, few truncations."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        prog = i / n
        kl = 0.02 + 0.03 * (1 - np.exp(-3 * prog)) + abs(rng.normal(0, 0.005))
        out.append({
            "iteration": i + 1,
            "score_mean": float(0.3 + 0.4 * prog + rng.normal(0, 0.03)),
            "non_score_reward": float(-0.05 * kl),
            "kl_ref": float(kl),
            "response_length_mean": float(12 + rng.normal(0, 0.8)),
            "truncated_frac": float(abs(rng.normal(0.02, 0.01))),
            "approx_kl": float(abs(rng.normal(0.01, 0.003))),
            "clipfrac": float(abs(rng.normal(0.1, 0.02))),
            "entropy": float(1.2 - 0.3 * prog + rng.normal(0, 0.02)),
            "value_loss": float(0.1 * np.exp(-2 * prog) + 0.01),
            "explained_variance": float(0.3 + 0.4 * prog + rng.normal(0, 0.05)),
            "learning_rate": 1e-5,
            "early_stop": None,
        })
    return out


def codes(records) -> list[str]:
    return [f.code for f in diagnose(MetricsTable(records))]


def write_run(tmp_path, records, tail: str = ""):
    d = tmp_path / "run"
    d.mkdir()
    with open(d / "metrics.jsonl", "w") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
        fh.write(tail)
    return d


# -- clean streams ----------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_healthy_env_run_reports_nothing(seed):
    assert codes(healthy_env_run(seed=seed)) == []


@pytest.mark.parametrize("seed", range(4))
def test_healthy_lm_run_reports_nothing(seed):
    assert codes(healthy_lm_run(seed=seed)) == []


def test_annealed_tail_is_not_clipfrac_zero():
    # Same healthy run, but the last third has clip fraction and KL at exactly zero, as
    # happens when lr and clip reach 0: the tail is ignored.
    recs = healthy_env_run()
    for r in recs[-40:]:
        r["clipfrac"] = 0.0
        r["clip_active_frac"] = 0.0
        r["approx_kl"] = 0.0
    assert codes(recs) == []


def test_single_spikes_do_not_trigger():
    recs = healthy_env_run(seed=3)
    recs[10]["clipfrac"] = 0.95
    recs[20]["approx_kl"] = 2.0
    recs[30]["entropy"] = 0.0
    recs[40]["early_stop"] = {"epoch": 1, "minibatch": 0}
    recs[50]["truncated_frac"] = 1.0
    assert codes(recs) == []


def test_too_short_run_reports_nothing():
    recs = healthy_env_run(n=120)[:4]
    for r in recs:
        r["clipfrac"] = 0.0
    assert codes(recs) == []


# -- each pattern triggers its code -----------------------------------------------------

def test_clipfrac_zero():
    recs = healthy_env_run(seed=1)
    rng = np.random.default_rng(1)
    for r in recs:
        r["clipfrac"] = float(abs(rng.normal(0, 0.002)))
        r["approx_kl"] = float(abs(rng.normal(0, 1e-5)))
    found = diagnose(MetricsTable(recs))
    assert [f.code for f in found] == ["clipfrac-zero"]
    f = found[0]
    assert f.severity == "warning"
    ev = {e["metric"]: e for e in f.evidence}
    assert ev["clipfrac"]["summary"]["median"] < 0.01
    assert ev["clipfrac"]["summary"]["cause"] == "small-steps"
    assert "too small" in f.message
    # evidence only from the non-annealed part (lr >= 25% of its peak): iterations 1..91
    assert max(ev["clipfrac"]["iterations"]) == 91
    assert len(ev["clipfrac"]["iterations"]) == len(ev["clipfrac"]["values"]) <= 12


def test_clipfrac_zero_after_collapse_blames_large_steps():
    # a huge update at iteration 5 makes the policy deterministic; afterwards no ratio
    # moves, so the clip fraction is 0 — the cause is the collapse, not small steps
    recs = healthy_env_run(seed=1)
    for i, r in enumerate(recs):
        if i == 4:
            r["approx_kl"], r["clipfrac"] = 2.6, 0.45
        elif i >= 5:
            r["approx_kl"], r["clipfrac"], r["entropy"] = 0.0, 0.0, 1e-4
            r["episode_return_mean"] = 9.3
    found = {f.code: f for f in diagnose(MetricsTable(recs))}
    assert set(found) == {"clipfrac-zero", "entropy-collapse"}
    cz = found["clipfrac-zero"]
    assert cz.evidence[0]["summary"]["cause"] == "collapsed-policy"
    assert "too large" in cz.message and "2.6" in cz.message
    assert "2.6" in found["entropy-collapse"].message


def test_clipfrac_zero_without_schedule_fields():
    recs = healthy_env_run(seed=2)
    for r in recs:
        del r["learning_rate"], r["clip_range"]
        r["clipfrac"] = 0.001
        r["approx_kl"] = 1e-6  # a step that small hardly moves the KL either
    assert "clipfrac-zero" in codes(recs)


def test_clipfrac_high():
    recs = healthy_env_run(seed=2)
    rng = np.random.default_rng(2)
    for r in recs:
        r["clipfrac"] = float(np.clip(rng.normal(0.6, 0.1), 0, 1))
    assert codes(recs) == ["clipfrac-high"]


def test_kl_high():
    recs = healthy_env_run(seed=2)
    for r in recs:
        r["approx_kl"] = 0.2
    assert codes(recs) == ["kl-high"]


def test_kl_rising_return_flat():
    recs = healthy_env_run(seed=4)
    rng = np.random.default_rng(4)
    n = len(recs)
    for i, r in enumerate(recs):
        r["approx_kl"] = float(0.004 * np.exp(2.0 * i / n) * rng.uniform(0.8, 1.2))
        r["episode_return_mean"] = float(22 + rng.normal(0, 3))
        r["explained_variance"] = float(0.5 + rng.normal(0, 0.05))
    assert codes(recs) == ["kl-rising-return-flat"]
    # the same KL with a rising return is healthy
    good = healthy_env_run(seed=4)
    for g, r in zip(good, recs):
        g["approx_kl"] = r["approx_kl"]
    assert "kl-rising-return-flat" not in codes(good)


def test_early_stop_frequent():
    recs = healthy_env_run(seed=5)
    for i, r in enumerate(recs):
        if i % 5:
            r["early_stop"] = {"epoch": 3, "minibatch": 0}
    found = diagnose(MetricsTable(recs))
    assert [f.code for f in found] == ["early-stop-frequent"]
    assert "during epoch 4" in found[0].message     # epoch index 3 counted from 0
    assert found[0].evidence[0]["summary"]["fired"] == 96


def test_early_stop_frequent_trainer_fields():
    # the trainer logs early_stop_epoch / early_stop_minibatch (null when it did not fire)
    recs = healthy_env_run(seed=5)
    for i, r in enumerate(recs):
        del r["early_stop"]
        r["early_stop_epoch"] = 2 if i % 4 else None
        r["early_stop_minibatch"] = 0 if i % 4 else None
    assert codes(recs) == ["early-stop-frequent"]
    for r in recs:
        r["early_stop_epoch"] = r["early_stop_minibatch"] = None
    assert codes(recs) == []


def test_early_stop_frequent_lm_flag():
    recs = healthy_lm_run(seed=5)
    for i, r in enumerate(recs):
        del r["early_stop"]
        r["early_stopped"] = bool(i % 3)
    assert codes(recs) == ["early-stop-frequent"]


def test_early_stop_occasional_is_fine():
    recs = healthy_env_run(seed=5)
    for i, r in enumerate(recs):
        if i % 3 == 0:
            r["early_stop"] = {"epoch": 8, "minibatch": 0}
    assert codes(recs) == []


def test_critic_mean_only():
    recs = healthy_env_run(seed=6)
    rng = np.random.default_rng(6)
    for r in recs:
        r["explained_variance"] = float(rng.normal(0.0, 0.04))
    assert codes(recs) == ["critic-mean-only"]


def test_critic_near_zero_ev_with_flat_value_loss_is_not_mean_only():
    recs = healthy_env_run(seed=6)
    rng = np.random.default_rng(6)
    for r in recs:
        r["explained_variance"] = float(rng.normal(0.0, 0.04))
        r["value_loss"] = float(20 + rng.normal(0, 2))
    assert "critic-mean-only" not in codes(recs)


def test_entropy_collapse():
    recs = healthy_env_run(seed=7)
    n = len(recs)
    rng = np.random.default_rng(7)
    for i, r in enumerate(recs):
        r["entropy"] = float(0.69 * np.exp(-12 * i / n) + abs(rng.normal(0, 0.002)))
    found = diagnose(MetricsTable(recs))
    assert [f.code for f in found] == ["entropy-collapse"]
    assert found[0].evidence[0]["summary"]["collapsed_at"] < n // 2


def test_slow_late_entropy_decline_is_not_collapse():
    recs = healthy_env_run(seed=7)
    n = len(recs)
    for i, r in enumerate(recs):
        r["entropy"] = float(0.69 * (1 - 0.95 * i / n))
    assert codes(recs) == []


def test_continuous_entropy_is_not_judged():
    recs = healthy_env_run(seed=7)
    n = len(recs)
    for i, r in enumerate(recs):
        r["entropy"] = float(1.4 - 8 * i / n)   # Gaussian: falls below zero
    assert "entropy-collapse" not in codes(recs)


def test_length_reward_coupling():
    recs = healthy_lm_run(seed=8)
    rng = np.random.default_rng(8)
    n = len(recs)
    for i, r in enumerate(recs):
        r["response_length_mean"] = float(12 + 40 * i / n + rng.normal(0, 1.5))
        r["kl_ref"] = float(0.02 + 0.8 * i / n + abs(rng.normal(0, 0.02)))
        r["non_score_reward"] = -0.0 * r["kl_ref"]    # beta = 0
    found = {f.code: f for f in diagnose(MetricsTable(recs))}
    # a length 4x its start is also a length explosion (lm-rules), said apart
    assert set(found) == {"length-reward-coupling", "length-explosion"}
    assert {e["metric"] for e in found["length-reward-coupling"].evidence} == {
        "response_length_mean", "score_mean", "kl_ref"}


def test_length_reward_coupling_from_non_score_reward():
    recs = healthy_lm_run(seed=9)
    n = len(recs)
    for i, r in enumerate(recs):
        r["response_length_mean"] = 12 + 40 * i / n
        r["non_score_reward"] = -0.1 * (0.02 + 0.8 * i / n)
        del r["kl_ref"]
    assert codes(recs) == ["length-reward-coupling", "length-explosion"]


def test_length_rising_alone_is_not_coupling():
    # length and score rise but the policy stays as close to the reference as it started
    recs = healthy_lm_run(seed=9)
    rng = np.random.default_rng(9)
    n = len(recs)
    for i, r in enumerate(recs):
        r["response_length_mean"] = 12 + 40 * i / n
        r["kl_ref"] = float(0.03 + rng.normal(0, 0.005))
    assert codes(recs) == ["length-explosion"]       # not the coupling
    # length and KL rise but the score does not
    recs = healthy_lm_run(seed=9)
    for i, r in enumerate(recs):
        r["response_length_mean"] = 12 + 40 * i / n
        r["score_mean"] = float(0.4 + rng.normal(0, 0.03))
    # the score never moved (over 60 of the default 400 iterations: info)
    assert codes(recs) == ["length-explosion", "reward-flat"]


def test_truncation_high():
    recs = healthy_lm_run(seed=10)
    rng = np.random.default_rng(10)
    n = len(recs)
    for i, r in enumerate(recs):
        r["truncated_frac"] = float(np.clip(0.05 + 0.6 * i / n + rng.normal(0, 0.05), 0, 1))
    assert codes(recs) == ["truncation-high"]


def test_nonfinite_metric_is_an_error():
    recs = healthy_env_run(seed=11)
    recs[70]["policy_loss"] = float("nan")
    recs[71]["value_loss"] = float("inf")
    found = diagnose(MetricsTable(recs))
    assert found[0].code == "metrics-nonfinite"
    assert found[0].severity == "error"
    assert "iteration 71" in found[0].message


def test_thresholds_are_tunable():
    recs = healthy_env_run(seed=0)
    assert "clipfrac-high" in [f.code for f in diagnose(
        MetricsTable(recs), Thresholds(clipfrac_high_median=0.05))]


def test_codes_are_stable():
    assert set(CODES) >= {"clipfrac-zero", "clipfrac-high", "kl-rising-return-flat",
                          "early-stop-frequent", "critic-mean-only", "entropy-collapse",
                          "length-reward-coupling", "truncation-high"}


# -- files and the command line ---------------------------------------------------------

def test_partial_last_line_is_skipped(tmp_path):
    recs = healthy_env_run(seed=0)
    d = write_run(tmp_path, recs, tail='{"iteration": 121, "clipfr')
    table = read_metrics_table(d)
    assert len(table) == len(recs)
    assert table.skipped_partial_line
    assert report(d) == []


def test_corrupt_middle_line_is_an_error(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    assert main(["report", str(d)]) == 2


def test_cli_json_parses(tmp_path, capsys):
    recs = healthy_env_run(seed=1)
    for r in recs:
        r["clipfrac"] = 0.0
        r["approx_kl"] = 0.0
    d = write_run(tmp_path, recs)
    assert main(["report", str(d), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert isinstance(out, list) and [f["code"] for f in out] == ["clipfrac-zero"]
    assert set(out[0]) == {"code", "severity", "message", "evidence"}
    assert out[0]["evidence"][0]["metric"] == "clipfrac"
    assert main(["report", str(d), "--strict"]) == 1


def test_cli_json_clean_is_empty_list(tmp_path, capsys):
    d = write_run(tmp_path, healthy_env_run(seed=2))
    assert main(["report", str(d), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["report", str(d), "--strict"]) == 0


def test_cli_text_table(tmp_path, capsys):
    recs = healthy_lm_run(seed=3)
    for r in recs:
        r["truncated_frac"] = 0.5
    d = write_run(tmp_path, recs)
    assert main(["report", str(d)]) == 0
    out = capsys.readouterr().out
    assert "truncation-high" in out and "truncated_frac" in out


@pytest.mark.parametrize("make", ["missing", "empty_dir", "empty_file"])
def test_cli_bad_run_dir_exits_2(tmp_path, capsys, make):
    d = tmp_path / "run"
    if make != "missing":
        d.mkdir()
    if make == "empty_file":
        (d / "metrics.jsonl").write_text("")
    assert main(["report", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppokit report: error:") and err.count("\n") == 1


# -- return-collapse: recorded real runs (tests/data/README.md) and synthetic shapes -----

DATA = __import__("pathlib").Path(__file__).parent / "data"


@pytest.mark.parametrize("seed,fires", [(0, False), (11, False), (18, True)])
def test_return_collapse_on_recorded_cartpole_runs(seed, fires):
    found = [f for f in report(DATA / f"cartpole_seed{seed}.metrics.jsonl")
             if f.code == "return-collapse"]
    assert bool(found) == fires
    if fires:
        (f,) = found
        s = f.evidence[0]["summary"]
        assert s["plateau"] == 500.0 and 100 < s["tail_median"] < 160
        assert s["lost_fraction"] > 0.7
        assert "plateau of 500" in f.message and "eval_every" in f.message


def _with_returns(rets):
    recs = healthy_env_run(n=len(rets))
    for r, v in zip(recs, rets):
        r["episode_return_mean"] = v
    return recs


def test_return_collapse_synthetic_shapes():
    rng = np.random.default_rng(0)
    rise = list(np.linspace(20, 500, 40))
    noise = lambda n, s: list(rng.normal(0, s, n))  # noqa: E731
    plateau = [500 + e for e in noise(40, 5)]
    fell = [150 + e for e in noise(40, 10)]
    assert "return-collapse" in codes(_with_returns(rise + plateau + fell))
    # recovered within the tail: not sustained
    back = [150] * 20 + [495] * 20
    assert "return-collapse" not in codes(_with_returns(rise + plateau + back))
    # a short dip at the very end (less than the tail window)
    assert "return-collapse" not in codes(_with_returns(rise + plateau + [500] * 36 + [60] * 4))
    # a small sag (20 % of what was learned) is not a collapse
    assert "return-collapse" not in codes(_with_returns(rise + plateau + [404] * 40))
    # never learned anything: nothing to lose
    assert "return-collapse" not in codes(_with_returns([20 + e for e in noise(120, 2)]))
    # a single high spike is not a plateau
    spike = [20.0] * 30 + [500.0] + [20.0] * 89
    assert "return-collapse" not in codes(_with_returns(spike))


def test_list_codes_needs_no_run_dir(capsys):
    assert main(["report", "--list-codes"]) == 0
    assert "return-collapse" in capsys.readouterr().out
