"""The recurrent update's LSTM in C (``ppokit.kernels.lstm``) against ``nn.LSTM``: outputs
and every gradient on random shapes, weights and states; where the policy uses it; and
what it declines."""

import gymnasium as gym
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from ppokit import kernels
from ppokit.kernels import lstm as native_lstm
from ppokit.policies.recurrent import make_recurrent_policy

needs_native = pytest.mark.skipif(not kernels.available(),
                                  reason=f"compiled kernels unavailable: {kernels.why_not()}")


@needs_native
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), S=st.integers(1, 9), L=st.integers(1, 12),
       F=st.integers(1, 20), H=st.integers(1, 40), scale=st.sampled_from([0.3, 1.0, 4.0]),
       grad_in=st.booleans())
def test_native_lstm_matches_torch(seed, S, L, F, H, scale, grad_in):
    """The same outputs and gradients (input, initial state, all four parameters) as
    ``nn.LSTM`` from the same weights, to float32 rounding (its sigmoid and tanh come from
    a polynomial e^x), for saturated gates too (inputs scaled by 4)."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    m = nn.LSTM(F, H, batch_first=True)
    x = (torch.randn(S, L, F, generator=g) * scale).requires_grad_(grad_in)
    h0 = torch.randn(1, S, H, generator=g).requires_grad_(grad_in)
    c0 = torch.randn(1, S, H, generator=g).requires_grad_(grad_in)
    dy = torch.randn(S, L, H, generator=g)
    assert native_lstm.supports(m, x, h0)
    wrt = [*m.parameters()] + ([x, h0, c0] if grad_in else [])
    want_y = m(x, (h0, c0))[0]
    want = torch.autograd.grad((want_y * dy).sum(), wrt)
    got_y = native_lstm.lstm(m, x, h0, c0)
    got = torch.autograd.grad((got_y * dy).sum(), wrt)
    torch.testing.assert_close(got_y, want_y, rtol=1e-5, atol=2e-6)
    for a, b in zip(got, want):
        # gradients sum over S x L positions: their rounding grows with the count
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-6 * S * L)


@needs_native
def test_the_update_runs_the_native_lstm_and_matches_the_step_by_step_reference():
    """``evaluate_sequences`` (the update) runs the C LSTM for the preset's policy and
    agrees with the single-step path the rollout uses (``evaluate_steps``, nn.LSTM), as
    does its gradient with nn.LSTM's."""
    torch.manual_seed(0)
    pol = make_recurrent_policy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2),
                                lstm_hidden_size=16, hidden=(8,))
    S, L = 4, 7
    obs = torch.randn(S, L, 3)
    act = torch.randint(0, 2, (S, L))
    state = tuple(torch.randn(1, S, 16) for _ in range(pol.n_state))
    calls = []
    orig = native_lstm.lstm

    def spy(*a):
        calls.append(1)
        return orig(*a)

    native_lstm.lstm, saved = spy, native_lstm.lstm
    try:
        lp, ent, v = pol.evaluate_sequences(obs, act, state)
    finally:
        native_lstm.lstm = saved
    assert len(calls) == 2  # the actor's and the critic's LSTM
    lp2, ent2, v2 = pol.evaluate_steps(obs, act, state)
    for a, b in ((lp, lp2), (ent, ent2), (v, v2)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    grads = {}
    for native in (True, False):
        pol.zero_grad()
        pol.native_lstm = native
        lp, _, v = pol.evaluate_sequences(obs, act, state)
        (lp.sum() + v.square().sum()).backward()
        grads[native] = [p.grad.clone() for p in pol.parameters()]
    del pol.native_lstm
    for a, b in zip(grads[True], grads[False]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_what_the_native_lstm_declines():
    """Two layers, a second direction, a projection, another dtype, or time-major input
    stay with nn.LSTM."""
    x, h = torch.randn(2, 3, 4), torch.zeros(1, 2, 5)
    for m in (nn.LSTM(4, 5, 2, batch_first=True), nn.LSTM(4, 5, batch_first=True,
                                                          bidirectional=True),
              nn.LSTM(4, 5, batch_first=True, proj_size=2), nn.LSTM(4, 5),
              nn.LSTM(4, 5, batch_first=True).double()):
        assert not native_lstm.supports(m, x.to(next(m.parameters()).dtype), h)
    if kernels.available():
        m = nn.LSTM(4, 5, batch_first=True)
        assert native_lstm.supports(m, x, h)
        with pytest.raises(ValueError, match="input of 3 features, the module takes 4"):
            native_lstm.lstm(m, torch.randn(2, 3, 3), h, h)
        with pytest.raises(ValueError, match="a state of 3 rows for 2 sequences"):
            native_lstm.lstm(m, x, torch.zeros(1, 3, 5), torch.zeros(1, 3, 5))
