"""ppokit's Adam against torch.optim.Adam(fused=True): same parameters after every step,
interchangeable state dicts."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppokit.algos.optim import Adam


def _params(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in ((5, 3), (3,), (7,))]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), lr=st.floats(1e-5, 1e-1), eps=st.sampled_from([1e-8, 1e-5]),
       beta1=st.sampled_from([0.9, 0.5]), steps=st.integers(1, 6),
       skip=st.booleans())
def test_steps_equal_torch_fused_adam(seed, lr, eps, beta1, steps, skip):
    ours, ref = _params(seed), _params(seed)
    opt = Adam(ours, lr=lr, betas=(beta1, 0.999), eps=eps)
    opt_ref = torch.optim.Adam(ref, lr=lr, betas=(beta1, 0.999), eps=eps, fused=True)
    g = torch.Generator().manual_seed(seed + 1)
    for k in range(steps):
        for p, q in zip(ours, ref):
            grad = torch.randn(p.shape, generator=g)
            p.grad, q.grad = grad.clone(), grad.clone()
        if skip and k == 1:  # a parameter without gradient is left alone, as torch does
            ours[2].grad = ref[2].grad = None
        opt.step()
        opt_ref.step()
        for p, q in zip(ours, ref):
            assert torch.equal(p, q)
    a, b = opt.state_dict(), opt_ref.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for i in a["state"]:
        for k in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(a["state"][i][k], b["state"][i][k]), k


def test_state_dicts_are_interchangeable_with_torch_optim():
    ours, ref = _params(0), _params(0)
    opt_ref = torch.optim.Adam(ref, lr=1e-3, eps=1e-5, fused=True)
    for p in ref:
        p.grad = torch.ones_like(p)
    opt_ref.step()
    with torch.no_grad():
        for p, q in zip(ours, ref):
            p.copy_(q)
    opt = Adam(ours, lr=0.5)
    opt.load_state_dict(opt_ref.state_dict())  # ours continues torch's run ...
    assert opt.param_groups[0]["lr"] == 1e-3 and opt.param_groups[0]["eps"] == 1e-5
    for p, q in zip(ours, ref):
        p.grad = q.grad = torch.full_like(p, 0.3)
    opt.step()
    opt_ref.step()
    assert all(torch.equal(p, q) for p, q in zip(ours, ref))
    back = torch.optim.Adam(_params(0), lr=1.0, fused=True)
    back.load_state_dict(opt.state_dict())  # ... and torch can continue ours
    assert back.state_dict()["param_groups"] == opt_ref.state_dict()["param_groups"]


def test_zero_grad_and_errors():
    ps = _params(0)
    opt = Adam(ps, lr=1e-3)
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.zero_grad(set_to_none=False)
    assert all(torch.count_nonzero(p.grad) == 0 for p in ps)
    opt.zero_grad()
    assert all(p.grad is None for p in ps)
    opt.step()  # nothing to do
    assert opt.state == {}
    with pytest.raises(ValueError, match="empty parameter list"):
        Adam([])
    with pytest.raises(ValueError, match="different number"):
        opt.load_state_dict(Adam(ps[:1]).state_dict())


def test_a_shared_step_counter_advances_once_per_step():
    """The fused trainer step shares one step tensor among all parameters' states."""
    ps = _params(0)
    opt = Adam(ps, lr=1e-3)
    shared = torch.zeros(())
    for p in ps:
        opt.state[p] = {"step": shared, "exp_avg": torch.zeros_like(p),
                        "exp_avg_sq": torch.zeros_like(p)}
        p.grad = torch.ones_like(p)
    opt.step()
    assert float(shared) == 1.0
