"""The hand-computable figures of docs/theory.md, reproduced through ppokit.core's own functions.

Each expected value is a worked figure of docs/theory.md (each section header below gives
its anchor); the code that produces it is ppokit's.
"""

import math

import numpy as np
import pytest
import torch

from ppokit import core


def r4(x):
    return np.round(np.asarray(x, dtype=np.float64), 4)


# ------------------------------------------------- docs/theory.md#two-step-example


def test_two_step_example_lambda_095():
    adv, ret = core.gae([0.0, 1.0], [0.4, 0.7], [0.7, 0.0], [0, 1], [0, 1], 0.9, 0.95)
    assert r4(adv[0]) == 0.4865
    assert r4(ret[0]) == 0.8865
    # delta_1 = 1 - 0.7 = 0.3 (terminal), delta_0 = 0 + 0.9 * 0.7 - 0.4 = 0.23
    deltas = core.td_residuals([0.0, 1.0], [0.4, 0.7], [0.7, 0.0], [0, 1], 0.9)
    assert np.allclose(deltas.numpy(), [0.23, 0.3])


def test_two_step_example_lambda_0_trusts_the_critic():
    _, ret = core.gae([0.0, 1.0], [0.4, 0.7], [0.7, 0.0], [0, 1], [0, 1], 0.9, 0.0)
    assert r4(ret[0]) == 0.63


def test_ratio_at_the_clip_edge():
    adv = torch.tensor([0.4865], dtype=torch.float64)
    old = torch.log(torch.tensor([0.25], dtype=torch.float64))
    at_edge = torch.log(torch.tensor([0.30], dtype=torch.float64))
    out = core.clipped_surrogate_loss(at_edge, old, adv)
    assert r4(out.ratio.detach()) == 1.2
    # pushing further to 0.35: unclipped would count ratio 1.4, the clip keeps 1.2
    beyond = torch.log(torch.tensor([0.35], dtype=torch.float64)).requires_grad_()
    out = core.clipped_surrogate_loss(beyond, old, adv)
    assert r4(out.ratio.detach()) == 1.4
    assert math.isclose(-out.loss.item(), 1.2 * 0.4865, rel_tol=1e-12)
    out.loss.backward()
    assert float(beyond.grad) == 0.0
    assert float(out.stats["clip_active_frac"]) == 1.0
    # with a negative advantage the 1.4 side is not protected: the penalty keeps growing
    beyond.grad = None
    out = core.clipped_surrogate_loss(beyond, old, -adv)
    assert math.isclose(-out.loss.item(), -1.4 * 0.4865, rel_tol=1e-12)
    out.loss.backward()
    assert float(beyond.grad) != 0.0
    assert float(out.stats["clip_active_frac"]) == 0.0
    assert float(out.stats["clipfrac"]) == 1.0


# --------------------------------------------- docs/theory.md#four-step-trajectory

FOUR_STEP = {
    0.0: ([0.1445, 0.143, 0.597, 0.2], [0.1445, 0.143, 0.597, 0.2]),
    0.5: ([0.1445, 0.143, 0.597, 0.2], [0.3858, 0.4875, 0.696, 0.2]),
    0.95: ([0.1445, 0.143, 0.597, 0.2], [0.9734, 0.8814, 0.7851, 0.2]),
    1.0: ([0.1445, 0.143, 0.597, 0.2], [1.0652, 0.93, 0.795, 0.2]),
}


@pytest.mark.parametrize("lam", sorted(FOUR_STEP))
def test_four_step_trajectory_table(lam):
    rewards = [0.0, 0.0, 1.0, 0.5]
    values = [0.40, 0.55, 0.70, 0.30]
    next_values = values[1:] + [0.0]
    done = [0, 0, 0, 1]
    deltas = core.td_residuals(rewards, values, next_values, done, 0.99)
    adv, ret = core.gae(rewards, values, next_values, done, done, 0.99, lam)
    want_delta, want_adv = FOUR_STEP[lam]
    assert r4(deltas).tolist() == want_delta
    assert r4(adv).tolist() == want_adv
    assert np.allclose(ret.numpy(), adv.numpy() + np.array(values))


