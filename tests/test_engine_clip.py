"""The engine's gradient clipping (``engine.update.clip_grad_norm_``, multi-tensor kernels)
gives torch's ``clip_grad_norm_`` numbers bit for bit."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppokit.engine.update import clip_grad_norm_

shapes = st.lists(st.lists(st.integers(1, 7), min_size=0, max_size=3), min_size=1, max_size=12)


def _params(shape_list, scale, seed, with_none):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, shape in enumerate(shape_list):
        p = torch.nn.Parameter(torch.randn(shape, generator=g))
        if not (with_none and i % 3 == 1):
            p.grad = torch.randn(shape, generator=g) * scale
        out.append(p)
    return out


@settings(max_examples=150, deadline=None)
@given(shapes, st.floats(1e-3, 1e3), st.floats(1e-3, 50.0) | st.just(math.inf),
       st.integers(0, 2**31 - 1), st.booleans())
def test_clip_equals_torch(shape_list, scale, max_norm, seed, with_none):
    ours, ref = _params(shape_list, scale, seed, with_none), _params(shape_list, scale, seed,
                                                                      with_none)
    if all(p.grad is None for p in ours):
        assert float(clip_grad_norm_(ours, max_norm)) == 0.0
        return
    n_ours = clip_grad_norm_(ours, max_norm)
    n_ref = torch.nn.utils.clip_grad_norm_(ref, max_norm, foreach=False)
    assert torch.equal(n_ours, n_ref)
    for a, b in zip(ours, ref):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            assert torch.equal(a.grad, b.grad)
    total = math.sqrt(sum(float(p.grad.double().pow(2).sum())
                          for p in ours if p.grad is not None))
    # clipped to max_norm (torch adds 1e-6 to the norm it divides by)
    assert math.isclose(total, min(float(n_ref), max_norm), rel_tol=2e-3)


def test_non_finite_gradients_clip_as_torch():
    """A NaN or infinite gradient: every gradient as torch's clipping leaves it (the CPU path
    skips the multiplication only for a factor of exactly 1)."""
    for bad in (float("nan"), float("inf")):
        ours = _params([[3], [2, 2]], 1.0, 0, False)
        ref = _params([[3], [2, 2]], 1.0, 0, False)
        for ps in (ours, ref):
            ps[0].grad[1] = bad
        n_ours = clip_grad_norm_(ours, 1.0)
        n_ref = torch.nn.utils.clip_grad_norm_(ref, 1.0, foreach=False)
        assert torch.equal(n_ours, n_ref) or (n_ours.isnan() and n_ref.isnan())
        for a, b in zip(ours, ref):
            assert torch.equal(a.grad.isnan(), b.grad.isnan())
            assert torch.equal(a.grad.nan_to_num(), b.grad.nan_to_num())
