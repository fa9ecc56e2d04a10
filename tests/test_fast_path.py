"""The fused minibatch step against the eager (autograd) reference on random minibatches:
same parameters after several optimiser steps, same statistics, same early stop."""

import copy
import types

import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from ppokit.algos.config import TrainConfig
from ppokit.algos.fast import FusedMinibatchStep, supports
from ppokit.algos.trainer import Trainer
from ppokit.policies import make_policy


def _setup(kind, activation, seed, cfg):
    torch.manual_seed(seed)
    obs_space = spaces.Box(-1, 1, (5,))
    act_space = spaces.Discrete(3) if kind == "categorical" else spaces.Box(-1, 1, (2,))
    pol = make_policy(obs_space, act_space, hidden=(16, 16), activation=activation,
                      log_std_init=-0.5)
    pol_ref = copy.deepcopy(pol)
    # the trainer's optimiser: Adam with torch's fused kernel, which the fused step also runs
    opt = torch.optim.Adam(pol.parameters(), lr=cfg.learning_rate, eps=cfg.optimizer_eps,
                           fused=True)
    opt_ref = torch.optim.Adam(pol_ref.parameters(), lr=cfg.learning_rate,
                               eps=cfg.optimizer_eps, fused=True)
    eager = types.SimpleNamespace(policy=pol_ref, opt=opt_ref, cfg=cfg, kl_ctl=None)
    return pol, opt, pol_ref, eager


def _minibatch(kind, n, gen, policy):
    obs = torch.randn(n, 5, generator=gen)
    with torch.no_grad():
        if kind == "categorical":
            actions = torch.randint(0, 3, (n,), generator=gen)
        else:
            actions = torch.randn(n, 2, generator=gen)
        logp = policy.log_prob(obs, actions) + 0.3 * torch.randn(n, generator=gen)
    return {"obs": obs, "actions": actions, "logp": logp,
            "advantages": torch.randn(n, generator=gen) * 2,
            "returns": torch.randn(n, generator=gen),
            "values": torch.randn(n, generator=gen) * 0.1}


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["categorical", "gaussian"]),
       activation=st.sampled_from(["tanh", "relu"]),
       n=st.integers(1, 80), seed=st.integers(0, 10_000),
       policy_loss=st.sampled_from(["clip", "vanilla"]),
       clip=st.floats(0.05, 0.3),
       clip_range_vf=st.sampled_from([None, 0.1]),
       value_clip_mode=st.sampled_from(["max", "clipped"]),
       ent_coef=st.sampled_from([0.0, 0.01]),
       normalize_advantage=st.booleans(),
       max_grad_norm=st.sampled_from([None, 0.5]),
       script=st.booleans())
def test_fused_step_equals_eager_step(kind, activation, n, seed, policy_loss, clip,
                                      clip_range_vf, value_clip_mode, ent_coef,
                                      normalize_advantage, max_grad_norm, script):
    """Compiled (TorchScript) and as plain Python, the kernel matches the eager step."""
    cfg = TrainConfig(policy_loss=policy_loss, clip_range_vf=clip_range_vf,
                      value_clip_mode=value_clip_mode, ent_coef=ent_coef,
                      normalize_advantage=normalize_advantage, max_grad_norm=max_grad_norm,
                      learning_rate=3e-3, vf_coef=0.7, tensorboard=False)
    pol, opt, pol_ref, eager = _setup(kind, activation, seed, cfg)
    fused = FusedMinibatchStep(pol, opt, cfg, script=script)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        mb = _minibatch(kind, n, gen, pol_ref)
        want = Trainer.update_minibatch(eager, mb, clip)
        got = fused(mb, clip)
        assert set(got) == set(want)
        for key in want:
            torch.testing.assert_close(got[key].float(), want[key].float(), rtol=2e-4,
                                       atol=2e-5, msg=key)
        # Adam divides by (sqrt(v) + eps): for a parameter whose gradient is ~0, float
        # rounding of that gradient (up to ~1e-8 here) moves it by up to lr * 1e-8 / eps
        # (3e-3 * 1e-8 / 1e-5 = 3e-6)
        for (name, p), p_ref in zip(pol.named_parameters(), pol_ref.parameters()):
            torch.testing.assert_close(p, p_ref, rtol=1e-4, atol=3e-6, msg=name)


def test_fused_step_early_stop_matches_eager():
    cfg = TrainConfig(tensorboard=False)
    pol, opt, pol_ref, eager = _setup("categorical", "tanh", 0, cfg)
    fused = FusedMinibatchStep(pol, opt, cfg)
    mb = _minibatch("categorical", 32, torch.Generator().manual_seed(1), pol_ref)
    before = [p.clone() for p in pol.parameters()]
    assert Trainer.update_minibatch(eager, mb, 0.2, kl_limit=1e-6) is None
    assert fused(mb, 0.2, kl_limit=1e-6) is None
    assert all(torch.equal(a, b) for a, b in zip(before, pol.parameters()))


def test_supports_names_what_it_cannot_do():
    cfg = TrainConfig(tensorboard=False)
    pol = make_policy(spaces.Box(-1, 1, (3,)), spaces.MultiDiscrete([2, 3]))
    assert "multicategorical" in supports(pol, cfg)
    pol = make_policy(spaces.Discrete(4), spaces.Discrete(2))
    assert "one-hot" in supports(pol, cfg)
    pol = make_policy(spaces.Box(-1, 1, (3,)), spaces.Discrete(2))
    assert supports(pol, cfg) is None
    assert "kl_penalty" in supports(pol, TrainConfig(policy_loss="kl_penalty",
                                                     tensorboard=False))
    with pytest.raises(ValueError, match="does not support"):
        FusedMinibatchStep(pol, torch.optim.Adam(pol.parameters()),
                           TrainConfig(policy_loss="kl_penalty", tensorboard=False))


def test_fast_and_eager_training_runs_agree(tmp_path):
    """A few CartPole iterations with the fused step and with the eager step: the same
    trajectory of losses and returns (to float tolerance)."""
    from ppokit.algos import resolve_config

    recs = {}
    for fast in (True, False):
        cfg = resolve_config(overrides=dict(total_timesteps=256 * 6, tensorboard=False,
                                            fast=fast))
        tr = Trainer(cfg, tmp_path / f"fast{fast}", log=lambda m: None)
        step = tr._minibatch_step()
        assert isinstance(getattr(step, "__self__", None), FusedMinibatchStep) is fast
        recs[fast] = [tr.iterate() for _ in range(6)]
        tr.close()
    for a, b in zip(recs[True], recs[False]):
        for key in ("policy_loss", "value_loss", "approx_kl", "clipfrac", "grad_norm",
                    "explained_variance", "episode_return_mean"):
            if a[key] is None:
                assert b[key] is None
                continue
            assert abs(a[key] - b[key]) <= 1e-3 * max(1.0, abs(b[key])), key


def test_the_kernel_is_compiled_on_this_torch():
    """The fast path is the TorchScript kernel here, not the plain-Python fallback."""
    cfg = TrainConfig(tensorboard=False)
    pol = make_policy(spaces.Box(-1, 1, (3,)), spaces.Discrete(2))
    step = FusedMinibatchStep(pol, torch.optim.Adam(pol.parameters()), cfg)
    assert isinstance(step.kernel, torch.jit.ScriptFunction)
