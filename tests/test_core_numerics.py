"""Numerics that must hold on every input: zero-spread groups and batches give exactly 0,
the PPO-KL penalty's gradient is the KL gradient, the KL-to-reference loss's gradient is
the one its estimator promises, masked positions never reach a loss or its
gradient, and ``aggregate`` reads ``[M]`` as ``[M, 1]``."""

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ppokit import core

f64 = torch.float64
DTYPES = [torch.float16, torch.float32, torch.float64]
JUNK = [float("nan"), float("inf"), float("-inf"), 1e6]


# ------------------------------------------------------------------ zero spread


def test_grpo_group_of_equal_float32_scores_gets_exactly_zero():
    adv = core.grpo_advantages(torch.tensor([[0.7] * 8]))
    assert adv.dtype == torch.float32
    assert adv.tolist() == [[0.0] * 8]


def test_masked_whiten_of_a_constant_float32_vector_is_exactly_zero():
    assert core.masked_whiten(torch.full((8,), 0.7)).tolist() == [0.0] * 8
    assert core.masked_var(torch.full((8,), 0.7)).item() == 0.0


@st.composite
def equal_groups(draw):
    dtype = draw(st.sampled_from(DTYPES))
    scale = 10.0 ** draw(st.integers(-3, 4))
    p = draw(st.integers(1, 4))
    g = draw(st.integers(1, 16))
    kind = draw(st.sampled_from(["partial-credit", "uniform", "normal"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    if kind == "partial-credit":
        n = rng.integers(1, 11, size=p)
        vals = rng.integers(0, n + 1) / n
    elif kind == "uniform":
        vals = rng.random(p)
    else:
        vals = rng.normal(0.0, 3.0, size=p)
    scores = torch.tensor(np.repeat((vals * scale)[:, None], g, 1)).to(dtype)
    # finite in the drawn dtype (float16 overflows near 6.5e4: such scores are not input
    # the estimators accept)
    assume(bool(torch.isfinite(scores).all()))
    return scores, g


@given(equal_groups(), st.booleans())
def test_every_group_estimator_gives_exact_zero_without_spread(data, flat):
    scores, g = data
    x = scores.flatten() if flat else scores
    gs = g if flat else None
    for fn in (core.grpo_advantages, core.dr_grpo_advantages):
        adv = fn(x, gs)
        assert adv.dtype == scores.dtype and adv.shape == x.shape
        assert bool((adv == 0).all()), (fn.__name__, adv)
    adv = core.grpo_advantages(x, gs, ddof=0)
    assert bool((adv == 0).all())
    if g >= 2:
        assert bool((core.rloo_advantages(x, gs) == 0).all())


@given(st.sampled_from(DTYPES), st.integers(-3, 4), st.floats(-3.0, 3.0),
       st.integers(1, 40), st.integers(0, 2**31 - 1), st.booleans())
def test_batches_without_spread_whiten_to_exact_zero(dtype, exponent, value, n, seed, masked):
    scale = 10.0 ** exponent
    g = torch.Generator().manual_seed(seed)
    x = torch.full((n,), value * scale, dtype=f64).to(dtype)
    mask = (torch.rand(n, generator=g) < 0.6) if masked else None
    if masked:  # whatever the masked positions hold
        x = torch.where(mask, x, torch.randn(n, generator=g, dtype=f64).to(dtype) * scale)
    out = core.masked_whiten(x, mask)
    assert out.dtype == dtype and bool((out == 0).all())
    assert core.masked_var(x, mask).item() == 0.0
    kept = core.masked_whiten(x, mask, shift_mean=False)
    valid = torch.ones(n, dtype=torch.bool) if mask is None else mask
    assert bool((kept[valid] == x[valid]).all())
    # REINFORCE++: every valid return equal (one reward on a single action per row)
    b = max(1, n // 4)
    r = torch.zeros(b, 4, dtype=f64)
    r[:, 0] = value * scale
    m = torch.zeros(b, 4, dtype=torch.bool)
    m[:, 0] = True
    assert bool((core.reinforce_pp_advantages(r.to(dtype), m) == 0).all())


@given(st.integers(1, 200), st.integers(0, 2**31 - 1), st.booleans())
def test_masked_whiten_is_std_mean_of_the_shifted_valid_values(n, seed, masked):
    """Bit for bit the statistics the fused minibatch step uses (first valid value as the
    shift, ``torch.std_mean``), so the two paths whiten a minibatch identically."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 2
    m = (torch.rand(n, generator=g) < 0.7) if masked else torch.ones(n, dtype=torch.bool)
    out = core.masked_whiten(x, m if masked else None)
    valid = x[m]
    if valid.numel() >= 2:
        d = valid - valid[0]
        std, mean = torch.std_mean(d)
        assert torch.equal(out[m], (d - mean) / (std + 1e-8))
    assert bool((out[~m] == 0).all())


@given(st.integers(1, 5), st.integers(2, 12), st.integers(0, 2**31 - 1))
def test_group_estimators_with_spread_match_the_float64_formula(p, g, seed):
    s = torch.rand(p, g, generator=torch.Generator().manual_seed(seed), dtype=f64)
    centred = s - s.mean(1, keepdim=True)
    torch.testing.assert_close(core.grpo_advantages(s),
                               centred / (s.std(1, keepdim=True) + 1e-6))
    torch.testing.assert_close(core.dr_grpo_advantages(s), centred)
    torch.testing.assert_close(core.grpo_advantages(s.float()),
                               (centred / (s.std(1, keepdim=True) + 1e-6)).float(),
                               rtol=1e-4, atol=1e-5)


def test_grpo_labels_of_a_group_with_equal_scores_are_zero_on_every_action_token():
    from ppokit.llm.modeling.rollout import TokenRollout
    from ppokit.llm.training.trainer import LLMConfig, compute_labels

    b, length = 8, 6
    am = torch.zeros(b, length, dtype=torch.bool)
    am[:, 2:] = True
    roll = TokenRollout(torch.zeros(b, length, dtype=torch.long),
                   torch.ones(b, length, dtype=torch.long), am, 2,
                   torch.zeros(b, dtype=torch.bool), [[1]] * b)
    cfg = LLMConfig(algo="grpo", prompts_per_iter=1, samples_per_prompt=8,
                    batch_size=8).resolved()
    lp = torch.full((b, length), -1.0)
    lab = compute_labels(cfg, roll, torch.full((b,), 0.7), lp, lp.clone(), 0.02)
    assert bool((lab.advantages == 0).all())


# ------------------------------------------------------------------ the PPO-KL penalty


def _categorical_penalty_gradient(old_logits, logits, penalty):
    """Exact expectation over a ~ π_old of the per-sample penalty and of its gradient."""
    logits = logits.clone().requires_grad_()
    logp_all = torch.log_softmax(logits, -1)
    logp_old_all = torch.log_softmax(old_logits, -1)
    n = logits.shape[-1]
    per = torch.stack([penalty(logp_all[a:a + 1], logp_old_all[a:a + 1]) for a in range(n)])
    value = (logp_old_all.exp() * per).sum()
    (grad,) = torch.autograd.grad(value, logits)
    kl_logits = logits.detach().clone().requires_grad_()
    kl = core.categorical_kl(old_logits, kl_logits)
    (kl_grad,) = torch.autograd.grad(kl, kl_logits)
    return value.detach(), grad, kl.detach(), kl_grad


@given(st.integers(2, 6), st.integers(0, 2**31 - 1), st.floats(0.1, 2.0))
def test_ppo_kl_penalty_expected_value_and_gradient_are_the_exact_kl(n, seed, spread):
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(n, generator=g, dtype=f64) * spread
    new = old + torch.randn(n, generator=g, dtype=f64) * spread
    value, grad, kl, kl_grad = _categorical_penalty_gradient(old, new, core.ppo_kl_penalty_loss)
    torch.testing.assert_close(value, kl, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, kl_grad, rtol=1e-9, atol=1e-12)
    # the per-sample statistic the adaptive beta is driven by is the same estimator
    logp_all, logp_old_all = torch.log_softmax(new, -1), torch.log_softmax(old, -1)
    per = torch.stack([core.approx_kl(logp_all[a:a + 1], logp_old_all[a:a + 1])
                       for a in range(n)])
    torch.testing.assert_close((logp_old_all.exp() * per).sum(), kl, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("p_old", [[0.8, 0.2], [0.35, 0.65]])
def test_ppo_kl_penalty_gradient_on_the_reported_policies(p_old):
    old = torch.log(torch.tensor(p_old, dtype=f64))
    new = torch.log(torch.tensor([0.302, 0.698], dtype=f64))
    _, grad, _, kl_grad = _categorical_penalty_gradient(old, new, core.ppo_kl_penalty_loss)
    torch.testing.assert_close(grad, kl_grad, rtol=1e-12, atol=1e-14)
    # k3 with the roles swapped (GRPO's reference-policy term) is a different penalty
    _, other, _, _ = _categorical_penalty_gradient(
        old, new, lambda lp, lq: core.kl_penalty_loss(lp, lq, estimator="k3"))
    assert float((other - kl_grad).norm() / kl_grad.norm()) > 0.05


# ------------------------------------------------------------------ the KL-to-reference loss


def _kl_directions(logits, ref_logits):
    """The exact gradients, with respect to the policy's logits, of KL(π ‖ π_ref) and of
    KL(π_ref ‖ π) (the reference is frozen)."""
    out = []
    for first_is_policy in (True, False):
        x = logits.detach().clone().requires_grad_()
        kl = (core.categorical_kl(x, ref_logits) if first_is_policy
              else core.categorical_kl(ref_logits, x))
        out.append(torch.autograd.grad(kl, x)[0])
    return out


def _per_sample(estimator):
    """The per-sample loss of an estimator of KL(π ‖ π_ref) on sampled tokens: through
    kl_penalty_loss for the ones it offers, k1 from the estimator itself."""
    if estimator == "k1":
        return lambda lp, lr: core.kl_k1(lp, lr).mean()
    return lambda lp, lr: core.kl_penalty_loss(lp, lr, estimator=estimator)


# estimator -> which KL's gradient its expected gradient is (None: zero)
KL_LOSS_DIRECTION = {"k1": None, "k2": "forward", "k3": "reverse"}


@given(st.integers(2, 6), st.integers(0, 2**31 - 1), st.floats(0.2, 2.0))
def test_kl_loss_expected_gradient_follows_its_estimators_direction(n, seed, spread):
    """Exact expectation over tokens sampled from π of each estimator's per-sample
    gradient: k2's is ∇KL(π ‖ π_ref), GRPO's k3's is ∇KL(π_ref ‖ π), k1's is 0."""
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(n, generator=g, dtype=f64) * spread
    logits = ref + torch.randn(n, generator=g, dtype=f64) * spread
    forward, reverse = _kl_directions(logits, ref)
    assume(float((forward - reverse).norm()) > 1e-6)  # (the two directions differ)
    for est, direction in KL_LOSS_DIRECTION.items():
        x = logits.clone().requires_grad_()
        logp, logp_ref = torch.log_softmax(x, -1), torch.log_softmax(ref, -1)
        per = torch.stack([_per_sample(est)(logp[a:a + 1], logp_ref[a:a + 1])
                           for a in range(n)])
        (grad,) = torch.autograd.grad((logp.detach().exp() * per).sum(), x)
        want = {"forward": forward, "reverse": reverse, None: torch.zeros(n, dtype=f64)}
        torch.testing.assert_close(grad, want[direction], rtol=1e-9, atol=1e-12,
                                   msg=f"{est}: expected the gradient of {direction}")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kl_loss_monte_carlo_gradient_matches_the_exact_kl_gradients(seed):
    """Monte-Carlo: the mean gradient of each estimator's loss over 20 batches of 20000
    tokens sampled from a small categorical policy, against the exact gradient of both KL
    directions (within 5 standard errors of the batches' mean, and far from the other)."""
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(5, generator=g, dtype=f64)
    logits = ref + torch.randn(5, generator=g, dtype=f64) * 1.2
    forward, reverse = _kl_directions(logits, ref)
    exact = {"forward": forward, "reverse": reverse, None: torch.zeros(5, dtype=f64)}
    probs = torch.softmax(logits, -1)
    for est, direction in KL_LOSS_DIRECTION.items():
        grads = []
        for _ in range(20):
            a = torch.multinomial(probs, 20_000, replacement=True, generator=g)
            x = logits.clone().requires_grad_()
            logp = torch.log_softmax(x, -1)[a]
            loss = _per_sample(est)(logp, torch.log_softmax(ref, -1)[a])
            grads.append(torch.autograd.grad(loss.mean(), x)[0])
        grads = torch.stack(grads)
        mean, sem = grads.mean(0), grads.std(0) / math.sqrt(len(grads))
        err = (mean - exact[direction]).abs()
        assert bool((err <= 5 * sem + 1e-12).all()), (est, mean, exact[direction], sem)
        for other in ("forward", "reverse"):
            if other != direction:  # the other direction is many standard errors away
                assert float((mean - exact[other]).abs().max()) > 20 * float(sem.max())


def test_kl_loss_default_is_the_gradient_of_kl_policy_to_reference():
    """The default estimator of the KL loss term (the engine's and the token trainer's)
    has the expected gradient of KL(π ‖ π_ref); GRPO's k3 stays selectable by name; k1,
    whose expected gradient is 0, is refused as a loss."""
    from ppokit.engine import UpdateSpec
    from ppokit.llm.training.config import LLMConfig

    assert KL_LOSS_DIRECTION[core.DEFAULT_KL_LOSS_ESTIMATOR] == "forward"
    assert UpdateSpec().kl_estimator == core.DEFAULT_KL_LOSS_ESTIMATOR
    assert LLMConfig(algo="grpo").resolved().kl_estimator == core.DEFAULT_KL_LOSS_ESTIMATOR
    assert LLMConfig(algo="grpo", kl_estimator="k3").resolved().kl_estimator == "k3"
    lp = torch.randn(6, dtype=f64, requires_grad=True)
    lr = lp.detach() + torch.randn(6, dtype=f64)
    torch.testing.assert_close(core.kl_penalty_loss(lp, lr), (0.5 * (lp - lr) ** 2).mean())
    with pytest.raises(ValueError, match="estimator: expected one of k2, k3 .*k1's expected"):
        core.kl_penalty_loss(lp, lr, estimator="k1")


@settings(max_examples=25)
@given(st.integers(0, 2**31 - 1), st.integers(1, 2))
def test_ppo_kl_penalty_gradient_on_a_gaussian_policy(seed, dim):
    """Expectation over a ~ N(μ_old, σ_old) (diagonal) by a Gauss–Hermite product rule,
    against the gradient of the closed-form KL(π_old ‖ π)."""
    g = torch.Generator().manual_seed(seed)
    mu_old = torch.randn(dim, generator=g, dtype=f64)
    ls_old = torch.randn(dim, generator=g, dtype=f64) * 0.3
    mu = (mu_old + torch.randn(dim, generator=g, dtype=f64) * 0.5).requires_grad_()
    ls = (ls_old + torch.randn(dim, generator=g, dtype=f64) * 0.15).requires_grad_()
    z, w = np.polynomial.hermite_e.hermegauss(60 if dim == 1 else 30)
    z = torch.tensor(z, dtype=f64)
    w = torch.tensor(w / math.sqrt(2 * math.pi), dtype=f64)
    pts = torch.stack([t.reshape(-1) for t in torch.meshgrid(*([z] * dim), indexing="ij")], -1)
    wts = torch.stack(torch.meshgrid(*([w] * dim), indexing="ij")).prod(0).reshape(-1)
    a = mu_old + ls_old.exp() * pts  # [K^dim, dim]

    def logp(mean, log_std):
        return (-0.5 * ((a - mean) / log_std.exp()) ** 2 - log_std
                - 0.5 * math.log(2 * math.pi)).sum(-1)

    per = torch.stack([core.ppo_kl_penalty_loss(lp[None], lo[None])
                       for lp, lo in zip(logp(mu, ls), logp(mu_old, ls_old))])
    grads = torch.autograd.grad((wts * per).sum(), (mu, ls))
    kl = (ls - ls_old + (ls_old.exp() ** 2 + (mu_old - mu) ** 2) / (2 * ls.exp() ** 2)
          - 0.5).sum()
    want = torch.autograd.grad(kl, (mu, ls))
    tol = 1e-8 if dim == 1 else 1e-6  # the quadrature's own error (k3 swapped: > 5 %)
    for got, exp in zip(grads, want):
        torch.testing.assert_close(got, exp, rtol=tol, atol=tol)


@pytest.mark.parametrize("p_old", [[0.8, 0.2], [0.35, 0.65]])
def test_trainer_kl_penalty_gradient_is_the_kl_gradient(tmp_path, p_old):
    """The PPO-KL preset's actor gradient, on a minibatch whose action counts are exactly
    π_old (so the minibatch mean is the expectation over π_old), equals β ∇KL(π_old ‖ π)."""
    from ppokit.algos.config import TrainConfig
    from ppokit.algos.trainer import Trainer

    cfg = TrainConfig(env_id="CartPole-v1", n_envs=1, policy_loss="kl_penalty", kl_coef=0.7,
                      ent_coef=0.0, max_grad_norm=None, normalize_advantage=False,
                      net_arch=(8,), tensorboard=False)
    tr = Trainer(cfg, tmp_path / "run", log=lambda m: None)
    try:
        head = [m for m in tr.policy.actor if isinstance(m, torch.nn.Linear)][-1]
        pi = torch.tensor([0.302, 0.698])
        with torch.no_grad():  # π(·|s) = [0.302, 0.698] at every state
            head.weight.zero_()
            head.bias.copy_(pi.log())
        grads = []
        head.bias.register_hook(lambda g: grads.append(g.detach().clone()))
        counts = [round(20 * p) for p in p_old]
        actions = torch.tensor([0] * counts[0] + [1] * counts[1])
        n = len(actions)
        mb = {"obs": torch.randn(n, 4), "actions": actions,
              "logp": torch.log(torch.tensor(p_old))[actions],
              "advantages": torch.zeros(n), "returns": torch.zeros(n),
              "values": torch.zeros(n)}
        tr.update_minibatch(mb, 0.2)
    finally:
        tr.close()
    # the advantages are 0 and the entropy bonus is off: only the penalty reaches the actor;
    # d/d logits of β KL(π_old ‖ softmax(logits)) = β (π − π_old)
    want = 0.7 * (pi - torch.tensor(p_old))
    assert len(grads) == 1
    torch.testing.assert_close(grads[0], want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ masked positions


def _leaves(data, diff):
    return {k: (v.clone().requires_grad_() if k in diff else v.clone())
            for k, v in data.items()}


LOSS_TERMS = {
    # name: (fields it reads, differentiable fields, call(data, mask, agg))
    "clip": (("logp", "logp_old", "adv"), ("logp",),
             lambda d, m, agg: core.clipped_surrogate_loss(
                 d["logp"], d["logp_old"], d["adv"], m, agg=agg).loss),
    "clip-dual": (("logp", "logp_old", "adv"), ("logp",),
                  lambda d, m, agg: core.clipped_surrogate_loss(
                      d["logp"], d["logp_old"], d["adv"], m, clip_eps_high=0.28, dual_clip=3.0,
                      agg=agg).loss),
    "vanilla": (("logp", "logp_old", "adv"), ("logp",),
                lambda d, m, agg: core.vanilla_pg_loss(d["logp"], d["logp_old"], d["adv"], m,
                                                       agg=agg).loss),
    "value": (("values", "returns"), ("values",),
              lambda d, m, agg: core.value_loss(d["values"], d["returns"], m, agg=agg)),
    "value-clip-max": (("values", "returns", "values_old"), ("values",),
                       lambda d, m, agg: core.value_loss(
                           d["values"], d["returns"], m, values_old=d["values_old"],
                           clip_range_vf=0.2, agg=agg)),
    "value-clipped": (("values", "returns", "values_old"), ("values",),
                      lambda d, m, agg: core.value_loss(
                          d["values"], d["returns"], m, values_old=d["values_old"],
                          clip_range_vf=0.2, clip_mode="clipped", half=True, agg=agg)),
    "entropy": (("entropy",), ("entropy",),
                lambda d, m, agg: core.entropy_bonus(d["entropy"], m, agg=agg)),
    "kl-reference": (("logp", "logp_ref"), ("logp",),
                     lambda d, m, agg: core.kl_penalty_loss(d["logp"], d["logp_ref"], m,
                                                            agg=agg)),
    "kl-ppo": (("logp", "logp_old"), ("logp",),
               lambda d, m, agg: core.ppo_kl_penalty_loss(d["logp"], d["logp_old"], m,
                                                          agg=agg)),
    "aggregate": (("x",), ("x",), lambda d, m, agg: core.aggregate(d["x"], m, agg)),
}


@st.composite
def masked_batch(draw):
    one_d = draw(st.booleans())
    shape = (draw(st.integers(2, 12)),) if one_d else (draw(st.integers(1, 5)),
                                                       draw(st.integers(2, 9)))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    mask = torch.rand(shape, generator=g) < draw(st.floats(0.2, 0.9))
    mask.view(-1)[0] = True
    mask.view(-1)[-1] = False  # at least one masked position
    data = {k: torch.randn(shape, generator=g, dtype=f64)
            for k in ("logp", "adv", "values", "returns", "values_old", "entropy", "logp_ref",
                      "x")}
    data["logp"] = -data["logp"].abs() - 0.05
    data["logp_old"] = data["logp"] + 0.4 * torch.randn(shape, generator=g, dtype=f64)
    data["logp_ref"] = data["logp"] + 0.4 * torch.randn(shape, generator=g, dtype=f64)
    data["values_old"] = data["values"] + 0.3 * torch.randn(shape, generator=g, dtype=f64)
    return data, mask


@given(masked_batch(), st.sampled_from(sorted(LOSS_TERMS)),
       st.sampled_from(core.AGGREGATION_MODES), st.lists(st.sampled_from(JUNK), min_size=8,
                                                          max_size=8), st.data())
def test_masked_positions_change_neither_value_nor_gradient(batch, term, agg, junk, data):
    """Overwrite the masked positions of any subset of a term's inputs with NaN, ±inf or 1e6:
    the loss and its gradient are bit-for-bit the same, and the gradient there is exactly 0."""
    clean, mask = batch
    fields, diff, fn = LOSS_TERMS[term]
    chosen = data.draw(st.lists(st.sampled_from(fields), min_size=1, unique=True))
    dirty = dict(clean)
    for i, k in enumerate(chosen):
        dirty[k] = torch.where(mask, clean[k], torch.full_like(clean[k], junk[i]))
    a, b = _leaves(clean, diff), _leaves(dirty, diff)
    loss_a, loss_b = fn(a, mask, agg), fn(b, mask, agg)
    assert torch.equal(loss_a, loss_b)
    grads_a = torch.autograd.grad(loss_a, [a[k] for k in diff])
    grads_b = torch.autograd.grad(loss_b, [b[k] for k in diff])
    for ga, gb in zip(grads_a, grads_b):
        assert torch.equal(ga, gb)
        assert bool((gb[~mask] == 0).all())


@pytest.mark.parametrize(("term", "field"),
                         [("clip", "logp_old"), ("clip", "adv"), ("kl-ppo", "logp_old")])
@pytest.mark.parametrize("junk", JUNK)
def test_junk_labels_at_padding_leave_model_gradients_unchanged(term, field, junk):
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3).double()
    obs = torch.randn(2, 5, 4, dtype=f64)
    actions = torch.randint(0, 3, (2, 5))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    labels = {"logp_old": torch.randn(2, 5, dtype=f64) * 0.2 - 1.0,
              "adv": torch.where(mask, torch.randn(2, 5, dtype=f64), 0.0)}

    def grads(lab):
        lin.zero_grad()
        logp = torch.log_softmax(lin(obs), -1).gather(-1, actions[..., None]).squeeze(-1)
        if term == "clip":
            loss = core.clipped_surrogate_loss(logp, lab["logp_old"], lab["adv"], mask).loss
        else:
            loss = core.ppo_kl_penalty_loss(logp, lab["logp_old"], mask)
        loss.backward()
        return [p.grad.clone() for p in lin.parameters()]

    clean = grads(labels)
    dirty = dict(labels)
    dirty[field] = torch.where(mask, labels[field], torch.full((2, 5), junk, dtype=f64))
    for a, b in zip(clean, grads(dirty)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("term", sorted(LOSS_TERMS))
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_every_term_refuses_non_finite_values_at_valid_positions(term, bad):
    fields, _, fn = LOSS_TERMS[term]
    g = torch.Generator().manual_seed(0)
    data = {k: torch.randn(2, 4, generator=g, dtype=f64) - 2.0
            for k in ("logp", "logp_old", "adv", "values", "returns", "values_old", "entropy",
                      "logp_ref", "x")}
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]], dtype=torch.bool)
    for k in fields:
        if term == "aggregate":
            continue  # aggregate reduces what it is given; the loss terms validate
        d = dict(data)
        d[k] = d[k].clone()
        d[k][0, 1] = bad
        with pytest.raises(ValueError, match=k if k != "adv" else "advantages"):
            fn(d, mask, "token-mean")
        d[k][0, 1] = data[k][0, 1]
        d[k][0, 3] = bad  # masked: accepted
        assert math.isfinite(float(fn(d, mask, "token-mean")))


# ------------------------------------------------------------------ aggregation of [M]


def test_aggregate_1d_with_a_mask_is_the_masked_mean_in_every_mode():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    m = torch.tensor([1, 1, 0, 0], dtype=torch.bool)
    for mode in core.AGGREGATION_MODES:
        assert float(core.aggregate(x, m, mode)) == 1.5, mode
        assert float(core.aggregate(x[:, None], m[:, None], mode)) == 1.5, mode


@given(st.integers(1, 12), st.integers(0, 2**31 - 1), st.sampled_from(core.AGGREGATION_MODES),
       st.booleans(), st.sampled_from([None, 7.0]), st.sampled_from([None, 3.0]))
def test_aggregate_reads_1d_input_as_m_by_1(n, seed, mode, masked, num, norm):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=f64)
    m = (torch.rand(n, generator=g) < 0.6) if masked else None
    kw = {"num_tokens": num, "num_seqs": num, "norm_length": norm}
    one = core.aggregate(x, m, mode, **kw)
    col = core.aggregate(x[:, None], None if m is None else m[:, None], mode, **kw)
    assert torch.equal(one, col)
    if num is None and norm is None:
        valid = x if m is None else x[m]
        want = valid.mean() if valid.numel() else torch.zeros((), dtype=f64)
        torch.testing.assert_close(one, want)


def test_a_row_without_actions_is_not_a_sequence():
    x = torch.tensor([[1.0, 2.0], [5.0, 7.0], [3.0, 0.0]], dtype=f64)
    m = torch.tensor([[1, 1], [0, 0], [1, 0]], dtype=torch.bool)
    assert float(core.aggregate(x, m, "seq-mean-token-sum")) == pytest.approx(6 / 2)
    assert float(core.aggregate(x, m, "seq-mean-token-mean")) == pytest.approx((1.5 + 3) / 2)
    assert float(core.aggregate(x, m, "seq-mean-token-sum-norm")) == pytest.approx(6 / 4)
    # a fixed count on request
    assert float(core.aggregate(x, m, "seq-mean-token-sum", num_seqs=3)) == pytest.approx(2.0)


# ------------------------------------------------------------------ token_gae


def _packed(r, v, m, gamma, lam, bootstrap_values=None):
    """The torch (non-CPU) implementation, run on the CPU."""
    from ppokit.core import advantage

    r_, v_, m_, b_ = advantage._token_inputs(r, v, m, bootstrap_values)
    return advantage._token_gae_packed(r_, v_, m_, gamma, lam, b_, 8)


GAE_PATHS = {"numpy": core.token_gae, "packed": _packed}
unit_or_edge = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0))


