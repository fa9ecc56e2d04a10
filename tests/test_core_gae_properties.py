"""Property tests: every fast path against a plain reference on many random inputs."""

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from ppokit import core

unit = st.floats(0.0, 1.0, allow_nan=False)


def _direct_gae(r, v, nv, term, end, gamma, lam):
    """A_t = sum_k (gamma lam)^(k-t) delta_k, the product of carry masks in between."""
    n = len(r)
    delta = r + gamma * (1 - term) * nv - v
    out = np.zeros(n)
    for t in range(n):
        w = 1.0
        for k in range(t, n):
            out[t] += w * delta[k]
            w *= gamma * lam * (1 - end[k])
    return out


@st.composite
def env_batch(draw):
    t = draw(st.integers(1, 12))
    n = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    r, v, nv = rng.normal(size=(3, t, n))
    end = rng.random((t, n)) < draw(st.floats(0.0, 0.7))
    term = end & (rng.random((t, n)) < 0.5)
    return r, v, nv, term.astype(np.float64), end.astype(np.float64)


@given(env_batch(), unit, unit)
def test_gae_recursion_equals_direct_finite_sum(batch, gamma, lam):
    r, v, nv, term, end = batch
    adv, ret = core.gae(r, v, nv, term, end, gamma, lam)
    assert adv.dtype == torch.float64
    for j in range(r.shape[1]):
        want = _direct_gae(r[:, j], v[:, j], nv[:, j], term[:, j], end[:, j], gamma, lam)
        np.testing.assert_allclose(adv[:, j].numpy(), want, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ret.numpy(), adv.numpy() + v, atol=1e-12)


@given(env_batch(), unit, unit)
def test_gae_columns_are_independent_and_1d_matches(batch, gamma, lam):
    r, v, nv, term, end = batch
    adv, _ = core.gae(r, v, nv, term, end, gamma, lam)
    a0, _ = core.gae(r[:, 0], v[:, 0], nv[:, 0], term[:, 0], end[:, 0], gamma, lam)
    np.testing.assert_allclose(adv[:, 0].numpy(), a0.numpy(), atol=1e-12)


@given(env_batch(), unit)
def test_terminated_ignores_next_value(batch, gamma):
    r, v, nv, term, end = batch
    a1, _ = core.gae(r, v, nv, term, end, gamma, 0.9)
    nv2 = np.where(term > 0, nv + 1000.0, nv)
    a2, _ = core.gae(r, v, nv2, term, end, gamma, 0.9)
    np.testing.assert_allclose(a1.numpy(), a2.numpy(), atol=1e-9)


@st.composite
def token_batch(draw):
    b = draw(st.integers(1, 5))
    length = draw(st.integers(1, 70))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["random", "contiguous", "multiturn", "empty-rows"]))
    if kind == "random":
        mask = rng.random((b, length)) < draw(st.floats(0.0, 1.0))
    else:
        mask = np.zeros((b, length), dtype=bool)
        for i in range(b):
            if kind == "empty-rows" and rng.random() < 0.5:
                continue
            start = rng.integers(0, length)
            stop = rng.integers(start, length + 1)
            mask[i, start:stop] = True
            if kind == "multiturn" and stop - start > 4:  # a masked tool/user span inside
                a = rng.integers(start + 1, stop - 1)
                mask[i, a:rng.integers(a, stop)] = False
    r = rng.normal(size=(b, length))
    v = rng.normal(size=(b, length))
    return torch.tensor(r), torch.tensor(v), torch.tensor(mask), seed


@given(token_batch(), unit, unit, st.sampled_from([1, 3, 8, 32]))
def test_token_gae_equals_position_loop(batch, gamma, lam, chunk):
    r, v, m, _ = batch
    a, ret = core.token_gae(r, v, m, gamma, lam, chunk_size=chunk)
    ra, rret = core.token_gae_reference(r, v, m, gamma, lam)
    torch.testing.assert_close(a, ra, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ret, rret, rtol=1e-9, atol=1e-9)
    assert bool((a[~m] == 0).all()) and bool((ret[~m] == 0).all())


