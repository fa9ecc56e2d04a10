"""Recurrent (LSTM) policies: the state is reset exactly at episode ends in both auto-reset
modes, truncations bootstrap with the episode's own state, sequence minibatches equal the
step-by-step computation, predict with state replays the evaluation, resume is exact, and
the velocity-hidden task needs the memory (slow)."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ppokit
from ppokit.algos import Trainer, resolve_config
from ppokit.algos.evaluate import evaluate_run
from ppokit.engine import UpdateSpec, eager_minibatch_step
from ppokit.engine.fused import supports
from ppokit.engine.update import Forward
from ppokit.envs import HideVelocity, make_vec
from ppokit.errors import UsageError
from ppokit.io import read_metrics
from ppokit.policies import LSTMActorCritic
from ppokit.rollout import RecurrentCollector, recurrent_forward
from ppokit.rollout.recurrent import STATE_KEYS


class ClockEnv(gym.Env):
    """Observation 1 at the first step of an episode and 0 afterwards: the step count is
    known only to a policy that remembers since when it has seen zeros. Episodes end at
    random (termination) or at the time limit (truncation)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.ones(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 1.0, bool(self.np_random.random() < 0.15), False, {}


def clock_env():
    return gym.wrappers.TimeLimit(ClockEnv(), max_episode_steps=6)


def _policy(seed=0, **kw):
    torch.manual_seed(seed)
    kw = {"hidden": (8,), "lstm_hidden_size": 5, **kw}
    return LSTMActorCritic(1, "categorical", 2, **kw)


def _values_by_age(policy, ages: int) -> np.ndarray:
    """V after k zeros following the episode's first observation, from the zero state."""
    out, state = [], policy.initial_state(1)
    with torch.no_grad():
        for k in range(ages):
            obs = torch.tensor([[1.0 if k == 0 else 0.0]])
            out.append(float(policy.value(obs, state)))
            state = policy._step(policy.encode(obs), state)[2]
    return np.array(out)


@pytest.mark.parametrize("mode", ["same_step", "next_step"])
@pytest.mark.parametrize("kw", [{}, {"shared_lstm": True, "enable_critic_lstm": False}])
def test_state_is_reset_exactly_at_episode_ends(mode, kw):
    policy = _policy(**kw)
    env = make_vec(clock_env, 3, vectorization="sync", autoreset=mode)
    col = RecurrentCollector(env, policy, generator=torch.Generator().manual_seed(0))
    col.reset(seed=1)
    v_age = _values_by_age(policy, 12)
    age = np.zeros(3, int)
    n_trunc = n_dummy = 0
    for window in range(3):  # the state is carried across windows too
        r = col.collect(40)
        starts, end, valid = r.starts.numpy(), r.episode_end.numpy(), r.valid.numpy()
        term = r.terminated.numpy()
        if window == 0:
            assert starts[0].all()
        for t in range(40):
            age = np.where(starts[t], 0, age)
            # the value at each row is that of the episode's own history: V(age)
            np.testing.assert_allclose(r.values[t].numpy(), v_age[age], rtol=0, atol=1e-6)
            for s in r.states:  # the recorded state is zero exactly at episode starts
                zero = (s[t] == 0).flatten(1).all(1).numpy()
                assert (zero == starts[t]).all()
            if t + 1 < 40:
                if mode == "same_step":
                    assert (starts[t + 1] == end[t]).all()
                else:  # the reset comes one row after the dummy step, not at the end
                    assert (starts[t + 1] == ~valid[t]).all()
            trunc = end[t] & ~term[t]
            if mode == "same_step" and trunc.any():  # V(final obs) with the episode's state
                n_trunc += int(trunc.sum())
                np.testing.assert_allclose(r.next_values[t].numpy()[trunc],
                                           v_age[age[trunc] + 1], rtol=0, atol=1e-6)
            n_dummy += int((~valid[t]).sum())
            age = age + 1
    assert (n_trunc > 0) == (mode == "same_step") and (n_dummy > 0) == (mode == "next_step")
    env.close()


def test_sequence_batch_cuts_at_episode_starts():
    policy = _policy()
    env = make_vec(clock_env, 2, vectorization="sync", autoreset="next_step")
    col = RecurrentCollector(env, policy, generator=torch.Generator().manual_seed(3))
    col.reset(seed=0)
    col.collect(7)
    r = col.collect(30)
    r.compute_advantages(0.99, 0.95)
    data, mask = r.sequence_batch()
    env_i, t0, length = r.segments()
    assert length.sum() == 60 and int(mask.sum()) == int(r.valid.sum())
    for s in range(len(t0)):
        assert t0[s] == 0 or bool(r.starts[t0[s], env_i[s]])
        inner = r.starts[t0[s] + 1:t0[s] + length[s], env_i[s]]
        assert not bool(inner.any())  # no episode start inside a piece
        assert torch.equal(data["obs"][s, :length[s]], r.obs[t0[s]:t0[s] + length[s], env_i[s]])
        assert torch.equal(data[STATE_KEYS[0]][s], r.states[0][t0[s], env_i[s]])
        assert not mask[s, length[s]:].any()
    assert not bool(r.states[0][0].eq(0).all())  # the second window starts mid-episode
    env.close()


class _NoStep:
    """An optimiser that leaves the gradients where backward put them."""

    def zero_grad(self, set_to_none=True):
        pass

    def step(self):
        pass


def _stepwise_forward(policy):
    def forward(rows):
        state = tuple(rows[k].transpose(0, 1) for k in STATE_KEYS[:policy.n_state])
        return Forward(*policy.evaluate_steps(rows["obs"], rows["actions"], state))
    return forward


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), kind=st.sampled_from(["categorical", "gaussian"]),
       critic=st.sampled_from(["own", "shared", "none"]), layers=st.integers(1, 2),
       S=st.integers(1, 5), L=st.integers(1, 7), clip_vf=st.sampled_from([None, 0.3]))
