"""Intervals of a mean: Wilson's for proportions, the normal approximation otherwise."""

import math

import pytest

from ppokit.core.stats import mean_interval, wilson_interval


def test_wilson_against_hand_computed_values():
    # k=75, n=200: p=0.375, z=1.96; centre (p + z²/2n)/(1 + z²/n) = 0.37736, half-width
    # z·sqrt(p(1-p)/n + z²/4n²)/(1 + z²/n) = 0.06650 -> (0.3109, 0.4439)
    lo, hi = wilson_interval(75, 200)
    assert lo == pytest.approx(0.3109, abs=1e-4) and hi == pytest.approx(0.4439, abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and 0 < wilson_interval(0, 10)[1] < 0.35
    assert wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_mean_interval_picks_the_rule():
    assert mean_interval([1, 0, 1, 1]) == wilson_interval(3, 4)
    xs = [0.5, 0.25, 1.0, 0.75]
    m, s = sum(xs) / 4, math.sqrt(sum((x - 0.625) ** 2 for x in xs) / 3)
    lo, hi = mean_interval(xs)
    assert lo == pytest.approx(m - 1.96 * s / 2) and hi == pytest.approx(m + 1.96 * s / 2)
    assert all(math.isnan(v) for v in mean_interval([]))