@given(token_batch(), unit, unit)
def test_token_gae_ignores_everything_at_masked_positions(batch, gamma, lam):
    r, v, m, seed = batch
    a, ret = core.token_gae(r, v, m, gamma, lam)
    g = torch.Generator().manual_seed(seed)
    junk_v = torch.where(m, v, torch.randn(v.shape, generator=g, dtype=v.dtype) * 1e3)
    junk_r = torch.where(m, r, torch.randn(r.shape, generator=g, dtype=r.dtype) * 1e3)
    junk_v = torch.where(m, junk_v, torch.full_like(v, float("nan")))  # even NaN padding
    a2, ret2 = core.token_gae(junk_r, junk_v, m, gamma, lam)
    torch.testing.assert_close(a, a2, rtol=0, atol=0)
    torch.testing.assert_close(ret, ret2, rtol=0, atol=0)


@given(token_batch(), unit, unit)
def test_token_gae_with_bootstrap_equals_loop(batch, gamma, lam):
    r, v, m, seed = batch
    boot = torch.randn(r.shape[0], generator=torch.Generator().manual_seed(seed),
                       dtype=r.dtype)
    a, _ = core.token_gae(r, v, m, gamma, lam, bootstrap_values=boot)
    ra, _ = core.token_gae_reference(r, v, m, gamma, lam, bootstrap_values=boot)
    torch.testing.assert_close(a, ra, rtol=1e-9, atol=1e-9)


@given(token_batch(), unit, unit)
def test_token_gae_contiguous_rows_match_env_gae(batch, gamma, lam):
    """A row's actions form one terminal episode: the environment GAE on the packed
    actions gives the same advantages."""
    r, v, m, _ = batch
    a, _ = core.token_gae(r, v, m, gamma, lam)
    for i in range(r.shape[0]):
        idx = torch.nonzero(m[i]).flatten()
        if len(idx) == 0:
            continue
        rr, vv = r[i, idx], v[i, idx]
        nv = torch.cat([vv[1:], torch.zeros(1, dtype=vv.dtype)])
        done = torch.zeros(len(idx))
        done[-1] = 1
        ea, _ = core.gae(rr, vv, nv, done, done, gamma, lam)
        torch.testing.assert_close(a[i, idx], ea, rtol=1e-9, atol=1e-9)


@given(st.integers(1, 300), unit, st.sampled_from([1, 2, 7, 32, 64]),
       st.integers(0, 2**31 - 1))
def test_discounted_reverse_cumsum_equals_loop(length, coef, chunk, seed):
    x = torch.randn(3, length, generator=torch.Generator().manual_seed(seed),
                    dtype=torch.float64)
    y = core.discounted_reverse_cumsum(x, coef, chunk)
    want = torch.zeros_like(x)
    carry = torch.zeros(3, dtype=torch.float64)
    for t in range(length - 1, -1, -1):
        carry = x[:, t] + coef * carry
        want[:, t] = carry
    torch.testing.assert_close(y, want, rtol=1e-9, atol=1e-9)


def test_token_gae_float32_long_sequences_close_to_loop():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(8, 4096, generator=g) * 0.1
    v = torch.randn(8, 4096, generator=g)
    m = torch.rand(8, 4096, generator=g) < 0.9
    a, _ = core.token_gae(r, v, m, 1.0, 0.95)
    ra, _ = core.token_gae_reference(r, v, m, 1.0, 0.95)
    assert float((a - ra).abs().max()) <= 1e-5


@given(env_batch(), unit)
def test_reward_to_go_is_gae_with_lambda_1_and_zero_values(batch, gamma):
    r, _, _, _, end = batch
    g = core.reward_to_go(r, gamma, end)
    z = np.zeros_like(r)
    adv, _ = core.gae(r, z, z, end, end, gamma, 1.0)
    np.testing.assert_allclose(g.numpy(), adv.numpy(), atol=1e-10)


def test_discounted_return_and_discount_weights():
    assert float(core.discounted_return([1.0, 1.0, 1.0], 0.5)) == 1.75
    w = core.discount_weights(0.5, [0, 0, 1, 0, 0])
    assert w.tolist() == [1.0, 0.5, 0.25, 1.0, 0.5]
    w = core.discount_weights(0.5, length=3)
    assert w.tolist() == [1.0, 0.5, 0.25]
    w = core.discount_weights(0.5, [[0, 0], [1, 0]], start_step=[0, 2])
    assert w.tolist() == [[1.0, 0.25], [0.5, 0.125]]
    g = core.reward_to_go([1.0, 2.0], 0.5, bootstrap=4.0)
    assert g.tolist() == [1.0 + 0.5 * (2.0 + 0.5 * 4.0), 2.0 + 0.5 * 4.0]