def test_sequence_minibatch_equals_one_step_at_a_time(seed, kind, critic, layers, S, L,
                                                      clip_vf):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    policy = LSTMActorCritic(3, kind, 2, hidden=(6,), lstm_hidden_size=4,
                             n_lstm_layers=layers, shared_lstm=critic == "shared",
                             enable_critic_lstm=critic == "own")
    lengths = torch.randint(1, L + 1, (S,), generator=g)
    mask = (torch.arange(L)[None] < lengths[:, None]) & (torch.rand(S, L, generator=g) < 0.9)
    mask[:, 0] = True
    obs = torch.randn(S, L, 3, generator=g)
    actions = (torch.randint(0, 2, (S, L), generator=g) if kind == "categorical"
               else torch.randn(S, L, 2, generator=g))
    rows = {"obs": obs, "actions": actions,
            "logp": torch.randn(S, L, generator=g) * 0.3 - 1.0,
            "advantages": torch.randn(S, L, generator=g),
            "returns": torch.randn(S, L, generator=g),
            "values": torch.randn(S, L, generator=g), "mask": mask}
    for k in STATE_KEYS[:policy.n_state]:
        rows[k] = torch.randn(S, layers, 4, generator=g)
    spec = UpdateSpec(ent_coef=0.01, clip_range_vf=clip_vf, max_grad_norm=None,
                      agg="token-mean")
    params = list(policy.parameters())

    def run(forward, rows):
        for p in params:
            p.grad = None
        stats = eager_minibatch_step(spec, forward, _NoStep(), params, rows, clip_range=0.2)
        return stats, [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                       for p in params]

    ref_stats, ref_grads = run(_stepwise_forward(policy), rows)
    # padding (after a piece's end) holds anything: nothing of it counts; masked labels
    # inside a piece neither (its observations do: they lead to the later steps' states)
    pad = torch.arange(L)[None] >= lengths[:, None]
    junk = dict(rows)
    junk["obs"] = torch.where(pad[..., None], torch.randn(S, L, 3, generator=g) * 50, obs)
    for k in ("returns", "advantages", "logp", "values"):
        junk[k] = torch.where(mask, rows[k], torch.full((S, L), 1e6))
    for data in (rows, junk):
        stats, grads = run(recurrent_forward(policy), data)
        for k, v in ref_stats.items():
            torch.testing.assert_close(stats[k], v, rtol=1e-5, atol=1e-6, equal_nan=True,
                                       msg=k)
        for a, b in zip(grads, ref_grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


CFG = dict(env_id="ppokit/CartPoleNoVel-v1", n_envs=4, n_steps=16, batch_size=32,
           n_epochs=2, total_timesteps=64 * 6, tensorboard=False, checkpoint_every=3, seed=5,
           lstm_hidden_size=16, net_arch=(16,))


def test_fused_step_declines_and_the_eager_step_runs_recurrent_policies(tmp_path):
    cfg = resolve_config(overrides=dict(CFG, total_timesteps=64))
    msgs = []
    tr = Trainer(cfg, tmp_path / "r", log=msgs.append)
    assert cfg.recurrent == "lstm" and isinstance(tr.policy, LSTMActorCritic)
    assert "recurrent" in supports(tr.spec, tr.policy)
    assert any("eager step" in m for m in msgs)
    tr.train()
    tr.close()
    rec = read_metrics(tmp_path / "r")[-1]
    assert rec["n_updates"] == 2 * 2 and np.isfinite(rec["policy_loss"])


@pytest.mark.parametrize("mode", ["same_step", "next_step"])
def test_resume_is_exact_for_a_recurrent_policy(tmp_path, mode):
    cfg = resolve_config(overrides=dict(CFG, autoreset_mode=mode))
    full = Trainer(cfg, tmp_path / "full", log=lambda m: None)
    full.train()
    full.close()
    part = Trainer(cfg, tmp_path / "part", log=lambda m: None)
    for _ in range(4):  # one iteration past the checkpoint, then "crash"
        part.iterate()
    part.metrics.close()
    part.close()
    msgs = []
    resumed = Trainer(cfg, tmp_path / "part", resume=True, log=msgs.append)
    assert resumed.iteration == 3 and "environment state restored" in msgs[-1]
    resumed.train()
    resumed.close()

    def strip(recs):
        return [{k: v for k, v in r.items() if k not in ("sps", "time")} for r in recs]

    assert strip(read_metrics(tmp_path / "part")) == strip(read_metrics(tmp_path / "full"))
    a = evaluate_run(tmp_path / "part", episodes=3)
    b = evaluate_run(tmp_path / "full", episodes=3)
    assert a["returns"] == b["returns"]


def test_predict_with_state_replays_the_evaluation(tmp_path):
    agent = ppokit.train("ppokit/CartPoleNoVel-v1", total_steps=64 * 3, seed=2,
                         run_dir=tmp_path / "r", progress=False,
                         **{k: v for k, v in CFG.items()
                            if k not in ("env_id", "total_timesteps", "seed")})
    res = agent.evaluate(episodes=3, seed=100)
    for k in range(3):
        env = gym.make("ppokit/CartPoleNoVel-v1")
        obs, _ = env.reset(seed=100 + k)
        state, start, total, done = None, True, 0.0, False
        while not done:
            action, state = agent.predict(obs, state, episode_start=start)
            start = False
            obs, r, te, tr, _ = env.step(action)
            total += r
            done = te or tr
        assert total == res["returns"][k]
        env.close()
    # batched, with a reset in the middle: a row with episode_start starts from zero
    obs = np.array([[0.01, 0.02], [0.03, -0.01]], np.float32)
    _, s1 = agent.predict(obs, None, np.array([True, True]))
    a2, s2 = agent.predict(obs, s1, np.array([False, True]))
    a0, s0 = agent.predict(obs, None, np.array([True, True]))
    np.testing.assert_array_equal(s2[0][:, 1], s0[0][:, 1])
    assert not np.array_equal(s2[0][:, 0], s0[0][:, 0])
    with pytest.raises(UsageError, match="state: expected"):
        agent.predict(obs, (s1[0],))
    with pytest.raises(UsageError, match="episode_start: expected 2 bool"):
        agent.predict(obs, s1, episode_start=[1, 0])


def test_config_keys_and_their_errors():
    with pytest.raises(UsageError, match="recurrent: expected one of none, lstm"):
        resolve_config(overrides={"recurrent": "gru"})
    with pytest.raises(UsageError, match="shared_lstm"):
        resolve_config(overrides={"recurrent": "lstm", "shared_lstm": True})
    with pytest.raises(UsageError, match="memory is recurrent = lstm"):
        resolve_config(overrides={"policy": "lstm"})
    with pytest.raises(UsageError, match="lstm_hidden_size"):
        resolve_config(overrides={"lstm_hidden_size": 0})
    c = resolve_config(overrides={"recurrent": "lstm"})
    # sb3-contrib's RecurrentPPO defaults
    assert (c.lstm_hidden_size, c.n_lstm_layers, c.shared_lstm, c.enable_critic_lstm) == \
        (256, 1, False, True)
    assert resolve_config(env_id="ppokit/CartPoleNoVel-v1").recurrent == "lstm"
    assert dataclasses.replace(c, recurrent="none").recurrent == "none"


def test_cartpole_novel_preset_is_the_zoos_recurrentppo_entry():
    """The RL-zoo's RecurrentPPO values for CartPoleNoVel-v1 (hyperparams/ppo_lstm.yml),
    its `normalize: True` included: observations and rewards (without the reward
    normalisation the final policy often landed in a late swing: docs/benchmarks.md)."""
    from bench._sb3_contrib_worker import settings as sb3_settings

    c = resolve_config(env_id="ppokit/CartPoleNoVel-v1")
    assert (c.normalize_obs, c.normalize_reward) == (True, True)
    assert (c.n_envs, c.n_steps, c.batch_size, c.n_epochs, c.gamma, c.gae_lambda,
            c.learning_rate, c.lr_schedule, c.clip_range, c.clip_schedule, c.ent_coef) == \
        (8, 32, 256, 20, 0.98, 0.8, 1e-3, "linear", 0.2, "linear", 0.0)
    assert (c.recurrent, c.lstm_hidden_size, tuple(c.net_arch), c.activation,
            c.ortho_init) == ("lstm", 64, (64,), "relu", False)
    sb3 = sb3_settings("ppokit/CartPoleNoVel-v1")  # the speed bench's sb3-contrib side
    assert sb3["n_envs"] == c.n_envs and sb3["norm_reward"] is True


def test_velocity_hiding_wrappers():
    env = gym.make("ppokit/CartPoleNoVel-v1")
    obs, _ = env.reset(seed=0)
    full = np.asarray(env.unwrapped.state, np.float32)
    assert obs.shape == (2,) and np.allclose(obs, full[[0, 2]])
    obs, *_ = env.step(1)
    assert np.allclose(obs, np.asarray(env.unwrapped.state, np.float32)[[0, 2]])
    assert env.spec.max_episode_steps == 500
    env.close()
    env = gym.make("ppokit/PendulumNoVel-v1")
    obs, _ = env.reset(seed=0)
    th = env.unwrapped.state[0]
    assert obs.shape == (2,) and np.allclose(obs, [np.cos(th), np.sin(th)], atol=1e-6)
    assert env.spec.max_episode_steps == 200
    env.close()
    with pytest.raises(ValueError, match="keep: expected indices in"):
        HideVelocity(gym.make("CartPole-v1"), keep=(0, 4))
    with pytest.raises(ValueError, match="flat Box observation"):
        HideVelocity(gym.make("FrozenLake-v1"), keep=(0,))


@pytest.mark.slow
def test_hidden_velocity_cartpole_needs_memory(tmp_path):
    """The LSTM preset solves CartPole without velocities; the same settings with an MLP
    policy stay far below (one seed each, 200k steps)."""
    out = {}
    for name, rec in (("lstm", "lstm"), ("mlp", "none")):
        cfg = resolve_config(env_id="ppokit/CartPoleNoVel-v1",
                             overrides={"recurrent": rec, "total_timesteps": 200_000,
                                        "tensorboard": False, "seed": 0})
        tr = Trainer(cfg, tmp_path / name, log=lambda m: None)
        tr.train()
        tr.close()
        out[name] = evaluate_run(tmp_path / name, episodes=10)["mean_return"]
    assert out["lstm"] >= 450, out
    assert out["mlp"] <= 200, out
