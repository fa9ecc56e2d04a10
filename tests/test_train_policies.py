"""Policy heads against torch.distributions, Box actions clipped only for the env, and the
NumPy sampler and fast collector against the torch policy and the reference collector."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributions import Categorical, Normal

from ppokit import kernels
from ppokit.envs import make_vec
from ppokit.policies import NumpySampler, Policy, make_policy
from ppokit.rollout import Collector


def _obs(n=7, d=3):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(1))


def test_categorical_matches_torch_distributions():
    torch.manual_seed(0)
    pol = make_policy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4))
    assert isinstance(pol, Policy)
    obs = _obs()
    a, logp, v = pol.act(obs, torch.Generator().manual_seed(0))
    dist = Categorical(logits=pol.actor(obs))
    assert torch.allclose(logp, dist.log_prob(a), atol=1e-6)
    lp2, ent, v2 = pol.evaluate(obs, a)
    assert torch.allclose(lp2, logp, atol=1e-6) and torch.allclose(v2, v)
    assert torch.allclose(ent, dist.entropy(), atol=1e-6)
    assert torch.equal(pol.deterministic_action(obs), dist.probs.argmax(-1))


def test_gaussian_matches_torch_distributions_and_has_state_independent_std():
    torch.manual_seed(0)
    pol = make_policy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (2,)),
                      log_std_init=-0.5)
    obs = _obs()
    a, logp, _ = pol.act(obs, torch.Generator().manual_seed(0))
    dist = Normal(pol.actor(obs), pol.log_std.exp())
    assert torch.allclose(logp, dist.log_prob(a).sum(-1), atol=1e-5)
    lp2, ent, _ = pol.evaluate(obs, a)
    assert torch.allclose(lp2, logp, atol=1e-5)
    assert torch.allclose(ent, dist.entropy().sum(-1), atol=1e-5)
    assert torch.allclose(pol.deterministic_action(obs), pol.actor(obs))


def test_multicategorical_is_a_sum_of_independent_heads():
    torch.manual_seed(0)
    pol = make_policy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.MultiDiscrete([3, 2, 4]))
    obs = _obs()
    a, logp, _ = pol.act(obs, torch.Generator().manual_seed(0))
    assert a.shape == (7, 3)
    heads = torch.split(pol.actor(obs), [3, 2, 4], -1)
    want = sum(Categorical(logits=h).log_prob(a[:, i]) for i, h in enumerate(heads))
    went = sum(Categorical(logits=h).entropy() for h in heads)
    lp2, ent, _ = pol.evaluate(obs, a)
    assert torch.allclose(logp, want, atol=1e-6) and torch.allclose(lp2, want, atol=1e-6)
    assert torch.allclose(ent, went, atol=1e-6)


class RecordAction(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Box(-0.1, 0.1, (1,), np.float32)
    seen: list = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        RecordAction.seen.append(np.array(action))
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_env_gets_clipped_actions_while_logp_is_of_the_unclipped_sample():
    RecordAction.seen = []
    env = SyncVectorEnv([RecordAction], autoreset_mode=AutoresetMode.SAME_STEP)
    torch.manual_seed(0)
    pol = make_policy(env.single_observation_space, env.single_action_space,
                      log_std_init=1.0)  # std e ≫ the bound 0.1
    col = Collector(env, pol, generator=torch.Generator().manual_seed(0))
    col.reset(seed=0)
    ro = col.collect(20)
    sent = np.concatenate(RecordAction.seen)
    stored = ro.actions[:, 0, 0].numpy()
    assert np.abs(stored).max() > 0.1  # the stored sample is unclipped
    assert np.allclose(sent, np.clip(stored, -0.1, 0.1))
    lp, _, _ = pol.evaluate(ro.obs[:, 0], ro.actions[:, 0])
    assert torch.allclose(lp, ro.logp[:, 0], atol=1e-5)


def test_categorical_sampling_frequencies_and_zero_probability_actions():
    from ppokit.policies.mlp import _sample_categorical

    lp = torch.log(torch.tensor([[0.1, 0.6, 0.3, 0.0]])).expand(100_000, 4)
    a = _sample_categorical(lp, torch.Generator().manual_seed(0)).flatten()
    freq = torch.bincount(a, minlength=4) / a.numel()
    assert torch.allclose(freq, torch.tensor([0.1, 0.6, 0.3, 0.0]), atol=0.01)
    assert freq[3] == 0
    edge = torch.tensor([[0.0, -1e9, -1e9]]).log_softmax(-1).expand(10_000, 3)
    assert _sample_categorical(edge, None).unique().tolist() == [0]


# ---------------------------------------------------------------- the NumPy sampler (fast path)


_NATIVE = [False] + ([True] if kernels.available() else [])


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 16), k=st.integers(2, 6),
       activation=st.sampled_from(["tanh", "relu"]), gaussian=st.booleans(),
       native=st.sampled_from(_NATIVE), obs_dim=st.integers(1, 40),
       hidden=st.sampled_from([(64, 64), (16,), (5, 33), (20, 3, 17)]))
def test_numpy_sampler_matches_the_torch_policy(seed, n, k, activation, gaussian, native,
                                                obs_dim, hidden):
    """Same weights, observations and noise: the sampler (NumPy, or the C call where the
    kernels are built) picks the action the torch policy's inverse-CDF rule picks
    (categorical), or the same Gaussian sample."""
    torch.manual_seed(seed)
    act_space = gym.spaces.Box(-1, 1, (k,)) if gaussian else gym.spaces.Discrete(k)
    pol = make_policy(gym.spaces.Box(-1, 1, (obs_dim,)), act_space, activation=activation,
                      ortho_init=False, log_std_init=-0.3, hidden=hidden)
    g = torch.Generator().manual_seed(seed + 1)
    obs = torch.randn(n, obs_dim, generator=g) * 2
    sampler = NumpySampler(pol, native=native)
    assert sampler.native is native
    with torch.no_grad():
        out = pol.actor(obs)
        if gaussian:
            noise = torch.randn(n, k, generator=g)
            got = sampler(obs.numpy(), noise.numpy())
            want = out + pol.log_std.exp() * noise
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
            return
        u = torch.rand(n, 1, generator=g)
        got = sampler(obs.numpy(), u.numpy())
        cdf = out.log_softmax(-1).exp().cumsum(-1)
        want = (cdf < u * cdf[:, -1:]).sum(-1).numpy()
        # the two float32 CDFs may differ by rounding: only a u within that of a step may differ
        edge = (cdf - u * cdf[:, -1:]).abs().min(-1).values.numpy() < 1e-5
        assert np.all((got == want) | edge)
        assert got.dtype == np.int64 and np.all((got >= 0) & (got < k))


@pytest.mark.parametrize("native", _NATIVE)
def test_sampler_reads_the_current_weights(native):
    pol = make_policy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2))
    sampler = NumpySampler(pol, native=native)
    with torch.no_grad():
        pol.actor[-1].bias.copy_(torch.tensor([50.0, -50.0]))  # in place: no rebind needed
        pol.actor[0].weight.mul_(0.0)
    assert sampler(np.zeros((4, 3), np.float32), np.full((4, 1), 0.999, np.float32)).tolist() \
        == [0, 0, 0, 0]
    with torch.no_grad():
        pol.actor[-1].bias.copy_(torch.tensor([-50.0, 50.0]))
    out = np.full(4, -1, np.int64)
    got = sampler(np.ones((4, 3), np.float32), np.full((4, 1), 0.001, np.float32), out=out)
    assert got is out and out.tolist() == [1, 1, 1, 1]


@pytest.mark.skipif(not kernels.available(), reason="compiled kernels not built")
def test_native_sampler_checks_what_it_is_handed():
    """The C call reads only buffers of the sizes and dtypes the plan implies; anything
    else is an error naming the argument, not a read past an array."""
    pol = make_policy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4))
    s = NumpySampler(pol, native=True)
    obs, u = np.zeros((5, 3), np.float32), np.full((5, 1), 0.5, np.float32)
    assert s(obs, u).shape == (5,)
    # a transposed (Fortran-ordered) or float64 batch is copied to what the call reads
    assert s(np.asfortranarray(np.ones((5, 3))), u).tolist() == s(np.ones((5, 3), np.float32),
                                                                   u).tolist()
    with pytest.raises(ValueError, match="the noise must hold 5 float32"):
        s(obs, np.full((4, 1), 0.5, np.float32))
    with pytest.raises(ValueError, match="the noise must hold 5 float32"):
        s(obs, np.full((5, 1), 0.5))  # float64
    with pytest.raises(ValueError, match="the actions must hold 5 int64"):
        s(obs, u, out=np.zeros(5, np.int32))
    with pytest.raises(ValueError, match=r"observations of shape \(2, 5\), expected \(2, 3\)"):
        s(np.zeros((2, 5), np.float32), u[:2])
    with pytest.raises(ValueError, match="contiguous"):
        s(obs, u, out=np.zeros(10, np.int64)[::2])
    big = make_policy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(65))
    assert NumpySampler(big).native is False  # more actions than the C call takes
    with pytest.raises(ValueError, match="more than 64 actions"):
        NumpySampler(big, native=True)


def test_fast_and_reference_collectors_record_the_same_rollout():
    """CartPole, categorical: the uniforms drawn for a window equal the per-step draws, so
    both collectors take the same actions; log-probs and values agree to float rounding."""
    ros = {}
    for fast in (True, False):
        torch.manual_seed(0)
        pol = make_policy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
        col = Collector(make_vec("CartPole-v1", 4), pol,
                        generator=torch.Generator().manual_seed(5), fast=fast)
        col.reset(seed=3)
        ros[fast] = [col.collect(64) for _ in range(3)]
        assert (col._sampler is not None) is fast
    for a, b in zip(ros[True], ros[False]):
        assert torch.equal(a.actions, b.actions)
        assert torch.equal(a.obs, b.obs) and torch.equal(a.rewards, b.rewards)
        assert torch.equal(a.valid, b.valid) and torch.equal(a.episode_end, b.episode_end)
        for key in ("logp", "values", "next_values"):
            torch.testing.assert_close(getattr(a, key), getattr(b, key), rtol=1e-5, atol=1e-6)


def test_fast_collector_bootstraps_truncations_from_the_final_observation():
    """SAME_STEP (sync) env with truncations: next_values of a truncated step is V of the
    final observation, computed in the batched pass."""
    env = make_vec("Pendulum-v1", 2, vectorization="sync")  # truncates at 200 steps
    torch.manual_seed(0)
    pol = make_policy(env.single_observation_space, env.single_action_space)
    col = Collector(env, pol, generator=torch.Generator().manual_seed(0), fast=True)
    col.reset(seed=0)
    ro = col.collect(250)
    t = 199
    assert ro.episode_end[t].all() and not ro.terminated[t].any()
    # the next row starts a new episode: its values are not the bootstrap of row t
    assert not torch.allclose(ro.next_values[t], ro.values[t + 1])
    lp, _, v = pol.evaluate(ro.obs.reshape(-1, 3), ro.actions.reshape(-1, 1))
    torch.testing.assert_close(lp.reshape(250, 2), ro.logp)
    torch.testing.assert_close(v.reshape(250, 2), ro.values)
