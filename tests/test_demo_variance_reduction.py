"""The variance-reduction demos: optimal baseline, reward-to-go, learned baseline.

Every claim a demo prints is checked against something computed independently here: a
brute-force sweep, Monte Carlo draws, a per-episode loop, finite differences, or the
existing demos' own functions.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ppokit.cli import main
from ppokit.demos import bandit, baseline, learned_baseline, optimal_baseline, reward_to_go
from ppokit.demos.optimal_baseline import estimator_moments, optimal_constant_baseline

# ------------------------------------------------------------------ optimal baseline


@pytest.fixture(scope="module")
def ob_cases():
    return {sd: optimal_baseline.optimal_baseline_cases(offset=5.0, reward_sd=sd)
            for sd in (0.0, 0.5)}


@pytest.mark.parametrize("sd", [0.0, 0.5])
def test_b_star_is_the_argmin_of_the_exact_sweep_and_beats_none_and_v(ob_cases, sd):
    cases = ob_cases[sd]
    assert len(cases) == 2 * len(optimal_baseline.BANDIT_EPOCHS) + 1
    for c in cases:
        assert abs(c.sweep_argmin - c.b_star) <= c.grid_step, c.label
        assert c.sweep_b[0] < c.b_star < c.sweep_b[-1]
        assert c.var_star <= c.sweep_var.min() + 1e-12
        assert c.var_star <= c.var_none + 1e-12 and c.var_star <= c.var_value + 1e-12
        # the minimum is strict: moving b by a grid step in either direction costs variance
        assert c.variance(c.b_star - c.grid_step) > c.var_star
        assert c.variance(c.b_star + c.grid_step) > c.var_star
        # noise on the reward adds E[g^2] sd^2 to every variance and does not move b*
        e_g2 = float(c.probs @ c.scores**2)
        assert c.var_star == pytest.approx(e_g2 * sd**2, abs=1e-12)


def test_variance_is_a_parabola_around_b_star(ob_cases):
    rng = np.random.default_rng(0)
    for c in ob_cases[0.5]:
        e_g2 = float(c.probs @ c.scores**2)
        bs = rng.normal(c.b_star, 3.0, size=20)
        np.testing.assert_allclose(c.variance(bs), c.var_star + e_g2 * (bs - c.b_star) ** 2,
                                   rtol=1e-10, atol=1e-12)
        # the mean gradient does not depend on b
        means = [estimator_moments(c.probs, c.means, c.scores, b, c.reward_var)[0] for b in bs]
        np.testing.assert_allclose(np.ravel(means), c.mean_grad, atol=1e-12)


def test_bandit_cases_use_the_bandit_demo_policies_and_rewards(ob_cases):
    run = bandit.bandit_run(False)
    n = len(optimal_baseline.BANDIT_EPOCHS)
    for c, e in zip(ob_cases[0.0][:n], optimal_baseline.BANDIT_EPOCHS):
        p = 0.5 if e == 0 else run[e - 1].p_good
        assert c.probs[0] == p
        np.testing.assert_array_equal(c.means, bandit.ADVANTAGES)
        # one logit, two arms: b* weights each reward by the other arm's probability
        assert c.b_star == pytest.approx((1 - p) * c.means[0] + p * c.means[1], abs=1e-12)
        assert c.value == pytest.approx(p * c.means[0] + (1 - p) * c.means[1], abs=1e-12)
    # an offset moves V and b* with it and leaves their variances alone
    for plain, shifted in zip(ob_cases[0.0][:n], ob_cases[0.0][n:2 * n]):
        assert shifted.b_star == pytest.approx(plain.b_star + 5.0, abs=1e-12)
        assert shifted.value == pytest.approx(plain.value + 5.0, abs=1e-12)
        assert shifted.var_value == pytest.approx(plain.var_value, abs=1e-12)
        assert shifted.var_star == pytest.approx(plain.var_star, abs=1e-12)
        assert shifted.var_none >= plain.var_none
    # away from the uniform policy V is worse than b*, and with the offset far better than none
    for c in ob_cases[0.0][n + 1:2 * n]:
        assert c.var_star < c.var_value < c.var_none / 5


def test_bernoulli_case_agrees_with_the_baseline_demo(ob_cases):
    c = ob_cases[0.0][-1]
    probs, rewards = [0.8, 0.2], [1.0, 0.0]
    scores = baseline.bernoulli_scores(0.8)
    assert c.b_star == pytest.approx(baseline.optimal_baseline(probs, rewards, scores), abs=1e-12)
    for b, var in ((0.0, c.var_none), (0.8, c.var_value), (c.b_star, c.var_star)):
        mean, ref = baseline.exact_baseline_moments(probs, rewards, scores, b)
        assert var == pytest.approx(ref, abs=1e-12)
        assert c.mean_grad == pytest.approx(mean, abs=1e-12)


def test_estimator_moments_against_monte_carlo_for_a_vector_score():
    # three actions, softmax over three logits, noisy rewards: an independent sampled check
    rng = np.random.default_rng(5)
    probs = np.array([0.2, 0.5, 0.3])
    means = np.array([2.0, -1.0, 0.5])
    sds = np.array([0.3, 1.0, 0.0])
    scores = np.eye(3) - probs  # d log softmax / d logits
    b = 0.7
    mean, var = estimator_moments(probs, means, scores, b, sds**2)
    n = 400_000
    a = rng.choice(3, p=probs, size=n)
    r = rng.normal(means[a], sds[a])
    est = scores[a] * (r - b)[:, None]
    se = est.std(0) / math.sqrt(n)
    assert np.all(np.abs(est.mean(0) - mean) < 4 * se)
    assert est.var(0).sum() == pytest.approx(var, rel=0.01)
    # b* minimises the total variance over a brute-force grid
    b_star = optimal_constant_baseline(probs, means, scores)
    grid = np.linspace(-3, 3, 6001)
    sweep = estimator_moments(probs[None], means[None], scores[None], grid, (sds**2)[None])[1]
    assert abs(grid[np.argmin(sweep)] - b_star) <= grid[1] - grid[0]


def test_cli_optimal_baseline_prints_the_computed_values(capsys):
    assert main(["demo", "optimal-baseline", "--offset", "3", "--reward-sd", "0.2"]) == 0
    out = capsys.readouterr().out
    cases = optimal_baseline.optimal_baseline_cases(offset=3.0, reward_sd=0.2)
    for c in cases:
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(c.label))
        cells = line[len(line) - len(line.lstrip()) + len(c.label):].split()
        assert [float(x) for x in cells] == pytest.approx(
            [c.probs[0], c.mean_grad, c.value, c.b_star, c.var_none, c.var_value, c.var_star,
             c.sweep_argmin], abs=6e-5)
    assert "offset +3" in out and "<- lowest on this grid" in out


# ------------------------------------------------------------------ reward-to-go


@pytest.fixture(scope="module")
def rtg():
    return reward_to_go.reward_to_go_experiment()


@pytest.mark.parametrize("theta,gamma", [((0.0, 0.0), 1.0), ((0.7, -1.2), 1.0),
                                         ((0.0, 0.0), 0.9), ((-0.5, 0.4), 0.5)])
def test_rtg_exact_means_are_the_gradient_and_variance_is_lower(theta, gamma):
    full = reward_to_go.enumerate_trajectories(theta)
    assert full.weight.sum() == pytest.approx(1.0, abs=1e-12)
    whole, rtg_est = reward_to_go.estimators(full, theta, gamma)
    p = full.weight
    j, grad = reward_to_go.exact_gradient(theta, gamma)
    np.testing.assert_allclose(p @ whole, grad, rtol=0, atol=1e-12)
    # the reward-to-go side carries discount_weights' float32 gamma^t (relative 1e-7)
    np.testing.assert_allclose(p @ rtg_est, grad, rtol=0, atol=1e-12 if gamma == 1 else 1e-7)
    var_whole = p @ (whole - grad) ** 2
    var_rtg = p @ (rtg_est - grad) ** 2
    assert np.all(var_rtg < var_whole)
    # J itself: the probability-weighted discounted returns of all episodes
    disc = gamma ** np.arange(reward_to_go.HORIZON)
    assert j == pytest.approx(p @ (disc @ full.rewards), abs=1e-12)


def test_rtg_exact_gradient_equals_finite_differences():
    theta = np.array([0.3, -0.8])
    h = 1e-6
    _, grad = reward_to_go.exact_gradient(theta, 0.9)
    for i in range(2):
        e = np.eye(2)[i] * h
        fd = (reward_to_go.exact_gradient(theta + e, 0.9)[0]
              - reward_to_go.exact_gradient(theta - e, 0.9)[0]) / (2 * h)
        assert grad[i] == pytest.approx(fd, abs=1e-7)


def test_rtg_estimators_equal_a_per_episode_loop():
    theta, gamma = (0.4, -0.3), 0.8
    tr = reward_to_go.sample_trajectories(theta, episodes=300, seed=11)
    whole, rtg_est = reward_to_go.estimators(tr, theta, gamma)
    for j in range(300):
        steps = np.flatnonzero(tr.alive[:, j])
        r = tr.rewards[steps, j]
        sc = []
        for t in steps:
            s, a = tr.states[t, j], tr.actions[t, j]
            p1 = 1 / (1 + math.exp(-theta[s]))
            g = np.zeros(2)
            g[s] = a - p1  # d log pi(a|s) / d theta_s for pi(1|s) = sigmoid(theta_s)
            sc.append(g)
        g_tau = sum(gamma**t * r[t] for t in range(len(r)))
        g_t = [sum(gamma ** (k - t) * r[k] for k in range(t, len(r))) for t in range(len(r))]
        np.testing.assert_allclose(whole[j], sum(sc) * g_tau, rtol=0, atol=1e-12)
        np.testing.assert_allclose(  # gamma^t from discount_weights is float32
            rtg_est[j], sum(gamma**t * g_t[t] * sc[t] for t in range(len(r))), rtol=0,
            atol=1e-6)
        assert tr.episode_end[steps[-1], j] and tr.episode_end[:, j].sum() == 1


def test_rtg_sampling_matches_the_enumerated_distribution():
    tr = reward_to_go.sample_trajectories(episodes=50_000, seed=2)
    full = reward_to_go.enumerate_trajectories()
    lengths = tr.alive.sum(0)
    exact = {n: full.weight[full.alive.sum(0) == n].sum() for n in range(1, 6)}
    for n, prob in exact.items():
        share = (lengths == n).mean()
        assert abs(share - prob) < 4 * math.sqrt(prob * (1 - prob) / len(lengths)) + 1e-12


def test_rtg_sampled_variance_lower_and_means_agree_within_their_errors(rtg):
    k = 4.0
    for i in range(2):
        # the claims the demo prints
        assert (rtg.var["rtg"][i] + k * rtg.var_se["rtg"][i]
                < rtg.var["whole"][i] - k * rtg.var_se["whole"][i])
        assert abs(rtg.diff_mean[i]) < k * rtg.diff_se[i]
        # and the sampled numbers agree with the exact ones within their printed errors
        for key in ("whole", "rtg"):
            assert abs(rtg.mean[key][i] - rtg.grad[i]) < k * rtg.mean_se[key][i]
            assert abs(rtg.var[key][i] - rtg.exact_var[key][i]) < k * rtg.var_se[key][i]
            assert rtg.exact_mean[key][i] == pytest.approx(rtg.grad[i], abs=1e-12)
        assert rtg.exact_var["rtg"][i] < rtg.exact_var["whole"][i]


def test_rtg_standard_errors_are_honest():
    # over independent seeds, the spread of the sampled means matches the printed SE
    means = []
    ses = []
    for seed in range(30):
        tr = reward_to_go.sample_trajectories(episodes=2000, seed=100 + seed)
        _, est = reward_to_go.estimators(tr)
        means.append(est.mean(0))
        ses.append(est.std(0, ddof=1) / math.sqrt(2000))
    ratio = np.std(means, axis=0, ddof=1) / np.mean(ses, axis=0)
    assert np.all((0.6 < ratio) & (ratio < 1.5))


def test_cli_reward_to_go_prints_the_verdicts(capsys):
    assert main(["demo", "reward-to-go", "--episodes", "5000", "--seed", "1",
                 "--gamma", "0.9"]) == 0
    out = capsys.readouterr().out
    res = reward_to_go.reward_to_go_experiment(episodes=5000, seed=1, gamma=0.9)
    assert "means agree within 3 SE: yes" in out
    assert "variance lower by more than 3 SE each: yes" in out
    assert f"{res.exact_var['rtg'][1]:.4f}" in out and f"{res.grad[0]:+.4f}" in out
    for name in reward_to_go.STATES:
        assert name in out


# ------------------------------------------------------------------ learned baseline


@pytest.fixture(scope="module")
def lb():
    return learned_baseline.learned_baseline_experiment()


def test_exact_and_no_baseline_runs_reproduce_the_baseline_demo():
    for mode, use_b in (("none", False), ("exact", True)):
        runs = learned_baseline.reinforce_runs([0, 4, 9], mode)
        np.testing.assert_array_equal(runs.pi_good,
                                      baseline.offset_trajectories([0, 4, 9], use_b))


def test_v_hat_is_a_running_average_of_the_rewards():
    alpha, offset = 0.1, 2.0
    runs = learned_baseline.reinforce_runs([3, 7], "learned", alpha=alpha, offset=offset,
                                           v0=1.0, steps=200)
    v = runs.baseline
    assert np.all(v[:, 0] == 1.0)
    r = (v[:, 1:] - (1 - alpha) * v[:, :-1]) / alpha  # the reward each update saw
    np.testing.assert_allclose(np.minimum(np.abs(r - offset), np.abs(r - offset - 1)), 0,
                               atol=1e-9)


@pytest.mark.parametrize("offset", [0.0, 5.0])
def test_v_hat_converges_to_the_policy_value_plus_the_offset(offset):
    res = learned_baseline.learned_baseline_experiment(offset=offset)
    lr = res.runs["learned"]
    half = res.steps // 2
    err = lr.baseline - lr.target
    # the target includes the offset; V_hat starts at 0, far from it when offset = 5
    assert np.all(lr.target >= offset + 0.1 - 1e-12) and np.all(lr.target <= offset + 0.9)
    assert res.tracking[0].abs_err == pytest.approx(offset + 0.5, abs=1e-12)
    # after warm-up it stays within its own scatter of the target, with no lasting lag
    assert res.late_abs_err < 1.5 * res.noise_sd
    assert abs(res.late_lag) < 0.02
    assert np.abs(err[:, half:].mean(0)).max() < 0.06  # seed-average tracks at every step
    assert res.tracking[-1].abs_err < 0.1


def test_learned_baseline_variance_against_exact_and_none(lb):
    v = lb.variance
    half = lb.steps // 2
    # over the whole run the three are told apart: none >> learned > exact
    none, learned = v["none"], v["learned"]
    assert none.all_mean - 3 * none.all_se > learned.all_mean + 3 * learned.all_se
    assert lb.diff_all[0] > 3 * lb.diff_all[1] > 0
    # after warm-up the learned baseline keeps the exact baseline's variance
    assert abs(lb.diff_late[0]) < 4 * lb.diff_late[1]
    assert v["learned"].late_mean < v["none"].late_mean / 10
    assert v["learned"].wrong_arm == v["exact"].wrong_arm == 0 < v["none"].wrong_arm
    # the sampled squared errors estimate the exact conditional variance
    for m, runs in lb.runs.items():
        for sl in (slice(None), slice(half, None)):
            d = (runs.sq_err[:, sl] - runs.cond_var[:, sl]).mean(1)
            assert abs(d.mean()) < 4 * d.std(ddof=1) / math.sqrt(len(d)), m


def test_conditional_variance_against_direct_enumeration():
    # one step of the exact formula, recomputed by listing the four (action, reward) outcomes
    runs = learned_baseline.reinforce_runs([2], "learned", steps=60)
    p = np.array(learned_baseline.P_SUCCESS)
    offset = 5.0
    pi_before = np.concatenate([[0.5], runs.pi_good[0, :-1]])
    for t in (0, 10, 59):
        pi = np.array([1 - pi_before[t], pi_before[t]])
        b = runs.baseline[0, t]
        outcomes = [(pi[a] * (p[a] if hit else 1 - p[a]), (np.eye(2)[a] - pi) * (hit + offset - b))
                    for a in (0, 1) for hit in (0, 1)]
        mean = sum(w * x for w, x in outcomes)
        var = sum(w * ((x - mean) ** 2).sum() for w, x in outcomes)
        assert runs.cond_var[0, t] == pytest.approx(var, rel=1e-9)
        assert runs.target[0, t] == pytest.approx(pi @ p + offset, abs=1e-12)


def test_cli_learned_baseline_prints_tracking_and_variances(capsys):
    assert main(["demo", "learned-baseline", "--seeds", "20", "--steps", "300",
                 "--alpha", "0.1", "--v0", "5"]) == 0
    out = capsys.readouterr().out
    res = learned_baseline.learned_baseline_experiment(n_seeds=20, steps=300, alpha=0.1, v0=5.0)
    assert f"mean |V_hat - V| = {res.late_abs_err:.4f}" in out
    for m in learned_baseline.MODES:
        assert f"{res.variance[m].late_mean:.4f} +- {res.variance[m].late_se:.4f}" in out
    assert "seeds 0..19" in out and "steps 151..300" in out


@pytest.mark.parametrize("argv", [
    ["demo", "optimal-baseline", "--reward-sd", "-1"],
    ["demo", "optimal-baseline", "--offset", "inf"],
    ["demo", "reward-to-go", "--gamma", "1.5"],
    ["demo", "reward-to-go", "--episodes", "1"],
    ["demo", "reward-to-go", "--seed", "-1"],
    ["demo", "learned-baseline", "--alpha", "0"],
    ["demo", "learned-baseline", "--alpha", "1.5"],
    ["demo", "learned-baseline", "--eta", "-0.1"],
    ["demo", "learned-baseline", "--seeds", "1"],
    ["demo", "learned-baseline", "--seeds", "10000", "--steps", "1000"],
])
def test_cli_new_demos_reject_bad_values(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and "--" in err
