"""Collector truncation handling in both auto-reset modes, on hand-built envs.

The endless env pays reward 1 on every step and never terminates; a time limit of L steps
truncates it. With discount γ the true value of every state is 1/(1−γ). A critic that
already outputs exactly that value must see TD residuals of 0 everywhere — including at
the truncation step, which must bootstrap from V(final observation) — so every advantage
is 0. Treating the truncation as a termination would give that step δ = 1 − 1/(1−γ).
"""

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from ppokit.algos import Trainer, resolve_config
from ppokit.rollout import Collector

GAMMA = 0.9
V_TRUE = 1.0 / (1.0 - GAMMA)


class Endless(gym.Env):
    """Observation = [step counter of the episode]; reward 1; never terminates."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, terminate_at_limit: int | None = None):
        self.t = 0
        self.limit = terminate_at_limit

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        terminated = self.limit is not None and self.t >= self.limit
        return np.array([float(self.t)], np.float32), 1.0, terminated, False, {}


class ConstPolicy:
    """Value c everywhere, action 0, log-prob 0 (no learning; a probe of the collector)."""

    def __init__(self, c):
        self.c = c

    def value(self, obs):
        return torch.full((obs.shape[0],), float(self.c))

    def act(self, obs, generator=None):
        n = obs.shape[0]
        return torch.zeros(n, dtype=torch.int64), torch.zeros(n), self.value(obs)


def _env(mode, n=2, limit=5):
    fns = [lambda: gym.wrappers.TimeLimit(Endless(), limit) for _ in range(n)]
    env = SyncVectorEnv(fns, autoreset_mode=mode)
    return env


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP])
def test_exact_value_gives_zero_advantages(mode):
    env = _env(mode)
    col = Collector(env, ConstPolicy(V_TRUE))
    col.reset(seed=0)
    ro = col.collect(13)
    ro.compute_advantages(GAMMA, 0.95)
    valid = ro.valid
    assert torch.allclose(ro.advantages[valid], torch.zeros(()), atol=1e-4)
    assert torch.allclose(ro.returns[valid], torch.full((), V_TRUE), atol=1e-4)
    # truncations happened, and never as terminations of a real step
    real_end = ro.episode_end & valid
    assert int(real_end.sum()) >= 4
    assert not bool((ro.terminated & valid).any())


def test_next_step_mode_marks_the_dummy_step_invalid():
    env = _env(AutoresetMode.NEXT_STEP, n=1, limit=5)
    col = Collector(env, ConstPolicy(0.0))
    col.reset(seed=0)
    ro = col.collect(13)
    # steps 0-4 episode 1 (truncated after the 5th), step 5 dummy, 6-10 episode 2, 11 dummy
    expected_valid = [t not in (5, 11) for t in range(13)]
    assert ro.valid[:, 0].tolist() == expected_valid
    assert ro.episode_end[:, 0].nonzero().flatten().tolist() == [4, 5, 10, 11]
    assert ro.rewards[~ro.valid].abs().sum() == 0
    ro.compute_advantages(GAMMA, 1.0)
    flat = ro.flat()
    assert flat["obs"].shape[0] == 11  # dummy rows are never trained on
    # obs counter 0..4 are the valid observations of each episode, never the final 5
    assert sorted(set(flat["obs"][:, 0].tolist())) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [e[1] for e in col.pop_finished()] == [5, 5]


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP])
def test_hand_computed_advantages_with_constant_value(mode):
    """V ≡ c: δ = 1 + γc − c on every real step (truncations bootstrap from c);
    A_t = Σ_k (γλ)^k δ up to the episode's last step in the window, or the window end."""
    c, lam = 2.0, 0.5
    env = _env(mode, n=1, limit=4)
    col = Collector(env, ConstPolicy(c))
    col.reset(seed=0)
    T = 9
    ro = col.collect(T)
    ro.compute_advantages(GAMMA, lam)
    delta = 1 + GAMMA * c - c
    # episode steps (index within the episode) per row, None for dummies
    if mode == AutoresetMode.SAME_STEP:
        pos = [0, 1, 2, 3, 0, 1, 2, 3, 0]
    else:
        pos = [0, 1, 2, 3, None, 0, 1, 2, 3]
    for t, p in enumerate(pos):
        if p is None:
            assert not bool(ro.valid[t, 0])
            continue
        remaining = min(3 - p, T - 1 - t)  # steps after t that belong to the same episode
        want = sum((GAMMA * lam) ** k * delta for k in range(remaining + 1))
        assert float(ro.advantages[t, 0]) == pytest.approx(want, rel=1e-5), t


def _register():
    if "ppokit-test/Endless-v0" not in gym.registry:
        gym.register("ppokit-test/Endless-v0", entry_point=Endless, max_episode_steps=20)
        gym.register("ppokit-test/EndlessTerminating-v0",
                     entry_point=lambda: Endless(terminate_at_limit=20))


def _learned_value(env_id, mode, tmp_path):
    _register()
    cfg = resolve_config(overrides=dict(
        env_id=env_id, n_envs=4, n_steps=64, batch_size=128, n_epochs=10, gamma=GAMMA,
        gae_lambda=0.95, learning_rate=3e-3, total_timesteps=4 * 64 * 25, ent_coef=0.0,
        vectorization="sync", autoreset_mode=mode, tensorboard=False,
        checkpoint_every=1000, lr_schedule="constant", clip_schedule="constant"))
    tr = Trainer(cfg, tmp_path / env_id.replace("/", "_"), log=lambda m: None)
    tr.train()
    tr.close()
    with torch.no_grad():
        obs = torch.arange(0, 20, dtype=torch.float32)[:, None]
        return tr.policy.value(obs)


@pytest.mark.parametrize("mode", ["same_step", "next_step"])
def test_value_learns_one_over_one_minus_gamma_under_a_time_limit(mode, tmp_path):
    v = _learned_value("ppokit-test/Endless-v0", mode, tmp_path)
    assert torch.all((v - V_TRUE).abs() < 0.1 * V_TRUE), v


def test_value_fails_when_the_limit_is_a_termination(tmp_path):
    # The same env, but the time limit reported as a termination (the classic bug):
    # the values of late states collapse toward the remaining reward, far below 1/(1-γ).
    v = _learned_value("ppokit-test/EndlessTerminating-v0", "same_step", tmp_path)
    assert float(v[15:].mean()) < 0.7 * V_TRUE, v
