"""Policy heads against torch.distributions, and Box actions clipped only for the env."""

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from torch.distributions import Categorical, Normal

from ppokit.policies import Policy, make_policy
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