@st.composite
def token_layout(draw):
    b = draw(st.integers(1, 6))
    length = draw(st.integers(1, 400))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    kind = draw(st.sampled_from(["random", "dense", "spans", "empty-rows"]))
    if kind in ("random", "dense"):
        p = 0.9 if kind == "dense" else rng.random()
        mask = rng.random((b, length)) < p
    else:
        mask = np.zeros((b, length), dtype=bool)
        for i in range(b):
            if kind == "empty-rows" and rng.random() < 0.5:
                continue
            for _ in range(rng.integers(1, 4)):  # several spans: prompt, turns, padding
                start = rng.integers(0, length)
                mask[i, start:rng.integers(start, length + 1)] = True
    r = torch.tensor(rng.normal(size=(b, length)))
    v = torch.tensor(rng.normal(size=(b, length)) * 3)
    boot = torch.tensor(rng.normal(size=b)) if draw(st.booleans()) else None
    return r, v, torch.tensor(mask), boot


@given(token_layout(), unit_or_edge, unit_or_edge, st.sampled_from(sorted(GAE_PATHS)))
def test_token_gae_paths_equal_the_position_loop(batch, gamma, lam, path):
    r, v, m, boot = batch
    a, ret = GAE_PATHS[path](r, v, m, gamma, lam, bootstrap_values=boot)
    ra, rret = core.token_gae_reference(r, v, m, gamma, lam, bootstrap_values=boot)
    torch.testing.assert_close(a, ra, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ret, rret, rtol=1e-10, atol=1e-10)
    assert bool((a[~m] == 0).all()) and bool((ret[~m] == 0).all())


