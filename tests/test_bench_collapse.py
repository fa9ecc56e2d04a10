"""bench.collapse: both step types' counts (runs at 500 and at or above 475) side by side
with a test of equal proportions, and the statistics it prints held to their references."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bench.collapse import CONFIGS, DEFAULT_CONFIGS, fisher_exact, newcombe, summary
from hypothesis import given
from hypothesis import strategies as st


def test_fisher_exact_on_known_tables():
    assert fisher_exact(18, 20, 20, 20) == pytest.approx(0.4872, abs=1e-4)
    assert fisher_exact(3, 3, 0, 3) == pytest.approx(0.1, abs=1e-12)  # 2 / C(6, 3)
    assert fisher_exact(5, 10, 5, 10) == pytest.approx(1.0)


@given(st.integers(1, 45), st.integers(1, 45), st.data())
def test_fisher_exact_matches_scipy(n1, n2, data):
    stats = pytest.importorskip("scipy.stats")
    k1, k2 = data.draw(st.integers(0, n1)), data.draw(st.integers(0, n2))
    want = stats.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]]).pvalue
    assert fisher_exact(k1, n1, k2, n2) == pytest.approx(want, rel=1e-6, abs=1e-12)


def test_newcombe_interval_of_a_difference():
    # Newcombe (1998), Statistics in Medicine 17, example (a): 56/70 vs 48/80
    lo, hi = newcombe(56, 70, 48, 80)
    assert (lo, hi) == (pytest.approx(0.0524, abs=1e-4), pytest.approx(0.3339, abs=1e-4))


def test_the_summary_prints_both_step_types_counts_and_the_test():
    assert DEFAULT_CONFIGS == ("ppokit fast", "ppokit eager step")
    assert all(c in CONFIGS for c in DEFAULT_CONFIGS)
    seeds = list(range(40))
    fused = {s: 500.0 if s not in (3, 9) else (480.0 if s == 3 else 120.0) for s in seeds}
    eager = {s: 500.0 if s != 7 else 300.0 for s in seeds}
    text = summary({"ppokit fast": fused, "ppokit eager step": eager}, seeds, 100_000)
    rows = {line.split()[1]: line for line in text.splitlines()
            if line.startswith("ppokit")}
    assert "38/40" in rows["fast"] and "39/40" in rows["fast"]  # = 500, >= 475
    assert "39/40" in rows["eager"]
    tests = [line for line in text.splitlines() if "p = " in line]
    assert len(tests) == 2
    assert "ppokit fast 38/40 vs ppokit eager step 39/40" in tests[0]
    assert f"p = {fisher_exact(38, 40, 39, 40):.3f}" in tests[0]
    assert "ppokit fast 39/40 vs ppokit eager step 39/40: p = 1.000" in tests[1]


@pytest.mark.parametrize("step", ["default", "eager"])
def test_the_worker_runs_the_step_asked_for(step):
    out = subprocess.run(
        [sys.executable, "-m", "bench._ppokit_worker", "--env", "CartPole-v1", "--steps",
         "256", "--step", step, "--eval-episodes", "1", "--set", "n_envs=2",
         "--set", "n_steps=128", "--set", "batch_size=128"],
        capture_output=True, text=True, check=True, timeout=300)
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert rec["steps"] == 256 and rec["eval_mean"] > 0
    assert rec["minibatch_step"] == ("fused" if step == "default" else "eager")
