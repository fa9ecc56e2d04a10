"""The environment GAE's fast path (a chunked scan in NumPy) against the plain loop over
time steps, on many random inputs: shapes [T] and [T, N], lengths around the chunk size,
episodes ending by termination or truncation anywhere, float32 and float64."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppokit.core import gae
from ppokit.core.advantage import _reverse_scan_loop, _reverse_scan_time, gae_reference


@st.composite
def env_batches(draw):
    t = draw(st.sampled_from([1, 2, 7, 15, 16, 17, 31, 33, 64, 100]))
    n = draw(st.sampled_from([0, 1, 3, 8]))  # 0: the [T] layout
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 10**6)))
    shape = (t,) if n == 0 else (t, n)
    scale = draw(st.sampled_from([1e-3, 1.0, 100.0]))
    r = (torch.randn(shape, generator=g) * scale).to(dtype)
    v = (torch.randn(shape, generator=g) * scale).to(dtype)
    nv = (torch.randn(shape, generator=g) * scale).to(dtype)
    p_end = draw(st.sampled_from([0.0, 0.05, 0.5, 1.0]))
    end = torch.rand(shape, generator=g) < p_end
    term = end & (torch.rand(shape, generator=g) < draw(st.sampled_from([0.0, 0.5, 1.0])))
    gamma = draw(st.sampled_from([0.0, 0.5, 0.99, 1.0]))
    lam = draw(st.sampled_from([0.0, 0.8, 0.95, 1.0]))
    return r, v, nv, term, end, gamma, lam


@settings(max_examples=200, deadline=None)
@given(env_batches())
def test_fast_gae_equals_the_loop(batch):
    r, v, nv, term, end, gamma, lam = batch
    adv, ret = gae(r, v, nv, term, end, gamma, lam)
    adv_ref, ret_ref = gae_reference(r, v, nv, term, end, gamma, lam)
    assert adv.shape == r.shape and adv.dtype == r.dtype
    tol = dict(rtol=1e-5, atol=1e-5 * float(r.abs().max() + v.abs().max() + 1)) \
        if r.dtype == torch.float32 else dict(rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(adv, adv_ref, **tol)
    torch.testing.assert_close(ret, ret_ref, **tol)
    # an episode end stops the carry exactly: the step's advantage is its own residual
    delta = r + gamma * (~term).to(r.dtype) * nv - v
    torch.testing.assert_close(adv[end], delta[end], **tol)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 70), st.integers(1, 5), st.integers(1, 40), st.integers(0, 10**6))
def test_the_scan_for_any_chunk_size(length, width, chunk, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(length, width, generator=g, dtype=torch.float64)
    a = torch.rand(length, width, generator=g, dtype=torch.float64) * \
        (torch.rand(length, width, generator=g) < 0.9)
    torch.testing.assert_close(_reverse_scan_time(x, a, chunk), _reverse_scan_loop(x, a),
                               rtol=1e-12, atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.sampled_from([torch.float16, torch.float32, torch.float64]),
       st.sampled_from([0.0, 1.0, 1e30, 6e4]), st.lists(st.sampled_from(
           [float("nan"), float("inf"), -float("inf")]), max_size=3), st.integers(0, 10**6))
def test_the_finite_check_by_its_sum_misses_nothing(n, dtype, scale, bad, seed):
    """A finite sum proves the entries finite; a sum that overflows falls back to the
    element-wise test, so large finite values pass and every NaN or inf is caught."""
    import pytest

    from ppokit.core.validation import NonFiniteError, check_finite

    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, generator=g, dtype=torch.float64) * scale).to(dtype)
    x[~torch.isfinite(x)] = 0  # (a scale beyond the dtype's range)
    for i, b in enumerate(bad):
        x[(seed + 7 * i) % n] = b
    if bool(torch.isfinite(x).all()):
        check_finite(x, "x")
    else:
        with pytest.raises(NonFiniteError, match="x: expected finite values"):
            check_finite(x, "x")
