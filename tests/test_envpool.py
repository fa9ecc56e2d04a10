"""vectorization=envpool: EnvPool's environments as a NEXT_STEP vector env, checked step by
step against Gymnasium's CartPole and through the collector's two masks; Atari games with
EnvPool's preprocessing and ppokit's game scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control import CartPoleEnv
from gymnasium.vector import AutoresetMode

import ppokit
from ppokit.envs import make_vec
from ppokit.envs.envpool_vec import ATARI_KWARGS, EnvPoolAtari, EnvPoolVectorEnv
from ppokit.errors import UsageError
from ppokit.policies import make_policy
from ppokit.rollout import Collector

pytest.importorskip("envpool")  # the envpool extra (installed by `make setup`)


def test_cartpole_dynamics_and_autoreset_match_gymnasium():
    """Each EnvPool step from a state equals Gymnasium's CartPole step from that state
    (observation, reward, terminated, truncated at max_episode_steps); after an episode
    end the next step ignores the action and returns a fresh start with reward 0."""
    n, limit = 3, 25
    env = make_vec("CartPole-v1", n, vectorization="envpool",
                   env_kwargs={"max_episode_steps": limit})
    assert isinstance(env, EnvPoolVectorEnv)
    assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    mirror = [CartPoleEnv() for _ in range(n)]
    for m in mirror:
        m.reset(seed=0)
    obs, _ = env.reset(seed=5)
    steps = np.zeros(n, int)
    ended = np.zeros(n, bool)
    rng = np.random.default_rng(0)
    seen = {"terminated": 0, "truncated": 0, "dummy": 0}
    for _ in range(300):
        a = rng.integers(2, size=n)
        nobs, r, te, tr, _ = env.step(a)
        for i, m in enumerate(mirror):
            if ended[i]:  # the reset step: action ignored, reward 0, no flags
                assert r[i] == 0 and not te[i] and not tr[i]
                assert abs(nobs[i]).max() <= 0.05  # Gymnasium's start range
                steps[i] = 0
                seen["dummy"] += 1
                continue
            m.state, m.steps_beyond_terminated = obs[i].astype(np.float64), None
            mo, mr, mte, _, _ = m.step(int(a[i]))
            steps[i] += 1
            assert np.allclose(nobs[i], mo, atol=1e-5), (nobs[i], mo)
            assert r[i] == mr and te[i] == mte
            assert tr[i] == (steps[i] >= limit and not mte)
            seen["terminated"] += int(te[i])
            seen["truncated"] += int(tr[i])
        ended = te | tr
        obs = nobs
    assert min(seen.values()) > 0, seen
    env.close()


class _Spy:
    """Records what the wrapped vector env returns."""

    def __init__(self, env):
        self.env, self.steps = env, []
        self.num_envs = env.num_envs
        self.metadata = env.metadata
        self.single_action_space = env.single_action_space
        self.single_observation_space = env.single_observation_space

    def reset(self, **kw):
        return self.env.reset(**kw)

    def step(self, a):
        out = self.env.step(a)
        self.steps.append(out)
        return out


def test_collector_two_masks_on_envpool():
    """Through the collector: a truncation's next value is V of the real final observation
    (the one EnvPool returned with the flag), the reset step after it is a dummy row
    (valid false, reward 0, terminated and ended), a termination is not bootstrapped."""
    env = _Spy(make_vec("CartPole-v1", 4, vectorization="envpool",
                        env_kwargs={"max_episode_steps": 12}))
    torch.manual_seed(0)
    pol = make_policy(env.single_observation_space, env.single_action_space)
    col = Collector(env, pol, generator=torch.Generator().manual_seed(1))
    col.reset(seed=3)
    ro = col.collect(64)
    T, N = ro.rewards.shape
    n_trunc = n_dummy = 0
    with torch.no_grad():
        for t in range(T):
            obs, r, te, tr, _ = env.steps[t]
            for i in range(N):
                if not ro.valid[t, i]:
                    n_dummy += 1
                    assert ro.rewards[t, i] == 0 and ro.terminated[t, i] and ro.episode_end[t, i]
                    continue
                assert ro.rewards[t, i] == float(r[i])
                assert bool(ro.terminated[t, i]) == bool(te[i])
                assert bool(ro.episode_end[t, i]) == bool(te[i] or tr[i])
                if tr[i] and not te[i]:
                    n_trunc += 1
                    v = pol.value(torch.as_tensor(obs[i:i + 1]))[0]
                    assert torch.allclose(ro.next_values[t, i], v, atol=1e-6)
                if (te[i] or tr[i]) and t + 1 < T:
                    assert not ro.valid[t + 1, i]  # the reset step after it
    assert n_trunc > 0 and n_dummy > 0
    ro.compute_advantages(0.99, 0.95)
    assert torch.isfinite(ro.advantages).all()


class _Contains(_Spy):
    """Refuses a batch of actions with a row its single action space does not contain."""

    def step(self, a):
        sp = self.single_action_space
        bad = [i for i in range(len(a)) if not sp.contains(np.asarray(a)[i, ...])]
        assert not bad, f"actions {np.asarray(a)[bad]} are not in {sp}"
        return super().step(a)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0"])
@pytest.mark.parametrize("fast", [True, False])
def test_actions_sent_to_envpool_are_in_its_action_space(env_id, fast):
    env = _Contains(make_vec(env_id, 3, vectorization="envpool"))
    torch.manual_seed(0)
    pol = make_policy(env.single_observation_space, env.single_action_space,
                      log_std_init=1.5)  # wide samples: many outside a Box's bounds
    col = Collector(env, pol, generator=torch.Generator().manual_seed(1), fast=fast)
    col.reset(seed=0)
    col.collect(40)
    env.env.close()


def test_envpool_reseeds_on_reset():
    env = make_vec("CartPole-v1", 2, vectorization="envpool")
    a, _ = env.reset(seed=1)
    b, _ = env.reset(seed=2)
    c, _ = env.reset(seed=1)
    assert np.array_equal(a, c) and not np.array_equal(a, b)
    env.close()


@pytest.mark.parametrize("kwargs, message", [
    (dict(env_id="ALE/Breakout-v5", env_kwargs={"nonsense": 1}), "EnvPool cannot build"),
    (dict(env_id="Taxi-v4"), "EnvPool does not provide it"),
    (dict(env_id="CartPole-v1", autoreset="same_step"), "next_step mode only"),
    (dict(env_id=lambda: CartPoleEnv()), "not an environment factory"),
    (dict(env_id="CartPole-v1", env_kwargs={"nonsense": 1}), "EnvPool cannot build"),
])
def test_envpool_refusals(kwargs, message):
    with pytest.raises(UsageError) as exc:
        make_vec(kwargs.pop("env_id"), 2, vectorization="envpool", **kwargs)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_train_cartpole_on_envpool(tmp_path):
    agent = ppokit.train("CartPole-v1", total_steps=2048, run_dir=tmp_path / "r", seed=0,
                         vectorization="envpool", progress=False, tensorboard=False)
    assert agent.num_timesteps == 2048 and agent.cfg.vectorization == "envpool"
    res = agent.evaluate(episodes=2)  # on Gymnasium's CartPole-v1
    assert res["episodes"] == 2 and res["mean_return"] > 0
    agent.close()


def test_atari_on_envpool_reports_whole_games():
    """An ALE id on EnvPool: the preset's preprocessing (84x84x4 uint8 channel-first,
    sign-clipped rewards, a life loss ends the training episode); the game score is the
    sum of the raw rewards over all lives, reported on the step where the game is over,
    and nowhere else."""
    pytest.importorskip("ale_py")
    env = make_vec("ALE/Breakout-v5", 2, vectorization="envpool")
    assert isinstance(env, EnvPoolAtari) and env.game_scores
    assert env.single_observation_space.shape == (4, 84, 84)
    assert env.single_observation_space.dtype == np.uint8 and env.single_action_space.n == 4
    cfg = env.pool.config
    for key in ("episodic_life", "reward_clip", "repeat_action_probability", "noop_max"):
        assert cfg[key] == ATARI_KWARGS[key], key
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    raw, lives_lost, games, reported = np.zeros(2), 0, [], []
    for _ in range(2500):
        _, r, te, tr, info = env.step(rng.integers(0, 4, 2))
        assert set(np.unique(r)) <= {0.0, 1.0}  # Breakout's rewards, clipped to their sign
        raw += info["reward"]
        lives_lost += int((te & (info["terminated"] == 0)).sum())
        for i in np.flatnonzero((info["terminated"] != 0) | tr):
            games.append(raw[i])
            raw[i] = 0.0
        if "game_score" in info:
            reported += [info["game_score"][i] for i in np.flatnonzero(info["_game_score"])]
    env.close()
    assert lives_lost > len(games) >= 3  # episodes end at each life, games at the last
    assert reported == games and max(games) > 0


def test_atari_evaluation_on_envpool_runs_ppokits_whole_games(tmp_path):
    """Training on EnvPool, evaluation on ppokit's own stack (whole games); the returns
    reported during training are game scores."""
    pytest.importorskip("ale_py")
    ev = make_vec("ALE/Breakout-v5", 1, vectorization="envpool", training=False)
    assert not isinstance(ev, EnvPoolVectorEnv) and ev.game_scores
    ev.close()
    agent = ppokit.train("ALE/Breakout-v5", total_steps=1024, run_dir=tmp_path / "r", seed=0,
                         vectorization="envpool", n_envs=2, n_steps=128, batch_size=128,
                         n_epochs=1, progress=False, tensorboard=False)
    assert agent.cfg.vectorization == "envpool"
    scores = [r["episode_return_mean"] for r in ppokit.io.read_metrics(tmp_path / "r")
              if r.get("episode_return_mean") is not None]
    assert scores and all(s >= 0 for s in scores)
    assert agent._trainer.collector.games  # the collector counts games, not single lives
    agent.close()
