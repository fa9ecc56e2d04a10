"""Running normalisers, vector-env construction and env-state snapshots."""

import json

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from ppokit.envs import (
    ObsNormalizer,
    RewardScaler,
    RunningMeanStd,
    autoreset_mode_of,
    env_state,
    load_env_state,
    make_vec,
)
from ppokit.errors import UsageError


def test_running_mean_std_matches_numpy_over_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3, 2, size=(n, 4)) for n in (5, 17, 1, 40)]
    rms = RunningMeanStd((4,), epsilon=0.0 + 1e-12)
    for b in batches:
        rms.update(b)
    allx = np.concatenate(batches)
    assert np.allclose(rms.mean, allx.mean(0)) and np.allclose(rms.var, allx.var(0))


def test_normalisers_round_trip_their_state():
    rng = np.random.default_rng(1)
    n = ObsNormalizer((3,))
    for _ in range(5):
        n(rng.normal(size=(8, 3)), update=True)
    m = ObsNormalizer((3,))
    m.load_state_dict(n.state_dict())
    x = rng.normal(size=(8, 3))
    assert np.array_equal(n(x), m(x))
    s = RewardScaler(2, 0.99)
    for _ in range(10):
        s(rng.normal(size=2), np.array([False, True]))
    t = RewardScaler(2, 0.99)
    t.load_state_dict(s.state_dict())
    r = rng.normal(size=2)
    assert np.array_equal(s(r, np.zeros(2, bool)), t(r, np.zeros(2, bool)))


def test_reward_scaler_divides_by_return_std_and_keeps_sign():
    s = RewardScaler(1, 0.0)
    for r in (1.0, -1.0) * 200:
        out = s(np.array([r]), np.array([False]))
    assert out[0] < 0 and abs(abs(out[0]) - 1.0) < 0.05  # std of ±1 returns is 1


def test_make_vec_uses_the_vector_entry_point_and_sync_same_step():
    env = make_vec("CartPole-v1", 3)
    assert type(env).__name__ == "CartPoleVectorEnv"
    assert autoreset_mode_of(env) == AutoresetMode.NEXT_STEP
    env2 = make_vec("Pendulum-v1", 2)
    assert autoreset_mode_of(env2) == AutoresetMode.SAME_STEP
    make_vec("CartPole-v1", 2, autoreset="next_step")  # what it supports: fine
    with pytest.raises(UsageError, match="autoreset_mode"):
        make_vec("CartPole-v1", 2, autoreset="same_step")
    with pytest.raises(UsageError, match="unknown or unavailable"):
        make_vec("NotAnEnv-v9", 2)


@pytest.mark.parametrize("env_id, mode", [("CartPole-v1", "auto"), ("Acrobot-v1", "sync"),
                                          ("Pendulum-v1", "sync")])
def test_env_state_snapshot_restores_the_future(env_id, mode):
    env = make_vec(env_id, 3, vectorization=mode)
    env.reset(seed=4)
    rng = np.random.default_rng(0)
    for _ in range(30):
        env.step(env.action_space.sample())
    snap = json.loads(json.dumps(env_state(env)))  # JSON round trip, as on disk
    actions = [env.action_space.sample() for _ in range(60)]
    del rng
    future = [env.step(a)[0] for a in actions]
    env2 = make_vec(env_id, 3, vectorization=mode)
    env2.reset(seed=99)
    load_env_state(env2, snap)
    again = [env2.step(a)[0] for a in actions]
    for x, y in zip(future, again):
        assert np.array_equal(x, y)


def test_env_state_is_none_where_it_cannot_be_saved(tmp_path, monkeypatch):
    pytest.importorskip("mujoco")
    monkeypatch.chdir(tmp_path)  # MuJoCo writes MUJOCO_LOG.TXT into the working directory
    env = make_vec("HalfCheetah-v5", 1)
    env.reset(seed=0)
    assert env_state(env) is None
