"""Losses: gradients, clip fractions, aggregation modes, KL estimators, named terms."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ppokit import core

f64 = torch.float64


@st.composite
def policy_batch(draw):
    n = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(n, generator=g, dtype=f64) * 3
    logp = logp_old + torch.randn(n, generator=g, dtype=f64) * 0.4
    adv = torch.randn(n, generator=g, dtype=f64)
    return logp, logp_old, adv


def _kink_distance(logp, logp_old, lo, hi, dual=None):
    r = torch.exp(logp - logp_old)
    d = torch.minimum((r - (1 - lo)).abs(), (r - (1 + hi)).abs())
    if dual is not None:
        d = torch.minimum(d, (r - dual).abs())
    return d


@given(policy_batch(), st.floats(0.05, 0.4), st.floats(0.05, 0.4),
       st.sampled_from([None, 2.0, 3.0]))
def test_surrogate_gradient_matches_finite_differences(batch, eps_lo, eps_hi, dual):
    logp, logp_old, adv = batch
    keep = _kink_distance(logp, logp_old, eps_lo, eps_hi, dual) > 1e-4
    logp = logp.clone().requires_grad_()
    out = core.clipped_surrogate_loss(logp, logp_old, adv, clip_eps=eps_lo,
                                      clip_eps_high=eps_hi, dual_clip=dual)
    (grad,) = torch.autograd.grad(out.loss, logp)
    h = 1e-7
    for i in torch.nonzero(keep).flatten().tolist()[:8]:
        e = torch.zeros_like(logp)
        e[i] = h
        up = core.clipped_surrogate_loss(logp.detach() + e, logp_old, adv, clip_eps=eps_lo,
                                         clip_eps_high=eps_hi, dual_clip=dual).loss
        dn = core.clipped_surrogate_loss(logp.detach() - e, logp_old, adv, clip_eps=eps_lo,
                                         clip_eps_high=eps_hi, dual_clip=dual).loss
        fd = float((up - dn) / (2 * h))
        assert math.isclose(float(grad[i]), fd, rel_tol=1e-5, abs_tol=1e-8)


@given(policy_batch(), st.floats(0.05, 0.4), st.floats(0.05, 0.4),
       st.sampled_from([None, 2.0]))
def test_gradient_is_zero_exactly_on_clip_active_samples(batch, eps_lo, eps_hi, dual):
    logp, logp_old, adv = batch
    adv = torch.where(adv == 0, torch.ones_like(adv), adv)
    logp = logp.clone().requires_grad_()
    out = core.clipped_surrogate_loss(logp, logp_old, adv, clip_eps=eps_lo,
                                      clip_eps_high=eps_hi, dual_clip=dual, agg="token-mean")
    (grad,) = torch.autograd.grad(out.per_sample.sum(), logp)
    r = torch.exp(logp.detach() - logp_old)
    active = ((adv > 0) & (r > 1 + eps_hi)) | ((adv < 0) & (r < 1 - eps_lo))
    if dual is not None:
        active |= (adv < 0) & (r > dual)
    assert bool((grad[active] == 0).all())
    assert bool((grad[~active] != 0).all())
    assert math.isclose(float(out.stats["clip_active_frac"]), float(active.double().mean()))
    outside = (r > 1 + eps_hi) | (r < 1 - eps_lo)
    assert math.isclose(float(out.stats["clipfrac"]), float(outside.double().mean()))
    # a sample with a zero gradient is always outside the range
    assert bool((active <= outside).all())


def test_clipfrac_and_clip_active_frac_differ():
    # two samples outside the range in the "wrong" direction still have gradients
    logp_old = torch.zeros(4, dtype=f64)
    logp = torch.log(torch.tensor([1.5, 0.5, 1.5, 0.5], dtype=f64))
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=f64)
    out = core.clipped_surrogate_loss(logp, logp_old, adv)
    assert float(out.stats["clipfrac"]) == 1.0
    assert float(out.stats["clip_active_frac"]) == 0.5


def test_identical_policies_give_ratio_one_and_zero_kl():
    lp = torch.randn(50, dtype=f64)
    out = core.clipped_surrogate_loss(lp, lp.clone(), torch.randn(50, dtype=f64))
    assert float(out.stats["ratio_max"]) == 1.0 and float(out.stats["ratio_min"]) == 1.0
    assert float(out.stats["approx_kl"]) == 0.0 and float(out.stats["approx_kl_k1"]) == 0.0


def test_labels_are_detached():
    logp = torch.randn(5, requires_grad=True)
    old = torch.randn(5, requires_grad=True)
    adv = torch.randn(5, requires_grad=True)
    out = core.clipped_surrogate_loss(logp, old, adv)
    out.loss.backward()
    assert old.grad is None and adv.grad is None and logp.grad is not None


def test_vanilla_pg_gradient_equals_clip_gradient_at_ratio_one():
    logp = torch.randn(7, dtype=f64, requires_grad=True)
    adv = torch.randn(7, dtype=f64)
    (g1,) = torch.autograd.grad(core.vanilla_pg_loss(logp, logp.detach(), adv).loss, logp)
    (g2,) = torch.autograd.grad(core.clipped_surrogate_loss(logp, logp.detach(), adv).loss, logp)
    torch.testing.assert_close(g1, g2)


def test_flipped_advantage_reverses_the_update_direction():
    logp = torch.randn(6, dtype=f64, requires_grad=True)
    adv = torch.randn(6, dtype=f64)
    (g1,) = torch.autograd.grad(core.clipped_surrogate_loss(logp, logp.detach(), adv).loss, logp)
    (g2,) = torch.autograd.grad(core.clipped_surrogate_loss(logp, logp.detach(), -adv).loss, logp)
    torch.testing.assert_close(g1, -g2)


def test_zero_advantages_give_zero_policy_gradient():
    logp = torch.randn(6, dtype=f64, requires_grad=True)
    out = core.clipped_surrogate_loss(logp, logp.detach() + 0.3, torch.zeros(6, dtype=f64))
    (g,) = torch.autograd.grad(out.loss, logp)
    assert bool((g == 0).all())


# ------------------------------------------------------------------ aggregation


@st.composite
def token_losses(draw):
    b = draw(st.integers(2, 8))
    length = draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, length, generator=g) < 0.7
    mask[:, 0] = True  # every row has at least one action
    x = torch.randn(b, length, generator=g, dtype=f64)
    split = draw(st.integers(1, b - 1))
    return x, mask, split


@given(token_losses(), st.sampled_from(core.AGGREGATION_MODES))
def test_micro_batch_accumulation_equals_full_batch_with_global_counts(data, mode):
    x, mask, split = data
    w = torch.randn(x.shape, dtype=f64)
    theta = torch.zeros((), dtype=f64, requires_grad=True)

    def loss(rows):
        return core.aggregate((x[rows] + theta * w[rows]) ** 2, mask[rows], mode,
                              num_tokens=int(mask.sum()), num_seqs=x.shape[0],
                              norm_length=x.shape[1])

    (full,) = torch.autograd.grad(loss(slice(None)), theta)
    (g1,) = torch.autograd.grad(loss(slice(0, split)), theta)
    (g2,) = torch.autograd.grad(loss(slice(split, None)), theta)
    torch.testing.assert_close(g1 + g2, full)
    # and the value with default (full-batch) denominators is the same number
    assert math.isclose(float(core.aggregate(x, mask, mode)), float(core.aggregate(
        x, mask, mode, num_tokens=int(mask.sum()), num_seqs=x.shape[0],
        norm_length=x.shape[1])))


def test_token_mean_with_local_counts_is_not_accumulable():
    """The documented caveat: per-micro-batch token counts weight tokens unequally."""
    x = torch.ones(2, 4, dtype=f64)
    x[1] = 3.0
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    full = core.aggregate(x, mask, "token-mean")
    halves = (core.aggregate(x[:1], mask[:1], "token-mean")
              + core.aggregate(x[1:], mask[1:], "token-mean")) / 2
    assert float(full) == pytest.approx(13 / 5)
    assert float(halves) == pytest.approx(2.0)


def test_aggregation_modes_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], dtype=f64)
    m = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    assert float(core.aggregate(x, m, "token-mean")) == pytest.approx(10 / 4)
    assert float(core.aggregate(x, m, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)
    assert float(core.aggregate(x, m, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(core.aggregate(x, m, "seq-mean-token-sum-norm")) == pytest.approx(10 / 6)
    with pytest.raises(ValueError, match="unknown aggregation mode 'mean'.*token-mean"):
        core.aggregate(x, m, "mean")


def test_padding_contents_do_not_change_the_loss():
    g = torch.Generator().manual_seed(3)
    lp, old, adv = (torch.randn(3, 6, generator=g, dtype=f64) for _ in range(3))
    m = torch.rand(3, 6, generator=g) < 0.6
    m[:, 0] = True
    base = core.clipped_surrogate_loss(lp, old, adv, m, agg="seq-mean-token-mean").loss
    junk = lambda t: torch.where(m, t, torch.full_like(t, 1e6))  # noqa: E731
    other = core.clipped_surrogate_loss(junk(lp), junk(old), junk(adv), m,
                                        agg="seq-mean-token-mean").loss
    assert float(base) == float(other)


# ------------------------------------------------------------------ value / entropy / kl


def test_value_loss_forms():
    v = torch.tensor([1.0, 3.0], dtype=f64)
    v_old = torch.tensor([0.0, 0.0], dtype=f64)
    ret = torch.tensor([2.0, 0.0], dtype=f64)
    assert float(core.value_loss(v, ret)) == pytest.approx((1 + 9) / 2)
    assert float(core.value_loss(v, ret, half=True)) == pytest.approx(0.5 * (1 + 9) / 2)
    # clipped prediction: [0.5, 0.5] -> errors [2.25, 0.25]; max form: [2.25, 9]
    assert float(core.value_loss(v, ret, values_old=v_old, clip_range_vf=0.5)) == \
        pytest.approx((2.25 + 9) / 2)
    assert float(core.value_loss(v, ret, values_old=v_old, clip_range_vf=0.5,
                                 clip_mode="clipped")) == pytest.approx((2.25 + 0.25) / 2)
    with pytest.raises(ValueError, match="values_old"):
        core.value_loss(v, ret, clip_range_vf=0.5)


def test_loss_terms_route_gradients_to_their_own_parameters():
    torch.manual_seed(0)
    actor = torch.nn.Linear(3, 2)
    critic = torch.nn.Linear(3, 1)
    obs = torch.randn(16, 3)
    actions = torch.randint(0, 2, (16,))
    logits = actor(obs)
    logp = torch.log_softmax(logits, -1).gather(1, actions[:, None]).squeeze(1)
    ent = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    terms = core.LossTerms(
        policy=core.clipped_surrogate_loss(logp, logp.detach(), torch.randn(16)).loss,
        value=core.value_loss(critic(obs).squeeze(1), torch.randn(16)),
        entropy=core.entropy_bonus(ent),
    )
    for name, term in (("policy", terms.policy), ("entropy", terms.entropy)):
        grads = torch.autograd.grad(term, list(actor.parameters()) + list(critic.parameters()),
                                    allow_unused=True, retain_graph=True)
        assert all(g is None for g in grads[2:]), name
        assert any(g is not None and bool(g.abs().sum() > 0) for g in grads[:2]), name
    grads = torch.autograd.grad(terms.value, list(actor.parameters()) + list(critic.parameters()),
                                allow_unused=True, retain_graph=True)
    assert all(g is None for g in grads[:2]) and all(g is not None for g in grads[2:])
    total = terms.total(vf_coef=0.5, ent_coef=0.01)
    want = terms.policy + 0.5 * terms.value - 0.01 * terms.entropy
    assert total.item() == pytest.approx(want.item())


def test_kl_estimators():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(5, generator=g, dtype=f64), 0)
    q = torch.softmax(torch.randn(5, generator=g, dtype=f64), 0)
    exact = float(core.categorical_kl(p, q, from_logits=False))
    lp, lq = torch.log(p), torch.log(q)
    for kind in ("k1", "k3"):  # unbiased: exact expectation under p equals the KL
        assert float((p * core.kl_estimate(lp, lq, kind)).sum()) == pytest.approx(exact)
    assert bool((core.kl_k3(lp, lq) >= 0).all()) and bool((core.kl_k2(lp, lq) >= 0).all())
    assert bool((core.kl_k1(lp, lq) < 0).any())  # k1 can be negative per sample
    assert float(core.categorical_kl(torch.log(p), torch.log(q))) == pytest.approx(exact)
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'; known: k1, k2, k3"):
        core.kl_estimate(lp, lq, "k4")


def test_kl_penalty_loss_is_zero_at_reference_and_has_gradient_away():
    lp = torch.randn(8, dtype=f64, requires_grad=True)
    assert core.kl_penalty_loss(lp, lp.detach()).item() == 0.0
    loss = core.kl_penalty_loss(lp, lp.detach() + 0.5)
    (g,) = torch.autograd.grad(loss, lp)
    assert loss.item() > 0 and bool((g != 0).all())


def test_adaptive_kl_controller_follows_the_ppo_paper():
    c = core.AdaptiveKLController(1.0, target=0.01)
    assert c.update(0.02) == 2.0  # > 1.5 * target: double
    assert c.update(0.01) == 2.0  # within the band: keep
    assert c.update(0.005) == 1.0  # < target / 1.5: halve
    p = core.ProportionalKLController(0.1, target=6.0, horizon=10000)
    assert p.update(12.0, n_steps=100) == pytest.approx(0.1 * (1 + 0.2 * 100 / 10000))
    with pytest.raises(ValueError, match="target"):
        core.AdaptiveKLController(1.0, target=0.0)


# ------------------------------------------------------------------ stats and group advantages


def test_masked_whiten_single_element_is_not_nan():
    out = core.masked_whiten(torch.tensor([3.0]))
    assert out.tolist() == [0.0]
    out = core.masked_whiten(torch.tensor([3.0, 5.0]), torch.tensor([True, False]))
    assert out.tolist() == [0.0, 0.0]
    x = torch.randn(100, dtype=f64)
    w = core.masked_whiten(x)
    assert abs(float(w.mean())) < 1e-12 and abs(float(w.std()) - 1) < 1e-6


def test_masked_var_ddof_and_explained_variance():
    x = torch.tensor([1.0, 2.0, 3.0, 100.0], dtype=f64)
    m = torch.tensor([1, 1, 1, 0], dtype=torch.bool)
    assert float(core.masked_var(x, m, ddof=1)) == pytest.approx(1.0)
    assert float(core.masked_var(x, m, ddof=0)) == pytest.approx(2 / 3)
    y = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=f64)
    assert core.explained_variance(y, y) == 1.0
    assert core.explained_variance(torch.full_like(y, 2.5), y) == pytest.approx(0.0)
    assert math.isnan(core.explained_variance(y, torch.ones_like(y)))


def test_group_advantages_by_hand():
    scores = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]], dtype=f64)
    std1 = np.std([1, 0, 0, 1], ddof=1)
    want = np.array([0.5, -0.5, -0.5, 0.5]) / (std1 + 1e-6)
    np.testing.assert_allclose(core.grpo_advantages(scores)[0].numpy(), want)
    assert core.grpo_advantages(scores)[1].tolist() == [0.0] * 4  # no spread -> 0, not NaN
    assert core.dr_grpo_advantages(scores)[0].tolist() == [0.5, -0.5, -0.5, 0.5]
    # RLOO: 1 - (0 + 0 + 1)/3 = 2/3 ; 0 - 2/3 = -2/3
    np.testing.assert_allclose(core.rloo_advantages(scores)[0].numpy(),
                               [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    flat = core.rloo_advantages(scores.flatten(), group_size=4)
    np.testing.assert_allclose(flat.numpy(), core.rloo_advantages(scores).flatten().numpy())
    assert not torch.isnan(core.grpo_advantages(torch.tensor([[2.0]]))).any()
    with pytest.raises(ValueError, match="group_size"):
        core.grpo_advantages(torch.ones(6), group_size=4)
    with pytest.raises(ValueError, match="at least 2"):
        core.rloo_advantages(torch.ones(3, 1))


@given(st.integers(2, 6), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_rloo_equals_scaled_mean_centring(g, p, seed):
    s = torch.randn(p, g, generator=torch.Generator().manual_seed(seed), dtype=f64)
    torch.testing.assert_close(core.rloo_advantages(s), g / (g - 1) * core.dr_grpo_advantages(s))


def test_reinforce_pp_and_broadcast():
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0]], dtype=f64)
    m = torch.tensor([[1, 1, 1, 0], [0, 1, 0, 0]], dtype=torch.bool)
    adv = core.reinforce_pp_advantages(r, m, gamma=1.0)
    returns = torch.tensor([1.0, 1.0, 1.0, 2.0], dtype=f64)
    want = (returns - returns.mean()) / (returns.std() + 1e-8)
    torch.testing.assert_close(adv[m], want)
    assert bool((adv[~m] == 0).all())
    b = core.broadcast_to_tokens(torch.tensor([2.0, -1.0]), m)
    assert b.tolist() == [[2.0, 2.0, 2.0, 0.0], [0.0, -1.0, 0.0, 0.0]]


def test_registries_fail_loudly_and_their_names_are_the_config_values():
    from ppokit.algos.config import CHOICES

    assert core.POLICY_LOSSES.names() == ["cispo", "clip", "gspo", "gspo_token", "kl_penalty",
                                          "vanilla"]
    with pytest.raises(ValueError, match="unknown policy loss 'ppo'; known: cispo, clip, gspo"):
        core.POLICY_LOSSES.get("ppo")
    with pytest.raises(ValueError, match="already registered"):
        core.register_advantage_estimator("grpo", core.grpo_advantages, layout="groups")
    with pytest.raises(TypeError, match="filtered view"):
        core.GROUP_ADVANTAGES.register("mine", core.grpo_advantages)
    # a group estimator is not an environment estimator, and the views say so by name
    with pytest.raises(ValueError, match="unknown advantage estimator for environments 'grpo'"):
        core.ENV_ADVANTAGES.get("grpo")
    assert core.GROUP_ADVANTAGES.names() == ["dr_grpo", "grpo", "rloo"]
    assert set(CHOICES["policy_loss"]) == set(core.POLICY_LOSSES.names())
    assert set(CHOICES["advantage_estimator"]) == set(core.ENV_ADVANTAGES.names())
    spec = core.AdvantageSpec(gamma=0.9, gae_lambda=0.0)
    t = torch.tensor
    # td(0) is GAE with lambda 0
    adv, _ = core.ENV_ADVANTAGES.get("gae")(core.Steps(
        t([0.0, 1.0]), t([0.4, 0.7]), t([0.7, 0.0]), t([0, 1]), t([0, 1])), spec)
    assert np.allclose(adv.numpy(), [0.23, 0.3])
    # reward_to_go through the registry: the return minus the value, bootstrapped at the end
    adv, ret = core.ENV_ADVANTAGES.get("reward_to_go")(core.Steps(
        t([1.0, 1.0]), t([0.5, 0.5]), t([0.0, 2.0]), t([0, 0]), t([0, 0])),
        core.AdvantageSpec(gamma=0.5, gae_lambda=0.95))
    assert np.allclose(ret.numpy(), [1.0 + 0.5 * (1.0 + 0.5 * 2.0), 1.0 + 0.5 * 2.0])
    assert np.allclose(adv.numpy(), ret.numpy() - 0.5)
