"""GSPO and CISPO against per-row references written from their definitions, on random
inputs: masks with empty rows, ratios far outside the clip range, equal advantages."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ppokit import core
from ppokit.core.surrogates import cispo_loss, gspo_loss


@st.composite
def batches(draw):
    b = draw(st.integers(1, 5))
    length = draw(st.integers(1, 6))
    rows = st.lists(st.booleans(), min_size=length, max_size=length)
    mask = torch.tensor(draw(st.lists(rows, min_size=b, max_size=b)))
    if not bool(mask.any()):
        mask[0, 0] = True
    shift = draw(st.sampled_from([0.0, 0.01, 0.3, 2.0]))  # ratios near 1 or far outside
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    logp_old = -torch.rand(b, length, generator=g, dtype=torch.float64) * 3
    logp = logp_old + shift * torch.randn(b, length, generator=g, dtype=torch.float64)
    seq_adv = torch.randn(b, generator=g, dtype=torch.float64)
    if draw(st.booleans()):
        seq_adv = seq_adv.round()  # ties and zeros
    per_token = draw(st.booleans())
    adv = (torch.randn(b, length, generator=g, dtype=torch.float64) if per_token
           else seq_adv[:, None].expand(b, length).clone())
    eps = draw(st.sampled_from([(3e-4, 4e-4), (0.2, 0.28), (0.05, None)]))
    return logp, logp_old, adv, mask, eps


def _clip(x, lo, hi):
    return min(max(x, lo), hi)


def _gspo_reference(logp, logp_old, adv, mask, eps_low, eps_high, token_level):
    """Row by row, token by token, from the definition."""
    eps_high = eps_low if eps_high is None else eps_high
    total, count = 0.0, 0
    for i in range(logp.shape[0]):
        idx = [t for t in range(logp.shape[1]) if bool(mask[i, t])]
        if not idx:
            continue
        count += 1
        s = torch.exp(sum(logp[i, t] - logp_old[i, t] for t in idx) / len(idx))
        if token_level:
            for t in idx:
                r = s.detach() * torch.exp(logp[i, t] - logp[i, t].detach())
                a = adv[i, t]
                total = total - torch.minimum(r * a, r.clamp(1 - eps_low, 1 + eps_high) * a) \
                    / len(idx)
        else:
            a = sum(adv[i, t] for t in idx) / len(idx)
            total = total - torch.minimum(s * a, s.clamp(1 - eps_low, 1 + eps_high) * a)
    return total / count


@pytest.mark.parametrize("token_level", [False, True])
@given(case=batches())
def test_gspo_matches_its_per_row_reference(case, token_level):
    logp, logp_old, adv, mask, (lo, hi) = case
    x = logp.clone().requires_grad_(True)
    out = gspo_loss(x, logp_old, adv, mask, clip_eps=lo, clip_eps_high=hi,
                    token_level=token_level)
    out.loss.backward()
    y = logp.clone().requires_grad_(True)
    ref = _gspo_reference(y, logp_old, adv, mask, lo, hi, token_level)
    ref.backward()
    assert math.isclose(float(out.loss.detach()), float(ref.detach()), rel_tol=1e-9, abs_tol=1e-12)
    assert torch.allclose(x.grad, y.grad, atol=1e-12)
    assert bool((x.grad[~mask] == 0).all())  # masked tokens never receive a gradient


@given(case=batches())
def test_gspo_token_with_a_sequence_advantage_is_gspo(case):
    logp, logp_old, adv, mask, (lo, hi) = case
    seq = torch.where(mask, adv, 0.0).sum(1) / mask.sum(1).clamp(min=1)
    adv = seq[:, None].expand_as(adv).clone()
    grads = []
    for token_level in (False, True):
        x = logp.clone().requires_grad_(True)
        out = gspo_loss(x, logp_old, adv, mask, clip_eps=lo, clip_eps_high=hi,
                        token_level=token_level)
        out.loss.backward()
        grads.append((float(out.loss.detach()), x.grad))
    assert math.isclose(grads[0][0], grads[1][0], rel_tol=1e-9, abs_tol=1e-12)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-12)


@given(case=batches())
def test_cispo_matches_its_per_token_reference(case):
    logp, logp_old, adv, mask, (_, hi) = case
    hi = 0.28 if hi is None else hi
    for lo in (None, 0.2):
        x = logp.clone().requires_grad_(True)
        out = cispo_loss(x, logp_old, adv, mask, clip_eps=lo, clip_eps_high=hi)
        out.loss.backward()
        y = logp.clone().requires_grad_(True)
        total, n = 0.0, 0
        for i in range(logp.shape[0]):
            for t in range(logp.shape[1]):
                if bool(mask[i, t]):
                    w = _clip(math.exp(float(logp[i, t] - logp_old[i, t])),
                              0.0 if lo is None else 1 - lo, 1 + hi)
                    total = total - w * adv[i, t] * y[i, t]
                    n += 1
        ref = total / n
        ref.backward()
        assert math.isclose(float(out.loss.detach()), float(ref.detach()), rel_tol=1e-9,
                            abs_tol=1e-12)
        assert torch.allclose(x.grad, y.grad, atol=1e-12)
        # every valid token with a non-zero advantage keeps a gradient, clipped or not
        live = mask & (adv != 0)
        assert bool((x.grad[live] != 0).all())
        assert float(out.stats["clip_active_frac"]) == 0.0


def test_the_registry_reads_the_clip_range_from_the_spec():
    from ppokit.engine import UpdateSpec

    logp_old = torch.log(torch.full((2, 3), 0.5))
    logp = logp_old + torch.tensor([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0]])
    adv = torch.ones(2, 3)
    spec = UpdateSpec(policy_loss="gspo", clip_range=0.1, clip_range_high=0.2)
    out = core.POLICY_LOSSES.get("gspo")(spec, logp, logp_old, adv, None)
    # row 0's sequence ratio e^0.5 is clipped at 1.2, row 1's is 1
    assert math.isclose(float(out.loss), -(1.2 + 1.0) / 2, rel_tol=1e-6)
    spec = UpdateSpec(policy_loss="cispo", clip_range=0.1, clip_range_high=0.2)
    x = logp.clone().requires_grad_(True)
    core.POLICY_LOSSES.get("cispo")(spec, x, logp_old, adv, None).loss.backward()
    assert torch.allclose(x.grad[0], torch.full((3,), -1.2 / 6))  # the capped weight
    assert torch.allclose(x.grad[1], torch.full((3,), -1.0 / 6))
