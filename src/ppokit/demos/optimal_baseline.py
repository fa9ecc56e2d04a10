"""The variance-minimising constant baseline ``b* = E[|g|² R] / E[|g|²]``, computed exactly.

One state, a discrete policy ``π``, score vectors ``g(a) = ∇_θ log π(a)`` and a reward ``R``
whose mean given the action is ``μ_a`` (and variance ``σ_a²``). The one-sample estimator
``ĝ = g(a) (R − b)`` has the same mean ``Σ_a π_a μ_a g(a)`` for every constant ``b``
(because ``Σ_a π_a g(a) = ∇ Σ_a π_a = 0``), and its total variance (the trace of its
covariance) is

    Var(b) = Σ_a π_a |g(a)|² (σ_a² + (μ_a − b)²) − |E ĝ|²,

a parabola in ``b``. Setting ``dVar/db = 0`` gives ``b* = Σ π |g|² μ / Σ π |g|²``, a
reward average weighted by ``π |g|²`` rather than by ``π``; ``Var(b) = Var(b*) +
E|g|² (b − b*)²``. The value ``V = Σ π μ`` is the ``π``-weighted average: the two agree when
``|g|²`` is the same for every action, and ``V`` is close to ``b*`` whenever the rewards sit
far from zero compared with their spread (then both are near the common level).

Two worked cases, exact (no sampling):

* the two-arm bandit of ``ppokit demo bandit`` (arms paying +1 and −1, one logit
  ``p(good) = σ(θ)``) at the policies its unclipped run passes through, with the rewards as
  they are and with every reward raised by an offset;
* the Bernoulli example of ``ppokit demo baseline`` (``p(good) = 0.8``, rewards 1 and 0).

Scores come from autograd (:func:`ppokit.demos.baseline.bernoulli_scores`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._table import fmt, table, title
from .bandit import ADVANTAGES, bandit_run
from .baseline import bernoulli_scores

__all__ = ["estimator_moments", "optimal_constant_baseline", "BaselineCase", "baseline_case",
           "optimal_baseline_cases", "sweep_grid", "BANDIT_EPOCHS", "BERNOULLI",
           "format_optimal_baseline"]

BANDIT_EPOCHS = (0, 3, 40)  # policies of `ppokit demo bandit`'s unclipped run (0 = start)
BERNOULLI = (0.8, (1.0, 0.0))  # p(good), rewards (good, bad) of `ppokit demo baseline`
SWEEP_POINTS = 4001


def estimator_moments(probs, means, scores, baseline, reward_var=None):
    """Exact mean and total variance of ``g(a) (R − b)`` for ``a ∼ probs``.

    Shapes (leading batch dimensions broadcast): ``probs``, ``means``, ``reward_var``
    ``[..., A]``; ``scores`` ``[..., A, P]`` (``[A]`` for one parameter); ``baseline``
    ``[...]``. Returns ``(mean [..., P], variance [...])``; the variance is the trace of the
    covariance (the sum over parameters).
    """
    p = np.asarray(probs, dtype=np.float64)
    mu = np.asarray(means, dtype=np.float64)
    g = np.asarray(scores, dtype=np.float64)
    if g.ndim == p.ndim:  # one parameter: [..., A] -> [..., A, 1]
        g = g[..., None]
    b = np.asarray(baseline, dtype=np.float64)[..., None]
    s2 = 0.0 if reward_var is None else np.asarray(reward_var, dtype=np.float64)
    mean = np.einsum("...a,...ap->...p", p * (mu - b), g)
    second = (p * (g**2).sum(-1) * (s2 + (mu - b) ** 2)).sum(-1)
    return mean, second - (mean**2).sum(-1)


def optimal_constant_baseline(probs, means, scores):
    """``b* = Σ_a π_a |g(a)|² μ_a / Σ_a π_a |g(a)|²`` (same shapes as
    :func:`estimator_moments`): the minimiser of the total variance."""
    p = np.asarray(probs, dtype=np.float64)
    g = np.asarray(scores, dtype=np.float64)
    g2 = g**2 if g.ndim == p.ndim else (g**2).sum(-1)
    w = p * g2
    return (w * np.asarray(means, dtype=np.float64)).sum(-1) / w.sum(-1)


@dataclass
class BaselineCase:
    label: str
    probs: np.ndarray  # [A]
    means: np.ndarray  # [A] expected reward of each action
    reward_var: np.ndarray  # [A]
    scores: np.ndarray  # [A] (one logit)
    value: float  # V = Σ π μ
    b_star: float
    mean_grad: float
    var_none: float
    var_value: float
    var_star: float
    sweep_b: np.ndarray  # the grid of constant baselines
    sweep_var: np.ndarray  # exact variance at each

    @property
    def sweep_argmin(self) -> float:
        return float(self.sweep_b[int(np.argmin(self.sweep_var))])

    @property
    def grid_step(self) -> float:
        return float(self.sweep_b[1] - self.sweep_b[0])

    def variance(self, b) -> np.ndarray:
        return estimator_moments(self.probs, self.means, self.scores, b, self.reward_var)[1]


def sweep_grid(*points: float, points_n: int = SWEEP_POINTS) -> np.ndarray:
    """An even grid covering ``points`` with half their span (at least 0.5) on either side."""
    lo, hi = min(points), max(points)
    pad = max(0.5, 0.5 * (hi - lo))
    return np.linspace(lo - pad, hi + pad, points_n)


def baseline_case(label: str, p_good: float, rewards, reward_sd: float = 0.0) -> BaselineCase:
    """Exact moments of the one-logit two-arm estimator at ``p(good) = p_good``."""
    probs = np.array([p_good, 1.0 - p_good])
    means = np.asarray(rewards, dtype=np.float64)
    var = np.full(2, float(reward_sd) ** 2)
    scores = bernoulli_scores(p_good)
    v = float(probs @ means)
    b_star = float(optimal_constant_baseline(probs, means, scores))
    grid = sweep_grid(0.0, v, b_star)
    mean, _ = estimator_moments(probs, means, scores, 0.0, var)
    bs = np.array([0.0, v, b_star])
    _, (var_none, var_value, var_star) = estimator_moments(
        np.broadcast_to(probs, (3, 2)), np.broadcast_to(means, (3, 2)),
        np.broadcast_to(scores, (3, 2)), bs, np.broadcast_to(var, (3, 2)))
    _, sweep = estimator_moments(probs[None], means[None], scores[None], grid, var[None])
    return BaselineCase(label, probs, means, var, scores, v, b_star, float(mean[0]),
                        float(var_none), float(var_value), float(var_star), grid, sweep)


def optimal_baseline_cases(*, offset: float = 5.0, reward_sd: float = 0.0,
                           epochs=BANDIT_EPOCHS) -> list[BaselineCase]:
    """The bandit at the given epochs of its unclipped run (rewards as they are, then
    raised by ``offset``), and the Bernoulli example."""
    run = bandit_run(False, epochs=max(max(epochs), 1))
    p_at = {0: 0.5, **{s.epoch: s.p_good for s in run}}
    cases = []
    for off in dict.fromkeys((0.0, float(offset))):
        for e in epochs:
            rewards = np.asarray(ADVANTAGES) + off
            cases.append(baseline_case(f"bandit epoch {e}, offset {off:+g}", p_at[e], rewards,
                                       reward_sd))
    p, rewards = BERNOULLI
    cases.append(baseline_case("Bernoulli p=0.8", p, rewards, reward_sd))
    return cases


def _sweep_table(case: BaselineCase, step: float = 0.1) -> str:
    lo = np.floor(min(case.sweep_b[0] + 0.3, -0.2) / step) * step
    hi = np.ceil(max(case.sweep_b[-1] - 0.3, case.value + 0.2) / step) * step
    bs = np.round(np.arange(lo, hi + step / 2, step), 10)
    vs = case.variance(bs)
    best = int(np.argmin(vs))
    rows = []
    for i, (b, v) in enumerate(zip(bs, vs)):
        notes = [n for n, x in (("none", 0.0), ("V", case.value), ("b*", case.b_star))
                 if abs(b - x) < step / 2]
        mark = ("<- lowest on this grid" if i == best else "")
        rows.append([fmt(b, 2, sign=True), fmt(float(v)), " ".join(
            [f"(nearest {n})" for n in notes] + ([mark] if mark else []))])
    return table(["b", "Var", ""], rows, indent=3, align="rrl")


def format_optimal_baseline(*, offset: float = 5.0, reward_sd: float = 0.0) -> str:
    cases = optimal_baseline_cases(offset=offset, reward_sd=reward_sd)
    rows = []
    for c in cases:
        rows.append([c.label, fmt(c.probs[0]), fmt(c.mean_grad), fmt(c.value, sign=True),
                     fmt(c.b_star, sign=True), fmt(c.var_none), fmt(c.var_value),
                     fmt(c.var_star), fmt(c.sweep_argmin, sign=True)])
    bern = cases[-1]
    noise = (f"every arm's reward has noise of sd {reward_sd:g}" if reward_sd > 0 else
             "deterministic arm rewards")
    lines = [
        title("The variance-minimising baseline b* = E[g^2 R] / E[g^2]"),
        "estimator g(a) (R - b), g = d log pi(a) / d theta with one logit; exact moments over",
        f"a ~ pi, no sampling; {noise}. Var(b) = Var(b*) + E[g^2] (b - b*)^2.",
        "",
        "bandit: the arms of `ppokit demo bandit` (rewards good +1, bad -1) at the policy its",
        f"unclipped run reaches after epochs {', '.join(map(str, BANDIT_EPOCHS))}"
        + (f"; then every reward raised by {offset:+g}." if offset != 0 else "."),
        "Bernoulli: the exact example of `ppokit demo baseline`, p(good) = 0.8, rewards (1, 0).",
        f"argmin: the lowest point of an exact sweep over {SWEEP_POINTS} values of b.",
        "",
        table(["case", "p(good)", "mean grad", "V", "b*", "Var none", "Var V", "Var b*",
               "argmin"], rows, indent=2),
        "",
        "Var b* is the smallest entry of every row, and the sweep's lowest point sits on b*.",
        "(With two actions and deterministic rewards g(a) (R(a) - b*) is the same for both",
        "arms, so Var b* is 0; reward noise, --reward-sd, adds E[g^2] sd^2 to every column.)",
        "With one logit, g^2 is larger for the less likely arm, so b* = (1-p) R_good + p R_bad",
        "weights each reward by the *other* arm's probability; V = p R_good + (1-p) R_bad does",
        "the opposite. On rewards near zero that can make V worse than no baseline at all;",
        "once the rewards share a large common level (the offset rows) V and b* both sit near",
        "it and V removes almost all of the no-baseline variance. That, and the fact that a",
        "critic estimates V with ordinary regression while b* needs the score norms, is why",
        "V(s) is the baseline used in practice.",
        "",
        f"Sweep of b for the {bern.label} example (exact):",
        _sweep_table(bern),
    ]
    return "\n".join(lines)