@given(token_layout(), st.floats(0.0, 1.0), st.floats(0.0, 1.0),
       st.sampled_from(sorted(GAE_PATHS)), st.lists(st.sampled_from(JUNK), min_size=2,
                                                     max_size=2))
def test_token_gae_never_reads_masked_positions(batch, gamma, lam, path, junk):
    r, v, m, boot = batch
    fn = GAE_PATHS[path]
    a, ret = fn(r, v, m, gamma, lam, bootstrap_values=boot)
    a2, ret2 = fn(torch.where(m, r, junk[0]), torch.where(m, v, junk[1]), m, gamma, lam,
                  bootstrap_values=boot)
    assert torch.equal(a, a2) and torch.equal(ret, ret2)
    if bool(m.any()):
        i, j = (int(k) for k in torch.nonzero(m)[0])
        for field in ("rewards", "values"):
            bad = (r, v)[field == "values"].clone()
            bad[i, j] = float("nan")
            args = (bad, v) if field == "rewards" else (r, bad)
            with pytest.raises(ValueError, match=f"{field}: expected finite values at action"):
                fn(*args, m, gamma, lam, bootstrap_values=boot)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 2e-5), (torch.float16, 2e-2),
                                            (torch.bfloat16, 1e-1)])
def test_token_gae_keeps_the_dtype(dtype, tol):
    g = torch.Generator().manual_seed(0)
    r = torch.randn(4, 300, generator=g, dtype=f64) * 0.1
    v = torch.randn(4, 300, generator=g, dtype=f64)
    m = torch.rand(4, 300, generator=g) < 0.9
    want, _ = core.token_gae_reference(r.to(dtype).double(), v.to(dtype).double(), m,
                                       0.99, 0.95)
    a, ret = core.token_gae(r.to(dtype), v.to(dtype), m, 0.99, 0.95)
    assert a.dtype == dtype and ret.dtype == dtype
    torch.testing.assert_close(a.double(), want, rtol=tol, atol=tol)