# ----------------------------------------------- docs/theory.md#truncation-example


def test_truncation_bootstraps_from_the_final_observation_and_stops_the_carry():
    # step 0 is truncated (pre-reset next value 3); step 1 belongs to the next episode
    adv, ret = core.gae([1.0, 100.0], [2.0, 50.0], [3.0, 0.0], [0, 1], [1, 1], 0.9, 0.95)
    assert np.allclose(adv.numpy(), [1.7, 50.0])
    assert np.allclose(ret.numpy(), [3.7, 100.0])


def test_truncation_treated_as_termination_is_different():
    # the common bug: zero bootstrap at a time limit -> target 1.0 instead of 3.7
    _, ret = core.gae([1.0, 100.0], [2.0, 50.0], [3.0, 0.0], [1, 1], [1, 1], 0.9, 0.95)
    assert np.allclose(ret.numpy(), [1.0, 100.0])
    # and carrying across the reset mixes the next episode in
    _, ret = core.gae([1.0, 100.0], [2.0, 50.0], [3.0, 0.0], [0, 1], [0, 1], 0.9, 0.95)
    assert not np.allclose(ret.numpy()[0], 3.7)


def test_window_end_bootstraps_with_lambda_1():
    # a window that just ends: both flags 0, last next value from the critic
    _, ret = core.gae([0.0, 1.0], [0.4, 0.7], [0.7, 2.0], [0, 0], [0, 0], 0.9, 1.0)
    assert np.allclose(ret.numpy(), [2.52, 2.8])


# -------------------------------------- docs/theory.md#lambda-bias-and-variance


def _lambda_experiment(critic_scale=1.0):
    gamma = 0.99
    means = np.linspace(0.2, 0.9, 8)
    true_v = np.array([sum(gamma**k * means[t + k] for k in range(8 - t)) for t in range(8)])
    err = np.array([0.30, -0.90, 0.35, -0.25, 0.20, -0.15, 0.10, -0.05])
    return gamma, means, true_v, true_v + critic_scale * err


def _target0(rewards, values, gamma, lam):
    """V-target of s_0 for each column of rewards [8, E] through ppokit.core.gae."""
    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    n = rewards.shape[1]
    v = torch.as_tensor(values, dtype=torch.float64)[:, None].expand(8, n)
    nv = torch.cat([v[1:], torch.zeros(1, n, dtype=torch.float64)])
    done = torch.zeros(8, n)
    done[-1] = 1
    _, ret = core.gae(rewards, v, nv, done, done, gamma, lam)
    return ret[0]


@pytest.mark.parametrize("lam,bias,std", [
    (0.0, -0.8910, 0.8000), (0.5, -0.3814, 0.9207), (0.95, -0.0348, 1.8617), (1.0, 0.0, 2.1857)])
def test_analytic_bias_and_std_of_the_lambda_target(lam, bias, std):
    gamma, means, true_v, values = _lambda_experiment()
    # The target is linear in the rewards: its mean is the target of the mean rewards, and
    # with independent noise of std 0.8 its variance is 0.8^2 * sum of squared weights,
    # each weight read off as the target's response to a unit reward at step k.
    mean_target = float(_target0(means[:, None], values, gamma, lam)[0])
    base = float(_target0(np.zeros((8, 1)), values, gamma, lam)[0])
    weights = _target0(np.eye(8), values, gamma, lam).numpy() - base
    assert r4(mean_target - true_v[0]) == pytest.approx(bias, abs=1e-12)
    assert r4(0.8 * np.sqrt(np.sum(weights**2))) == pytest.approx(std, abs=1e-12)


def test_lambda_table_sampled_row():
    # seed 7, 20000 episodes: lambda = 0.5 gives mean 3.8265, bias -0.3818, std 0.9201,
    # mse 0.9924 (docs/theory.md has all four rows; one row pins the draw order).
    gamma, means, true_v, values = _lambda_experiment()
    noise = np.random.default_rng(7).normal(means, 0.8, size=(20000, 8))
    est = _target0(noise.T, values, gamma, 0.5).numpy()
    assert r4(est.mean()) == 3.8265
    assert r4(est.mean() - true_v[0]) == -0.3818
    assert r4(est.std()) == 0.9201
    assert r4(np.mean((est - true_v[0]) ** 2)) == 0.9924


