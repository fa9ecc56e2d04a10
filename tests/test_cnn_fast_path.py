"""The CNN's fast path (fast=true: channels-last convolutions, the [0, 1] scale folded into
the first convolution, uint8 pixels kept in rollouts) against the reference path on many
random inputs: equal outputs and gradients, equal rollouts."""

from __future__ import annotations

import copy

import numpy as np
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from _pixel_envs import ImageChoice
from ppokit.envs import make_vec
from ppokit.policies import make_policy
from ppokit.policies.encoders import NatureCNN
from ppokit.rollout import Collector


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 5), size=st.integers(36, 48), channels=st.integers(1, 4),
       last=st.booleans(), floats=st.booleans(), seed=st.integers(0, 10_000))
def test_fast_cnn_matches_reference(batch, size, channels, last, floats, seed):
    shape = (size, size, channels) if last else (channels, size, size)
    space = (spaces.Box(0.0, 1.0, shape, np.float32) if floats
             else spaces.Box(0, 255, shape, np.uint8))
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    ref = NatureCNN(space, (8, 16, 16), 32)
    ref.fast_layout = False
    fast = copy.deepcopy(ref)
    fast.fast_layout = True
    if floats:
        x = torch.rand((batch, *shape), generator=g)
    else:
        x = torch.randint(0, 256, (batch, *shape), generator=g, dtype=torch.uint8)
    w = torch.randn(batch, 32, generator=g)
    outs, grads = [], []
    for net in (ref, fast):
        out = net(x)
        (out * w).sum().backward()
        outs.append(out.detach())
        grads.append([p.grad.clone() for p in net.parameters()])
        assert all(p.grad.is_contiguous() for p in net.parameters())
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)
    for gf, gr in zip(grads[1], grads[0]):
        torch.testing.assert_close(gf, gr, rtol=1e-3, atol=1e-4)


def test_fast_rollouts_keep_uint8_pixels_and_match_the_reference():
    """The same policy weights and seeds: the fast collector stores uint8 pixels, the
    reference float32; observations, actions, log-probabilities and values agree."""
    outs = []
    torch.manual_seed(0)
    env0 = make_vec(lambda: ImageChoice(), 3, vectorization="sync")
    base = make_policy(env0.single_observation_space, env0.single_action_space,
                       policy="cnn", features_dim=64)
    env0.close()
    for fast in (False, True):
        pol = copy.deepcopy(base)
        pol.encoder.fast_layout = fast
        env = make_vec(lambda: ImageChoice(), 3, vectorization="sync")
        col = Collector(env, pol, generator=torch.Generator().manual_seed(1), fast=fast)
        col.reset(seed=4)
        outs.append(col.collect(40))
        env.close()
    ref, fast = outs
    assert ref.obs.dtype == torch.float32 and fast.obs.dtype == torch.uint8
    assert torch.equal(fast.obs.float(), ref.obs)
    assert torch.equal(fast.actions, ref.actions)
    torch.testing.assert_close(fast.logp, ref.logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.values, ref.values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.next_values, ref.next_values, rtol=1e-5, atol=1e-5)