def test_token_gae_overflow_stays_on_the_mask():
    r = torch.tensor([[3e38, 0.0, 3e38, 0.0]])
    v = torch.zeros(1, 4)
    m = torch.tensor([[True, False, True, False]])
    for fn in GAE_PATHS.values():
        a, ret = fn(r, v, m, 1.0, 1.0)
        ra, _ = core.token_gae_reference(r, v, m, 1.0, 1.0)
        assert a[0, 0] == ra[0, 0] == float("inf")
        assert a[0, 1] == 0 and a[0, 3] == 0 and ret[0, 1] == 0 and ret[0, 3] == 0


def test_token_gae_leaves_the_thread_setting_alone_and_does_not_depend_on_it():
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(16, 1000, generator=g), torch.randn(16, 1000, generator=g)
    m = torch.rand(16, 1000, generator=g) < 0.9
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(core.token_gae(r, v, m, 0.99, 0.95))
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(x, y) for x, y in zip(*results))


@pytest.mark.slow
def test_token_gae_is_20x_the_loop_at_one_thread_and_at_the_default():
    """The side-by-side benchmark (``python -m bench.token_gae``) on random 90 %-dense
    masks, at one torch thread and at the machine's default count."""
    import os

    from bench.token_gae import measure

    default = os.cpu_count() or 1
    for threads in sorted({1, default}):
        res = measure("random", threads, repeats=9)
        assert res["ratio"] >= 20, res["ratio"]
