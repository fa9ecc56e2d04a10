"""The lean sync vector env steps exactly like Gymnasium's SyncVectorEnv (SAME_STEP)."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from ppokit.envs.vec import LeanSyncVectorEnv, make_vec


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1", "MountainCarContinuous-v0"])
def test_lean_sync_vector_env_matches_gymnasium(env_id):
    lean = make_vec(env_id, 3, vectorization="sync")
    assert type(lean) is LeanSyncVectorEnv
    ref = gym.make_vec(env_id, num_envs=3, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
    o1, _ = lean.reset(seed=3)
    o2, _ = ref.reset(seed=3)
    assert np.array_equal(o1, o2)
    lean.action_space.seed(0)
    ends = 0
    for _ in range(1100):  # past CartPole's and Pendulum's episode ends
        act = lean.action_space.sample()
        a, b = lean.step(act), ref.step(act)
        for x, y in zip(a[:4], b[:4]):
            assert np.array_equal(x, y)
        assert ("final_obs" in a[4]) == ("final_obs" in b[4])
        if "final_obs" in b[4]:
            ends += 1
            assert np.array_equal(a[4]["_final_obs"], b[4]["_final_obs"])
            for i in np.flatnonzero(b[4]["_final_obs"]):
                assert np.array_equal(a[4]["final_obs"][i], b[4]["final_obs"][i])
    assert ends > 0
    o = a[0]
    o[:] = 123.0  # the returned observation is a copy
    assert not np.array_equal(lean.step(lean.action_space.sample())[0], o)


def test_next_step_mode_keeps_gymnasiums_vector_env():
    env = make_vec("Pendulum-v1", 2, vectorization="sync", autoreset="next_step")
    assert type(env) is not LeanSyncVectorEnv
