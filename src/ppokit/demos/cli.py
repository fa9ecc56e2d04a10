"""``ppokit demo NAME``: the worked experiments, printed with ppokit's own code.

Each demo is a subcommand with its own options (``ppokit demo NAME --help``). Bad option
values raise :class:`ppokit.errors.UsageError` (exit status 2).
"""

from __future__ import annotations

import argparse
import math

from ppokit.errors import UsageError

# name -> one-line description (the order of `ppokit demo` and `ppokit demo all`)
DEMOS: dict[str, str] = {
    "gae": "GAE on a fixed four-step trajectory for lambda in {0, 0.5, 0.95, 1}",
    "bias-variance": "bias and variance of the GAE value target over lambda (empirical and "
                     "analytic)",
    "clip": "the single-sample PPO-Clip table and a ratio sweep for A = +1 and -1",
    "bandit": "unclipped vs PPO-Clip on a two-arm bandit, 40 epochs on one batch",
    "baseline": "baselines: exact Bernoulli example, sampled variance ratio, +5 reward offset",
    "optimal-baseline": "the variance-minimising baseline b* vs none and V, exact, with a "
                        "sweep of b",
    "reward-to-go": "reward-to-go vs the whole return on a two-state MDP: same mean, less "
                    "variance",
    "learned-baseline": "a running-average baseline V_hat vs the true V and none, rewards "
                        "offset by +5",
    "kl": "an unobserved action's KL, and signed per-token KL terms against a reference",
    "kl-vs-clip": "the KL penalty (spring) vs the clip (guard rail), swept over beta",
    "rlhf-objective": "max E[R] - beta KL(pi||pi_ref) on five actions, swept over beta",
    "reward-hacking": "PPO against a length-biased reward model, with and without the KL "
                      "anchor (about 2 minutes; writes plots)",
    "figures": "write the demos' figures as PNG files (--out DIR)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Run one of the worked experiments and print its numbers."
    sub = parser.add_subparsers(dest="name", metavar="NAME")
    for name, help_text in DEMOS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == "bias-variance":
            p.add_argument("--critic-scale", type=float, default=1.0,
                           help="scale of the critic's fixed errors (0: exact critic; "
                                "default 1)")
            p.add_argument("--sigma", type=float, default=0.8,
                           help="standard deviation of the reward noise (default 0.8)")
            p.add_argument("--episodes", type=int, default=20000,
                           help="number of sampled episodes (default 20000)")
            p.add_argument("--seed", type=int, default=7, help="numpy seed (default 7)")
        elif name == "bandit":
            p.add_argument("--lr", type=float, default=0.3, help="step size (default 0.3)")
            p.add_argument("--target-kl", type=float, default=None,
                           help="stop after the first epoch whose KL(old||new) exceeds this")
            p.add_argument("--epochs", type=int, default=40, help="epochs (default 40)")
            p.add_argument("--eps", type=float, default=0.2, help="clip range (default 0.2)")
        elif name in ("clip", "kl-vs-clip"):
            p.add_argument("--eps", type=float, default=0.2, help="clip range (default 0.2)")
        elif name == "baseline":
            p.add_argument("--seed", type=int, default=0,
                           help="numpy seed of the sampled-variance experiment (default 0)")
            p.add_argument("--draws", type=int, default=2000,
                           help="draws in the sampled-variance experiment (default 2000)")
            p.add_argument("--seeds", type=int, default=50,
                           help="seeds 0..N-1 of the offset experiment (default 50)")
        elif name == "optimal-baseline":
            p.add_argument("--offset", type=float, default=5.0,
                           help="amount added to every bandit reward in the second set of "
                                "rows (default 5)")
            p.add_argument("--reward-sd", type=float, default=0.0,
                           help="standard deviation of noise on every reward (default 0: "
                                "deterministic arms)")
        elif name == "reward-to-go":
            p.add_argument("--episodes", type=int, default=20000,
                           help="number of sampled episodes (default 20000)")
            p.add_argument("--seed", type=int, default=0, help="numpy seed (default 0)")
            p.add_argument("--gamma", type=float, default=1.0,
                           help="discount in [0, 1] (default 1)")
        elif name == "learned-baseline":
            p.add_argument("--alpha", type=float, default=0.05,
                           help="step size of the running estimate, in (0, 1] (default 0.05)")
            p.add_argument("--v0", type=float, default=0.0,
                           help="starting value of the running estimate (default 0)")
            p.add_argument("--offset", type=float, default=5.0,
                           help="amount added to every reward (default 5)")
            p.add_argument("--eta", type=float, default=0.1,
                           help="policy step size (default 0.1)")
            p.add_argument("--steps", type=int, default=400, help="pulls per seed (default 400)")
            p.add_argument("--seeds", type=int, default=50,
                           help="seeds 0..N-1, run side by side (default 50)")
        elif name == "reward-hacking":
            p.add_argument("--out", default="runs/demo-reward-hacking", metavar="DIR",
                           help="output directory (default runs/demo-reward-hacking)")
            p.add_argument("--iterations", type=int, default=100,
                           help="PPO iterations per run (default 100)")
            p.add_argument("--beta", type=float, default=0.5,
                           help="KL coefficient of the anchored run (default 0.5)")
            p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
        elif name == "figures":
            p.add_argument("--out", required=True, metavar="DIR",
                           help="directory to write the PNG files into (created if needed)")


def _finite(value: float, option: str) -> float:
    if not math.isfinite(value):
        raise UsageError(f"{option}: expected a finite number, got {value}")
    return value


def _positive(value: float, option: str) -> float:
    if not (_finite(value, option) > 0):
        raise UsageError(f"{option}: expected a number > 0, got {value}")
    return value


def _nonnegative(value: float, option: str) -> float:
    if not (_finite(value, option) >= 0):
        raise UsageError(f"{option}: expected a number >= 0, got {value}")
    return value


def _at_least(value: int, low: int, option: str) -> int:
    if value < low:
        raise UsageError(f"{option}: expected an integer >= {low}, got {value}")
    return value


def _at_most(value: int, high: int, option: str) -> int:
    if value > high:
        raise UsageError(f"{option}: expected an integer <= {high}, got {value}")
    return value


def _bounded(value: float, limit: float, option: str) -> float:
    if not (abs(_finite(value, option)) <= limit):
        raise UsageError(f"{option}: expected a number between {-limit:g} and {limit:g}, "
                         f"got {value}")
    return value


def _eps(value: float) -> float:
    if not (0 < _finite(value, "--eps") < 1):
        raise UsageError(f"--eps: expected a number in (0, 1), got {value}")
    return value


def render(name: str, args: argparse.Namespace | None = None) -> str:
    """The printed output of demo ``name`` (``args`` holds its options; defaults if None)."""
    a = args if args is not None else argparse.Namespace()
    fn = _RENDER.get(name)
    if fn is None:
        raise UsageError(f"unknown demo {name!r}; known: {', '.join(DEMOS)}")
    return fn(lambda key, default: getattr(a, key, default))


# each demo's output from ``opt(key, default)``, its options read and checked
def _gae(opt) -> str:
    from .gae import fixed_trajectory, format_fixed_trajectory

    return format_fixed_trajectory(fixed_trajectory())


def _bias_variance(opt) -> str:
    from .gae import bias_variance, format_bias_variance

    return format_bias_variance(bias_variance(
        seed=_at_least(opt("seed", 7), 0, "--seed"),
        episodes=_at_most(_at_least(opt("episodes", 20000), 2, "--episodes"), 2_000_000,
                          "--episodes"),
        sigma=_nonnegative(opt("sigma", 0.8), "--sigma"),
        critic_scale=_finite(opt("critic_scale", 1.0), "--critic-scale")))


def _clip(opt) -> str:
    from .clip import format_clip

    return format_clip(_eps(opt("eps", 0.2)))


def _bandit(opt) -> str:
    from .bandit import format_bandit

    tkl = opt("target_kl", None)
    return format_bandit(epochs=_at_most(_at_least(opt("epochs", 40), 1, "--epochs"),
                                         100_000, "--epochs"),
                         lr=_positive(opt("lr", 0.3), "--lr"), eps=_eps(opt("eps", 0.2)),
                         target_kl=None if tkl is None else _positive(tkl, "--target-kl"))


def _baseline(opt) -> str:
    from .baseline import format_baseline

    return format_baseline(seed=_at_least(opt("seed", 0), 0, "--seed"),
                           draws=_at_most(_at_least(opt("draws", 2000), 2, "--draws"),
                                          1_000_000, "--draws"),
                           n_seeds=_at_most(_at_least(opt("seeds", 50), 2, "--seeds"),
                                            10_000, "--seeds"))


def _optimal_baseline(opt) -> str:
    from .optimal_baseline import format_optimal_baseline

    return format_optimal_baseline(
        offset=_bounded(opt("offset", 5.0), 1e6, "--offset"),
        reward_sd=_bounded(_nonnegative(opt("reward_sd", 0.0), "--reward-sd"), 1e6,
                           "--reward-sd"))


def _reward_to_go(opt) -> str:
    from .reward_to_go import format_reward_to_go

    gamma = _finite(opt("gamma", 1.0), "--gamma")
    if not 0 <= gamma <= 1:
        raise UsageError(f"--gamma: expected a number in [0, 1], got {gamma}")
    return format_reward_to_go(
        gamma=gamma, seed=_at_least(opt("seed", 0), 0, "--seed"),
        episodes=_at_most(_at_least(opt("episodes", 20000), 2, "--episodes"), 2_000_000,
                          "--episodes"))


def _learned_baseline(opt) -> str:
    from .learned_baseline import format_learned_baseline

    alpha = _finite(opt("alpha", 0.05), "--alpha")
    if not 0 < alpha <= 1:
        raise UsageError(f"--alpha: expected a number in (0, 1], got {alpha}")
    n_seeds = _at_least(opt("seeds", 50), 2, "--seeds")
    steps = _at_least(opt("steps", 400), 2, "--steps")
    if n_seeds * steps > 2_000_000:
        raise UsageError(f"--seeds x --steps: expected at most 2000000 pulls in all, got "
                         f"{n_seeds} x {steps}")
    return format_learned_baseline(
        n_seeds=n_seeds, steps=steps, alpha=alpha,
        offset=_bounded(opt("offset", 5.0), 1e6, "--offset"),
        eta=_bounded(_positive(opt("eta", 0.1), "--eta"), 1e3, "--eta"),
        v0=_bounded(opt("v0", 0.0), 1e6, "--v0"))


def _kl(opt) -> str:
    from .kl import format_kl

    return format_kl()


def _kl_vs_clip(opt) -> str:
    from .kl_vs_clip import format_kl_vs_clip

    return format_kl_vs_clip(_eps(opt("eps", 0.2)))


def _rlhf_objective(opt) -> str:
    from .rlhf import format_rlhf

    return format_rlhf()


def _reward_hacking(opt) -> str:
    import sys

    iterations = _at_least(opt("iterations", 100), 1, "--iterations")
    beta = _positive(opt("beta", 0.5), "--beta")
    from ppokit.errors import require_extra

    require_extra(("transformers", "tokenizers"), "llm", "ppokit demo reward-hacking")
    from ppokit.llm import run_reward_hacking_demo

    summary = run_reward_hacking_demo(
        opt("out", "runs/demo-reward-hacking"), iterations=iterations, beta=beta,
        seed=opt("seed", 0), log=lambda m: print(m, file=sys.stderr, flush=True))
    lines = [f"{'run':<10}{'RM reward':>22}{'true score':>22}{'length':>22}{'kl_ref':>22}"]
    for run_name, row in summary["runs"].items():
        cells = "".join(f"{row[k]['start']:>10.3f} -> {row[k]['end']:<8.3f}" for k in
                        ("score_mean", "true_score_mean", "response_length_mean", "kl_ref"))
        lines.append(f"{run_name:<10}{cells}")
    lines.append(f"reward model held-out pair accuracy {summary['rm']['eval_accuracy']:.3f}; "
                 f"figure {summary.get('figure')}")
    return "\n".join(lines)


def _figures(opt) -> str:
    from .figures import write_figures

    out = opt("out", None)
    if not out:
        raise UsageError("--out: a directory is required")
    try:
        paths = write_figures(out)
    except OSError as exc:
        raise UsageError(f"--out: cannot write figures into {out!r}: {exc}") from exc
    return "\n".join(f"wrote {p} ({p.stat().st_size / 1024:.0f} KiB)" for p in paths)


_RENDER = {
    "gae": _gae,
    "bias-variance": _bias_variance,
    "clip": _clip,
    "bandit": _bandit,
    "baseline": _baseline,
    "optimal-baseline": _optimal_baseline,
    "reward-to-go": _reward_to_go,
    "learned-baseline": _learned_baseline,
    "kl": _kl,
    "kl-vs-clip": _kl_vs_clip,
    "rlhf-objective": _rlhf_objective,
    "reward-hacking": _reward_hacking,
    "figures": _figures,
}


def run(args: argparse.Namespace) -> int:
    if getattr(args, "name", None) is None:
        print("usage: ppokit demo NAME [options]   (ppokit demo NAME --help)\n")
        width = max(map(len, DEMOS))
        for name, text in DEMOS.items():
            print(f"  {name:<{width}}  {text}")
        return 0
    print(render(args.name, args))
    return 0
