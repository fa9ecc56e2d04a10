"""Running normalisers against direct computations on all the data they have seen."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ppokit.envs.normalize import ObsNormalizer, RewardScaler, RunningMeanStd

_floats = st.floats(-1e3, 1e3, allow_nan=False, width=64)


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.integers(1, 6).flatmap(
    lambda b: hnp.arrays(np.float64, (b, 3), elements=_floats)), min_size=1, max_size=8))
def test_running_mean_std_is_the_mean_and_variance_of_everything_seen(batches):
    eps = 1e-4
    rms = RunningMeanStd((3,), epsilon=eps)
    for b in batches:
        rms.update(b)
    x = np.concatenate(batches)
    n = x.shape[0] + eps
    # the initial estimate counts as `eps` samples with mean 0 and variance 1
    mean = x.sum(0) / n
    var = (((x - mean) ** 2).sum(0) + eps * (1.0 + mean**2)) / n
    assert rms.count == pytest.approx(n, rel=1e-12)
    scale = 1.0 + np.abs(x).max() ** 2
    np.testing.assert_allclose(rms.mean, mean, rtol=1e-9, atol=1e-9 * scale)
    np.testing.assert_allclose(rms.var, var, rtol=1e-7, atol=1e-9 * scale)


def test_obs_normalizer_standardises_and_clips():
    rng = np.random.default_rng(0)
    norm = ObsNormalizer((2,), clip=3.0)
    data = rng.normal([5.0, -2.0], [2.0, 0.5], (4000, 2))
    for row in data:
        norm(row[None], update=True)
    out = norm(data, update=False)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.mean(0), 0.0, atol=0.02)
    np.testing.assert_allclose(out.std(0), 1.0, atol=0.02)
    far = norm(np.array([[1e6, -1e6]]))
    assert far.tolist() == [[3.0, -3.0]]


def test_reward_scaler_divides_by_the_return_std_and_resets_at_episode_ends():
    sc = RewardScaler(num_envs=2, gamma=0.9, clip=10.0)
    r = np.array([1.0, 2.0])
    out = sc(r, np.array([False, True]))
    # returns so far: [1, 2]; the scaler has seen them once (plus its pseudo-count)
    assert np.allclose(out, r / np.sqrt(sc.rms.var + 1e-8))
    assert sc.ret.tolist() == [1.0, 0.0]  # env 1's episode ended
    out = sc(r, np.array([False, False]))
    assert sc.ret.tolist() == [1.9, 2.0]
    assert out.dtype == np.float32 and np.all(np.abs(out) <= 10.0)
