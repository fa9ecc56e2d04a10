"""PNG figures for the demos (matplotlib, Agg backend; nothing is shown on screen)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["FIGURES", "write_figures"]

FIG_LAMBDAS = (0.0, 0.25, 0.5, 0.75, 0.95, 1.0)


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "figure.dpi": 100})
    return plt


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=150, facecolor="white", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def gae_bias_variance_figure(path: Path) -> Path:
    from .gae import bias_variance

    plt = _plt()
    res = bias_variance(FIG_LAMBDAS)
    lam = np.array([r.lam for r in res.rows])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6))
    ax1.plot(lam, [abs(r.bias) for r in res.rows], "o-", color="C0", label="|bias|, empirical")
    ax1.plot(lam, [abs(r.theory_bias) for r in res.rows], ":", color="C0", lw=2,
             label="|bias|, analytic")
    ax1.plot(lam, [r.std for r in res.rows], "s-", color="C1", label="std, empirical")
    ax1.plot(lam, [r.theory_std for r in res.rows], ":", color="C1", lw=2,
             label="std, analytic")
    ax1.set_ylabel("reward units")
    ax1.set_title("|bias| and standard deviation of the target")
    ax2.plot(lam, [r.mse for r in res.rows], "^-", color="C2", label="MSE, empirical")
    ax2.plot(lam, [r.theory_mse for r in res.rows], ":", color="C2", lw=2,
             label="MSE, analytic")
    best = min(res.rows, key=lambda r: r.mse)
    ax2.annotate(f"lowest of these: lambda={best.lam:g}", (best.lam, best.mse),
                 xytext=(0.25, 0.45), textcoords="axes fraction",
                 arrowprops={"arrowstyle": "->", "color": "0.4"})
    ax2.set_ylabel("squared reward units")
    ax2.set_title("mean squared error = bias^2 + variance")
    for ax in (ax1, ax2):
        ax.set_xlabel("GAE lambda")
        ax.set_xticks((0.0, 0.25, 0.5, 0.75, 1.0))
        ax.grid(alpha=0.3)
        ax.legend(frameon=False)
    fig.suptitle(f"GAE value target for V(s0): fixed critic errors, independent reward noise "
                 f"(seed {res.seed}, {res.episodes} episodes, sigma {res.sigma:g})")
    fig.tight_layout()
    return _save(fig, path)


def clip_sign_figure(path: Path, eps: float = 0.2) -> Path:
    from .clip import surrogate_curve

    plt = _plt()
    r = np.linspace(0.4, 1.6, 601)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharex=True)
    for ax, adv in zip(axes, (1.0, -1.0)):
        ax.axvspan(1 - eps, 1 + eps, color="C0", alpha=0.10, label=f"[1-eps, 1+eps], eps={eps:g}")
        ax.plot(r, r * adv, "--", color="0.45", lw=1.5, label="unclipped ratio*A")
        ax.plot(r, surrogate_curve(r, adv, eps), color="C3", lw=2.5, label="PPO-Clip objective")
        ax.axvline(1.0, color="black", lw=0.8, alpha=0.5)
        if adv > 0:
            ax.annotate("flat: gradient 0\n(good action already up)", (1.4, 1 + eps),
                        xytext=(1.15, 0.6), arrowprops={"arrowstyle": "->"})
            ax.annotate("still sloped:\ncorrects a drop", (0.55, 0.55), xytext=(0.45, 1.1),
                        arrowprops={"arrowstyle": "->"})
        else:
            ax.annotate("flat: gradient 0\n(bad action already down)", (0.6, -(1 - eps)),
                        xytext=(0.45, -1.35), arrowprops={"arrowstyle": "->"})
            ax.annotate("still sloped:\npenalty keeps growing", (1.45, -1.45),
                        xytext=(1.1, -0.6), arrowprops={"arrowstyle": "->"})
        ax.set_title(f"advantage A = {adv:+.0f}")
        ax.set_xlabel("probability ratio new / old")
        ax.grid(alpha=0.25)
    axes[0].set_ylabel("per-sample surrogate")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.suptitle("PPO-Clip is one-sided: the flat side depends on the sign of the advantage")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False)
    return _save(fig, path)


def bandit_figure(path: Path) -> Path:
    from .bandit import bandit_run

    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6))
    for lr, style in ((0.3, "-"), (0.03, "--")):
        for mode, color in (("unclipped", "C0"), ("PPO-Clip", "C3")):
            steps = bandit_run(mode == "PPO-Clip", epochs=40, lr=lr)
            ep = [0] + [s.epoch for s in steps]
            ax1.plot(ep, [0.5] + [s.p_good for s in steps], style, color=color,
                     label=f"{mode}, lr {lr:g}")
            ax2.plot(ep[1:], [s.kl for s in steps], style, color=color,
                     label=f"{mode}, lr {lr:g}")
    ax1.axhline(0.6, color="0.3", lw=0.8, ls=":")
    ax1.text(40, 0.515, "dotted: clip edge, ratio 1.2 (p = 0.6)", ha="right", va="bottom",
             fontsize=9)
    ax1.set_ylabel("p(good) after the epoch")
    ax1.set_title("probability of the good arm")
    ax2.axhline(0.02, color="0.3", lw=0.8, ls=":")
    ax2.text(40, 0.015, "target_kl 0.02", ha="right", va="top", fontsize=9)
    ax2.set_yscale("log")
    ax2.set_ylabel("KL(old || new), log scale")
    ax2.set_title("distance from the old policy")
    for ax in (ax1, ax2):
        ax.set_xlabel("epoch on the same batch")
        ax.grid(alpha=0.3)
    ax1.legend(frameon=False, loc="center right")
    ax2.legend(frameon=False, loc="lower right")
    fig.suptitle("Two-arm bandit, advantages (+1, -1), exact expectation over the old policy")
    fig.tight_layout()
    return _save(fig, path)


def kl_vs_clip_figure(path: Path, eps: float = 0.2) -> Path:
    from .kl_vs_clip import clip_objective, kl_maximiser, kl_objective

    plt = _plt()
    r = np.linspace(0.3, 2.5, 801)
    betas = (1.0, 2.0, 4.0, 6.0, 20.0)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), sharex=True)
    for ax, adv in zip(axes, (1.0, -1.0)):
        ax.axvspan(1 - eps, 1 + eps, color="C0", alpha=0.08)
        ax.plot(r, clip_objective(r, adv, eps), color="black", lw=2.5,
                label=f"clip, eps={eps:g} (guard rail)")
        for i, b in enumerate(betas):
            color = plt.cm.viridis(i / (len(betas) - 1) * 0.9)
            ax.plot(r, kl_objective(r, adv, b), color=color, lw=1.6,
                    label=f"KL penalty, beta={b:g} (spring)")
            rs = kl_maximiser(adv, b)
            if np.isfinite(rs) and r[0] <= rs <= r[-1]:
                ax.plot([rs], kl_objective(np.array([rs]), adv, b), "o", color=color, ms=6)
        ax.axvline(1.0, color="black", lw=0.8, alpha=0.4)
        ax.set_ylim(-2.6, 2.0) if adv > 0 else ax.set_ylim(-3.5, 0.0)
        ax.set_title(f"A = {adv:+.0f}   (dots: maximiser r* = beta/(beta - A))")
        ax.set_xlabel("probability ratio r")
        ax.grid(alpha=0.25)
    axes[0].set_ylabel("per-sample objective")
    axes[0].legend(frameon=False, fontsize=8, loc="lower center")
    fig.suptitle("r*A - beta*(r - 1 - log r) vs the clipped surrogate: a spring pulls back, "
                 "a rail only stops pushing")
    fig.tight_layout()
    return _save(fig, path)


def rlhf_figure(path: Path) -> Path:
    from .rlhf import ACTIONS, REFERENCE, REWARDS, closed_form, objective

    plt = _plt()
    betas = np.geomspace(0.01, 100, 161)
    pis = np.array([closed_form(b) for b in betas])
    stats = np.array([objective(p, b) for p, b in zip(pis, betas)])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6))
    for i, name in enumerate(ACTIONS):
        ax1.plot(betas, pis[:, i], color=f"C{i}", lw=2, label=f"{name} (R={REWARDS[i]:+.1f})")
        ax1.plot([betas[-1] * 1.25], [REFERENCE[i]], "<", color=f"C{i}", ms=7, clip_on=False)
    ax1.set_xscale("log")
    ax1.set_xlabel("beta (KL coefficient)")
    ax1.set_ylabel("pi*(a)")
    ax1.set_title("optimal policy; arrows on the right: pi_ref")
    ax1.legend(frameon=False, fontsize=8, loc="center left")
    ax2.plot(betas, stats[:, 1], lw=2, label="E_pi*[R]")
    ax2.plot(betas, stats[:, 2], lw=2, label="KL(pi* || pi_ref)")
    ax2.plot(betas, stats[:, 0], lw=2, ls="--", label="objective J")
    ax2.set_xscale("log")
    ax2.set_xlabel("beta (KL coefficient)")
    ax2.set_title("reward bought with KL")
    ax2.legend(frameon=False)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.suptitle("max_pi E_pi[R] - beta KL(pi || pi_ref): beta -> 0 collapses on the best "
                 "action, large beta stays at the reference")
    fig.tight_layout()
    return _save(fig, path)


def baseline_figure(path: Path) -> Path:
    from .baseline import offset_trajectories

    plt = _plt()
    seeds = list(range(5))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    for ax, use_b, name in ((axes[0], False, "no baseline"), (axes[1], True, "baseline V")):
        tr = offset_trajectories(seeds, use_b)
        for i, row in enumerate(tr):
            ax.plot(np.arange(1, len(row) + 1), row, lw=1, color=f"C{i}", label=f"seed {i}")
        ax.set_title(f"rewards offset by +5, {name}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("pi(good)")
    axes[1].legend(frameon=False, loc="lower right")
    fig.suptitle("REINFORCE on a two-arm bandit: the baseline removes the offset's jitter")
    fig.tight_layout()
    return _save(fig, path)


def optimal_baseline_figure(path: Path) -> Path:
    from .optimal_baseline import BANDIT_EPOCHS, optimal_baseline_cases

    plt = _plt()
    cases = optimal_baseline_cases(offset=5.0)
    n_e = len(BANDIT_EPOCHS)
    groups = (("bandit of `demo bandit`, rewards (+1, -1)", cases[:n_e]),
              ("the same, every reward +5", cases[n_e:2 * n_e]),
              ("Bernoulli example, p(good) = 0.8, rewards (1, 0)", cases[2 * n_e:]))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.6))
    for ax, (name, group) in zip(axes, groups):
        for i, c in enumerate(group):
            color = f"C{i}"
            label = (f"p(good) = {c.probs[0]:.3f}" if "bandit" in c.label else None)
            ax.plot(c.sweep_b, c.sweep_var, color=color, lw=1.8, label=label)
            ax.plot([0.0], c.variance(0.0), "o", color=color, mfc="white", ms=7)
            ax.plot([c.value], c.variance(c.value), "s", color=color, mfc="white", ms=7)
            ax.plot([c.b_star], [c.var_star], "*", color=color, ms=13)
            ax.axvline(c.b_star, color=color, lw=0.8, ls=":")
        ax.set_title(name)
        ax.set_xlabel("constant baseline b")
        ax.set_ylim(bottom=-0.02 * max(float(c.sweep_var.max()) for c in group))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("exact variance of g(a) (R - b)")
    top = 3.0
    axes[1].set_ylim(top=top)
    above = [f"p(good) {c.probs[0]:.3f}: {c.var_none:.2f}" for c in groups[1][1]
             if c.var_none > top]
    if above:
        axes[1].text(0.02, 0.97, "no baseline, off the top:\n" + "\n".join(above),
                     transform=axes[1].transAxes, va="top", fontsize=8)
    from matplotlib.lines import Line2D

    keys = [Line2D([], [], ls="", marker="o", mfc="white", color="0.3", label="no baseline"),
            Line2D([], [], ls="", marker="s", mfc="white", color="0.3", label="b = V"),
            Line2D([], [], ls="", marker="*", ms=11, color="0.3", label="b* (the minimum)")]
    handles, labels = axes[0].get_legend_handles_labels()
    axes[0].legend(handles=handles + keys, frameon=False, fontsize=8, loc="upper center")
    fig.suptitle("Var(b) = Var(b*) + E[g^2] (b - b*)^2: the sweep's minimum is b* = "
                 "E[g^2 R] / E[g^2], which V only approximates")
    fig.tight_layout()
    return _save(fig, path)


def reward_to_go_figure(path: Path) -> Path:
    from .reward_to_go import THETA, estimators, reward_to_go_experiment, sample_trajectories

    plt = _plt()
    res = reward_to_go_experiment()
    whole, rtg = estimators(sample_trajectories(THETA, res.episodes, res.seed), THETA)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for i, (ax, name) in enumerate(zip(axes, ("theta_s0", "theta_s1"))):
        lo = min(whole[:, i].min(), rtg[:, i].min())
        hi = max(whole[:, i].max(), rtg[:, i].max())
        bins = np.linspace(lo - 0.25, hi + 0.25, 60)
        for x, key, label, color in ((whole, "whole", "whole return G(tau)", "C0"),
                                     (rtg, "rtg", "reward-to-go G_t", "C3")):
            ax.hist(x[:, i], bins=bins, color=color, alpha=0.45,
                    label=f"{label}: var {res.exact_var[key][i]:.3f}")
        ax.axvline(res.grad[i], color="black", lw=1.5, ls="--",
                   label=f"exact gradient {res.grad[i]:+.3f} (mean of both)")
        ax.set_yscale("log")
        ax.set_title(f"d J / d {name}")
        ax.set_xlabel("one-episode gradient estimate")
        ax.grid(alpha=0.3)
        ax.legend(frameon=False, fontsize=8)
    axes[0].set_ylabel(f"episodes (of {res.episodes}), log scale")
    fig.suptitle("Two-state MDP, at most 5 steps: dropping rewards paid before each action "
                 "keeps the mean and narrows the spread")
    fig.tight_layout()
    return _save(fig, path)


def learned_baseline_figure(path: Path) -> Path:
    from .learned_baseline import MODES, reinforce_runs

    plt = _plt()
    seeds = list(range(50))
    runs = {m: reinforce_runs(seeds, m) for m in MODES}
    steps = np.arange(1, runs["learned"].baseline.shape[1] + 1)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6))
    lr = runs["learned"]
    for i in range(5):
        ax1.plot(steps, lr.baseline[i], color=f"C{i}", lw=0.8, alpha=0.7)
    ax1.plot(steps, lr.baseline.mean(0), color="black", lw=2,
             label="V_hat, mean over 50 seeds (thin: seeds 0-4)")
    ax1.plot(steps, lr.target.mean(0), color="C3", lw=2, ls="--",
             label="target V = sum_a pi(a) p_a + 5")
    ax1.set_xlabel("step")
    ax1.set_ylabel("baseline")
    ax1.set_title("running estimate V_hat <- V_hat + 0.05 (r - V_hat)")
    ax1.legend(frameon=False, loc="lower right")
    for m, color in zip(MODES, ("C0", "C2", "C1")):
        ax2.plot(steps, runs[m].cond_var.mean(0), color=color, lw=1.8, label=f"baseline: {m}")
    ax2.set_yscale("log")
    ax2.set_xlabel("step")
    ax2.set_ylabel("variance of the one-pull gradient (mean over seeds)")
    ax2.set_title("gradient variance at each step's policy")
    ax2.legend(frameon=False)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.suptitle("REINFORCE on the +5-offset bandit: once V_hat has caught up it removes "
                 "the offset as well as the true V")
    fig.tight_layout()
    return _save(fig, path)


FIGURES = {
    "gae_bias_variance.png": gae_bias_variance_figure,
    "ppo_clip_sign.png": clip_sign_figure,
    "bandit_trajectories.png": bandit_figure,
    "kl_vs_clip.png": kl_vs_clip_figure,
    "rlhf_objective.png": rlhf_figure,
    "baseline_offset.png": baseline_figure,
    "optimal_baseline.png": optimal_baseline_figure,
    "reward_to_go.png": reward_to_go_figure,
    "learned_baseline.png": learned_baseline_figure,
}


def write_figures(out_dir) -> list[Path]:
    """Write every figure into ``out_dir`` (created if needed); return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [fn(out / name) for name, fn in FIGURES.items()]
