"""`ppokit demo`: every demo reproduces its documented figures with ppokit's code.

Expected values are the worked figures of docs/theory.md (and docs/demos.md),
compared at the precision
they were printed with (as formatted strings).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ppokit.cli import main
from ppokit.demos import bandit, baseline, clip, gae, kl, kl_vs_clip, rlhf
from ppokit.demos.cli import DEMOS


def f4(xs) -> list[str]:
    return [f"{float(x):.4f}" for x in np.atleast_1d(xs)]


# ------------------------------------------------------------------ gae


def test_fixed_trajectory_matches_the_documented_table():
    rows = {r.lam: r for r in gae.fixed_trajectory()}
    for r in rows.values():
        assert f4(r.deltas) == ["0.1445", "0.1430", "0.5970", "0.2000"]
    assert f4(rows[0.0].advantages) == ["0.1445", "0.1430", "0.5970", "0.2000"]
    assert f4(rows[0.5].advantages) == ["0.3858", "0.4875", "0.6960", "0.2000"]
    assert f4(rows[0.95].advantages) == ["0.9734", "0.8814", "0.7851", "0.2000"]
    assert f4(rows[1.0].advantages) == ["1.0652", "0.9300", "0.7950", "0.2000"]
    np.testing.assert_allclose(rows[0.5].targets, rows[0.5].advantages + gae.FIXED_VALUES)


# the docs/theory.md λ table: lambda -> (mean, bias, std, mse, theory_bias, theory_std, mean_SE)
BV_TABLE = {
    0.0: ("3.3133", "-0.8950", "0.7941", "1.4315", "-0.8910", "0.8000", "0.0057"),
    0.5: ("3.8265", "-0.3818", "0.9201", "0.9924", "-0.3814", "0.9207", "0.0065"),
    0.95: ("4.1767", "-0.0316", "1.8754", "3.5181", "-0.0348", "1.8617", "0.0132"),
    1.0: ("4.2130", "0.0048", "2.2029", "4.8529", "0.0000", "2.1857", "0.0155"),
}


def test_bias_variance_matches_the_documented_table():
    res = gae.bias_variance()
    assert (f"{res.true_v0:.4f}", f"{res.critic_v0:.4f}") == ("4.2083", "4.5083")
    assert [r.lam for r in res.rows] == [0.0, 0.5, 0.95, 1.0]
    for r in res.rows:
        got = tuple(f4([r.mean, r.bias, r.std, r.mse, r.theory_bias + 0.0, r.theory_std,
                        r.mean_se]))
        assert got == BV_TABLE[r.lam], r.lam


def _loop_targets(rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float):
    """A plain per-episode recursion, independent of ppokit.core.gae (terminal at the end)."""
    out = np.empty(len(rewards))
    for i, rew in enumerate(rewards):
        carry, t_len = 0.0, len(rew)
        for t in range(t_len - 1, -1, -1):
            nxt = values[t + 1] if t + 1 < t_len else 0.0
            carry = rew[t] + gamma * nxt - values[t] + gamma * lam * carry * (t + 1 < t_len)
        out[i] = carry + values[0]
    return out


def test_bias_variance_vectorised_targets_equal_a_per_episode_loop():
    # 300 episodes: same draws as the first 300 of a 300-episode run
    res = gae.bias_variance((0.0, 0.5, 0.95, 1.0), episodes=300, seed=3)
    mu = np.asarray(gae.REWARD_MEANS)
    v = gae.true_values(mu) + np.asarray(gae.CRITIC_ERROR)
    draws = np.random.default_rng(3).normal(mu, 0.8, size=(300, 8))
    for row in res.rows:
        est = _loop_targets(draws, v, 0.99, row.lam)
        assert row.mean == pytest.approx(est.mean(), abs=1e-12)
        assert row.std == pytest.approx(est.std(), abs=1e-12)


@pytest.mark.parametrize("lam", [0.0, 0.3, 0.95, 1.0])
def test_lambda_return_moments_against_gae_linearity(lam):
    # The target is linear in the rewards: its mean is the target at the mean rewards, and
    # its variance is sigma^2 times the squared gradient (probed with unit rewards).
    import torch

    from ppokit.core import gae as core_gae

    rng = np.random.default_rng(0)
    mu, v, sigma = rng.normal(size=5), rng.normal(size=5), 0.7
    nv, term = np.append(v[1:], 0.0), np.array([0, 0, 0, 0, 1.0])

    def target(r):
        return float(core_gae(torch.as_tensor(r), v, nv, term, term, 0.97, lam)[1][0])

    mean, bias, var = gae.lambda_return_moments(mu, v, sigma, 0.97, lam)
    assert mean == pytest.approx(target(mu), abs=1e-12)
    assert bias == pytest.approx(mean - sum(0.97**k * m for k, m in enumerate(mu)), abs=1e-12)
    grad = np.array([target(np.eye(5)[k]) - target(np.zeros(5)) for k in range(5)])
    assert var == pytest.approx(sigma**2 * grad @ grad, abs=1e-12)


def test_exercise_exact_critic_has_zero_analytic_bias():
    res = gae.bias_variance(critic_scale=0.0)
    stds = [r.std for r in res.rows]
    assert stds == sorted(stds)  # independent rewards, fixed critic: smaller lambda, smaller std
    for r in res.rows:
        assert abs(r.theory_bias) < 1e-12
        assert abs(r.bias) < 4 * r.mean_se


def test_exercise_low_noise_shrinks_the_monte_carlo_variance():
    loud, quiet = gae.bias_variance(), gae.bias_variance(sigma=0.1)
    assert f"{quiet.rows[-1].theory_std:.4f}" == "0.2732"
    assert quiet.rows[-1].std < loud.rows[-1].std / 7
    assert quiet.rows[-1].mse < quiet.rows[0].mse  # lambda=1 now beats lambda=0
    for r in loud.rows + quiet.rows:
        assert abs(r.bias - r.theory_bias) < 4 * r.mean_se


# ------------------------------------------------------------------ clip


def test_single_sample_clip_table():
    rows = clip.clip_rows(clip.TABLE_CASES)
    got = [(f"{r.unclipped:.3f}", f"{r.clipped:.3f}", f"{r.objective:.3f}",
            "yes" if r.grad_zero else "no") for r in rows]
    assert got[:4] == [("1.350", "1.200", "1.200", "yes"), ("0.650", "0.800", "0.650", "no"),
                       ("-1.350", "-1.200", "-1.350", "no"), ("-0.650", "-0.800", "-0.800", "yes")]
    assert [g[3] for g in got[4:]] == ["no", "no"]
    # outside the range on the wrong side: the full gradient A is kept
    assert rows[1].outside and rows[1].grad == pytest.approx(1.0)
    assert rows[2].outside and rows[2].grad == pytest.approx(-1.0)
    assert rows[0].grad == 0.0 and rows[3].grad == 0.0


def test_ratio_sweep_for_both_advantage_signs():
    rows = clip.clip_rows([(r, a) for r in clip.SWEEP_RATIOS for a in (1.0, -1.0)])
    pos = [f"{r.objective:+.2f}" for r in rows[0::2]]
    neg = [f"{r.objective:+.2f}" for r in rows[1::2]]
    assert pos == ["+0.50", "+0.80", "+1.00", "+1.20", "+1.20"]
    assert neg == ["-0.80", "-0.80", "-1.00", "-1.20", "-1.50"]
    assert [r.grad_zero for r in rows[0::2]] == [False, False, False, False, True]
    assert [r.grad_zero for r in rows[1::2]] == [True, False, False, False, False]


# ------------------------------------------------------------------ bandit


def _at(steps, epoch):
    s = steps[epoch - 1]
    assert s.epoch == epoch
    return tuple(f4([s.p_good, s.ratio_good, s.grad, s.kl]))


def test_bandit_matches_the_documented_figures():
    unclipped, clipped = bandit.bandit_run(False), bandit.bandit_run(True)
    assert len(unclipped) == len(clipped) == 40
    assert _at(unclipped, 3) == _at(clipped, 3) == ("0.6097", "1.2193", "0.4890", "0.0246")
    assert _at(unclipped, 40) == ("0.9492", "1.8984", "0.0990", "0.8231")
    assert _at(clipped, 40) == ("0.6097", "1.2193", "0.0000", "0.0246")


@pytest.mark.parametrize("theta", [-2.0, -0.1, 0.1, 0.2, 0.8, 2.0])
@pytest.mark.parametrize("clipped", [False, True])
def test_bandit_autograd_gradient_equals_finite_differences(theta, clipped):
    import torch

    def f(x):
        return float(bandit.bandit_objective(torch.tensor(x, dtype=torch.float64), clipped))

    fd = (f(theta + 1e-5) - f(theta - 1e-5)) / 2e-5
    p = 1 / (1 + math.exp(-theta))
    # zero only past the edge in the favoured direction; below p = 0.4 both arms are
    # outside the range on the wrong side and keep their gradient
    expected = 0.0 if clipped and p > 0.6 else 2 * p * (1 - p)
    assert bandit._grad(theta, clipped, 0.2) == pytest.approx(fd, abs=1e-8)
    assert bandit._grad(theta, clipped, 0.2) == pytest.approx(expected, abs=1e-12)


def test_bandit_exercises_smaller_lr_and_target_kl():
    slow = bandit.bandit_run(True, lr=0.03)
    first_zero = next(s.epoch for s in slow if s.grad == 0.0)
    stop = slow[first_zero - 2]
    assert 1.2 < stop.ratio_good < 1.2193  # stops closer to the edge than at lr 0.3
    assert f"{stop.ratio_good:.4f}" == "1.2043" and stop.epoch == 28
    for clipped in (False, True):
        run = bandit.bandit_run(clipped, target_kl=0.02)
        assert run[-1].epoch == 3 and run[-1].kl > 0.02 and run[-2].kl <= 0.02
    assert bandit.bandit_run(False, lr=0.03, target_kl=0.02)[-1].epoch == 28
    assert len(bandit.bandit_run(False, target_kl=10.0)) == 40  # never exceeded


# ------------------------------------------------------------------ baselines


def test_exact_bernoulli_baseline_example():
    probs, rewards = [0.8, 0.2], [1.0, 0.0]
    scores = baseline.bernoulli_scores(0.8)
    np.testing.assert_allclose(scores, [0.2, -0.8], atol=1e-12)
    b_star = baseline.optimal_baseline(probs, rewards, scores)
    assert f"{b_star:.4f}" == "0.2000"
    got = [baseline.exact_baseline_moments(probs, rewards, scores, b) for b in (0.0, 0.8, b_star)]
    assert [f"{m:.2f}" for m, _ in got] == ["0.16"] * 3
    assert [f"{v:.4f}" for _, v in got] == ["0.0064", "0.0576", "0.0000"]


def test_sampled_baseline_variance_ratio_and_draws_match_generator_choice():
    bv = baseline.baseline_variance()
    assert f"{bv.ratio:.2f}" == "0.42"
    assert f"{bv.ratio:.6f}" == "0.422891"
    np.testing.assert_allclose(bv.mean_no_baseline, bv.mean_baseline, atol=0.01)
    # the vectorised draws are exactly what choice(2, p) then random() give in a loop
    rng = np.random.default_rng(0)
    p, pi = np.array([0.25, 0.75]), np.array([0.5, 0.5])
    g = []
    for _ in range(2000):
        a = rng.choice(2, p=pi)
        r = float(rng.random() < p[a])
        gl = -pi.copy()
        gl[a] += 1.0
        g.append(gl * r)
    assert bv.var_no_baseline == np.array(g).var(0).sum()


def test_offset_trajectories_equal_a_sequential_loop():
    def loop(seed, use_b, steps=400):
        rng = np.random.default_rng(seed)
        p, theta, out = np.array([0.1, 0.9]), np.zeros(2), []
        for _ in range(steps):
            e = np.exp(theta - theta.max())
            pi = e / e.sum()
            a = rng.choice(2, p=pi)
            r = float(rng.random() < p[a]) + 5.0
            adv = r - ((pi * p).sum() + 5.0 if use_b else 0.0)
            g = -pi.copy()
            g[a] += 1.0
            theta += 0.1 * g * adv
            e = np.exp(theta - theta.max())
            out.append((e / e.sum())[1])
        return np.array(out)

    for use_b in (True, False):
        vec = baseline.offset_trajectories([1, 3], use_b)
        np.testing.assert_array_equal(vec[0], loop(1, use_b))
        np.testing.assert_array_equal(vec[1], loop(3, use_b))


def test_offset_jitter_experiment():
    oj = baseline.offset_jitter()
    assert oj.final_pi_good_seed1 > 0.9
    assert oj.ratio < 0.01
    assert f"{oj.ratio:.6f}" == "0.001444"
    assert oj.wrong_arm_baseline == 0 < oj.wrong_arm_no_baseline


# ------------------------------------------------------------------ kl


def test_unobserved_action_counter_example():
    u = kl.unobserved_action()
    assert f"{u.observed_ratio:.4f}" == "1.2000"
    assert f"{u.exact_kl:.4f}" == "5.2012"
    assert u.k3_expectation == pytest.approx(u.exact_kl, abs=1e-12)
    assert u.k1_expectation == pytest.approx(u.exact_kl, abs=1e-12)
    assert u.k3_terms[0] < 0.02  # the observed sample alone sees almost nothing


def test_reference_kl_terms_are_signed():
    r = kl.reference_terms()
    assert f4(r.terms) == ["0.4700", "-0.9163"]
    assert f"{r.mean:.4f}" == "0.1927" == f"{r.exact_kl:.4f}"
    assert f"{r.clamped_mean:.4f}" == "0.3760"


# ------------------------------------------------------------------ kl vs clip


def test_kl_penalty_maximisers():
    rows = {m.beta: m for m in kl_vs_clip.maximisers()}
    for m in rows.values():
        if math.isinf(m.r_pos):
            assert math.isinf(m.r_pos_numeric) and m.beta <= 1
        else:
            assert m.r_pos_numeric == pytest.approx(m.r_pos, rel=1e-6)
            assert m.r_pos > 1
        assert m.r_neg_numeric == pytest.approx(m.r_neg, rel=1e-6)
        assert m.r_neg < 1
    assert rows[6.0].r_pos == pytest.approx(1.2) and rows[4.0].r_neg == pytest.approx(0.8)
    # a stiffer spring keeps r* closer to 1 on both sides
    finite = [rows[b] for b in sorted(rows) if b > 1]
    assert [m.r_pos for m in finite] == sorted((m.r_pos for m in finite), reverse=True)
    assert [m.r_neg for m in finite] == sorted(m.r_neg for m in finite)


def test_kl_penalty_objective_and_clip_objective_values():
    r = np.array([0.5, 1.0, 1.5])
    np.testing.assert_allclose(kl_vs_clip.kl_objective(r, 1.0, 2.0),
                               r - 2.0 * (r - 1 - np.log(r)), atol=1e-12)
    np.testing.assert_allclose(kl_vs_clip.clip_objective(r, -1.0), [-0.8, -1.0, -1.5])


# ------------------------------------------------------------------ rlhf objective


def test_rlhf_objective_closed_form_and_ascent_agree():
    rows = rlhf.rlhf_sweep()
    for row in rows:
        assert row.max_gap < 1e-9
        assert row.pi.sum() == pytest.approx(1.0)
    best = int(np.argmax(rlhf.REWARDS))
    assert rows[0].beta == 0.01 and rows[0].pi[best] > 0.999
    assert rows[-1].beta == 100 and np.abs(rows[-1].pi - rlhf.REFERENCE).max() < 0.005
    kls = [r.kl for r in rows]
    assert kls == sorted(kls, reverse=True)  # larger beta, closer to the reference


def test_rlhf_closed_form_beats_other_distributions():
    rng = np.random.default_rng(1)
    for beta in (0.1, 1.0, 10.0):
        j_star = rlhf.objective(rlhf.closed_form(beta), beta)[0]
        for pi in rng.dirichlet(np.ones(5), size=200):
            assert rlhf.objective(pi, beta)[0] <= j_star + 1e-12


# ------------------------------------------------------------------ CLI


def test_cli_bias_variance_prints_the_table(capsys):
    assert main(["demo", "bias-variance"]) == 0
    out = capsys.readouterr().out
    assert "true_V0=4.2083  critic_V0=4.5083" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("0.50 "))
    assert line.split() == ["0.50", "3.8265", "-0.3818", "0.9201", "0.9924", "-0.3814",
                            "0.9207", "0.9932", "0.0065"]


def test_cli_bandit_options(capsys):
    assert main(["demo", "bandit", "--lr", "0.03", "--target-kl", "0.02"]) == 0
    out = capsys.readouterr().out
    assert "target_kl 0.02 (unclipped): stops after epoch 28" in out
    assert "last moving step is epoch 28 (ratio 1.2043" in out


# reward-hacking trains language models for minutes; tests/test_llm_demo.py runs it on a
# tiny budget, and its bad options are checked below.
@pytest.mark.parametrize("name", [n for n in DEMOS if n not in ("figures", "reward-hacking")])
def test_cli_every_demo_runs(name, capsys):
    assert main(["demo", name]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") > 5 and "nan" not in out.lower()


def test_cli_key_figures_in_output(capsys):
    expected = {
        "gae": ["[ 0.9734  0.8814  0.7851  0.2000]"],
        "kl": ["5.2012", "0.4700", "-0.9163", "0.1927"],
        "baseline": ["0.0064", "0.0576", "0.422891"],
    }
    for name, needles in expected.items():
        assert main(["demo", name]) == 0
        out = capsys.readouterr().out
        for n in needles:
            assert n in out, (name, n)


def test_cli_reward_hacking_rejects_bad_options(capsys):
    assert main(["demo", "reward-hacking", "--beta", "0"]) == 2
    assert "--beta" in capsys.readouterr().err
    assert main(["demo", "reward-hacking", "--iterations", "0"]) == 2


def test_cli_without_a_name_lists_the_demos(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in DEMOS)


@pytest.mark.parametrize("argv", [
    ["demo", "bandit", "--lr", "0"],
    ["demo", "bandit", "--lr", "nan"],
    ["demo", "bandit", "--target-kl", "-1"],
    ["demo", "bandit", "--epochs", "0"],
    ["demo", "clip", "--eps", "1.5"],
    ["demo", "bias-variance", "--episodes", "0"],
    ["demo", "bias-variance", "--sigma", "-0.1"],
    ["demo", "bias-variance", "--critic-scale", "inf"],
    ["demo", "baseline", "--draws", "1"],
])
def test_cli_bad_values_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and "--" in err


@pytest.mark.parametrize("argv", [
    ["demo", "no-such-demo"],
    ["demo", "bandit", "--lr", "fast"],
    ["demo", "gae", "--lr", "0.1"],  # an option the demo does not take
    ["demo", "figures"],  # --out is required
])
def test_cli_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_figures_write_nonempty_pngs(tmp_path, capsys):
    out = tmp_path / "figs"
    assert main(["demo", "figures", "--out", str(out)]) == 0
    files = sorted(out.glob("*.png"))
    names = {f.name for f in files}
    assert {"gae_bias_variance.png", "ppo_clip_sign.png", "bandit_trajectories.png",
            "kl_vs_clip.png", "rlhf_objective.png", "optimal_baseline.png", "reward_to_go.png",
            "learned_baseline.png"} <= names
    import matplotlib.image

    for f in files:
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = matplotlib.image.imread(f)
        assert img.shape[1] > 800 and img.shape[0] > 400
        assert img[..., :3].std() > 0.05  # not a blank canvas
    assert str(out) in capsys.readouterr().out


def test_figures_bad_out_dir_exits_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["demo", "figures", "--out", str(blocker / "sub")]) == 2