# ----------------------------------------------------------- docs/theory.md#clip-table

CLIP_TABLE = [
    # ratio, A, ratio*A, clip*A, min, gradient is zero?
    (1.35, 1.0, 1.350, 1.200, 1.200, True),
    (0.65, 1.0, 0.650, 0.800, 0.650, False),
    (1.35, -1.0, -1.350, -1.200, -1.350, False),
    (0.65, -1.0, -0.650, -0.800, -0.800, True),
]


@pytest.mark.parametrize("ratio,adv,raw,clipped,objective,flat", CLIP_TABLE)
def test_clip_table(ratio, adv, raw, clipped, objective, flat):
    logp = torch.tensor([math.log(ratio)], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, dtype=torch.float64)
    out = core.clipped_surrogate_loss(logp, old, torch.tensor([adv], dtype=torch.float64))
    assert round(float(out.ratio.detach()) * adv, 3) == raw
    assert round(min(max(float(out.ratio.detach()), 0.8), 1.2) * adv, 3) == clipped
    assert round(-out.loss.item(), 3) == objective
    out.loss.backward()
    assert (float(logp.grad) == 0.0) is flat
    assert float(out.stats["clip_active_frac"]) == (1.0 if flat else 0.0)
    assert float(out.stats["clipfrac"]) == 1.0  # all four lie outside [0.8, 1.2]


# --------------------------------------------------- docs/theory.md#bernoulli-example


def _score_function_moments(baseline):
    """Mean and variance of the one-sample gradient (r - b) * d/dtheta log pi(a) for a
    Bernoulli policy p(good) = 0.8, rewards [1, 0], computed with autograd through
    ppokit's vanilla policy-gradient loss."""
    p_good, rewards = 0.8, [1.0, 0.0]
    theta0 = math.log(p_good / (1 - p_good))
    samples, probs = [], [p_good, 1 - p_good]
    for action, reward in enumerate(rewards):
        theta = torch.tensor(theta0, dtype=torch.float64, requires_grad=True)
        logp = torch.nn.functional.logsigmoid(theta if action == 0 else -theta).reshape(1)
        adv = torch.tensor([reward - baseline], dtype=torch.float64)
        out = core.vanilla_pg_loss(logp, logp.detach(), adv)
        (-out.loss).backward()
        samples.append(float(theta.grad))
    mean = sum(p * g for p, g in zip(probs, samples))
    var = sum(p * (g - mean) ** 2 for p, g in zip(probs, samples))
    return mean, var


@pytest.mark.parametrize("baseline,variance", [(0.0, 0.0064), (0.8, 0.0576), (0.2, 0.0)])
def test_baseline_example(baseline, variance):
    mean, var = _score_function_moments(baseline)
    assert r4(mean) == 0.16
    assert r4(var) == variance


# ---------------------------------------------------------------- KL figures


def test_unobserved_action_kl():
    old = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    new = torch.tensor([0.6, 0.4 - 1e-10, 1e-10], dtype=torch.float64)
    assert r4(new[0] / old[0]) == 1.2
    kl = core.categorical_kl(old, new, from_logits=False)
    assert r4(kl) == 5.2012
    # the k3 estimator's exact expectation under the old policy equals the KL
    k3 = core.kl_k3(torch.log(old), torch.log(new))
    assert abs(float((old * k3).sum()) - float(kl)) < 1e-12


def test_reference_kl_terms_are_not_clamped():
    cur = torch.tensor([0.8, 0.2], dtype=torch.float64)
    ref = torch.tensor([0.5, 0.5], dtype=torch.float64)
    terms = core.kl_k1(torch.log(cur), torch.log(ref))
    assert r4(terms).tolist() == [0.47, -0.9163]
    assert r4((cur * terms).sum()) == 0.1927
    assert r4(core.categorical_kl(cur, ref, from_logits=False)) == 0.1927
    # clamping the negative term would change the objective
    assert r4((cur * terms.clamp(min=0)).sum()) != 0.1927
