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


FIGURES = {
    "gae_bias_variance.png": gae_bias_variance_figure,
    "ppo_clip_sign.png": clip_sign_figure,
    "bandit_trajectories.png": bandit_figure,
    "kl_vs_clip.png": kl_vs_clip_figure,
    "rlhf_objective.png": rlhf_figure,
    "baseline_offset.png": baseline_figure,
}


def write_figures(out_dir) -> list[Path]:
    """Write every figure into ``out_dir`` (created if needed); return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [fn(out / name) for name, fn in FIGURES.items()]
