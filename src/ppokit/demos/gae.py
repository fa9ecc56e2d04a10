"""GAE demos: the fixed four-step trajectory and the λ bias–variance experiment.

docs/theory.md#lambda-bias-and-variance. Every advantage here comes from
:func:`ppokit.core.gae`; the analytic moments from :func:`lambda_return_moments`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ppokit.core import gae, td_residuals

from ._table import fmt, table, title, vec

__all__ = [
    "FIXED_REWARDS", "FIXED_VALUES", "FixedRow", "fixed_trajectory", "format_fixed_trajectory",
    "REWARD_MEANS", "CRITIC_ERROR", "true_values", "lambda_return_moments", "BVRow",
    "BiasVariance", "bias_variance", "format_bias_variance", "DEFAULT_LAMBDAS",
]

GAMMA = 0.99
FIXED_REWARDS = (0.0, 0.0, 1.0, 0.5)
FIXED_VALUES = (0.40, 0.55, 0.70, 0.30)
DEFAULT_LAMBDAS = (0.0, 0.5, 0.95, 1.0)


# ------------------------------------------------------------------ fixed trajectory


@dataclass
class FixedRow:
    lam: float
    deltas: np.ndarray
    advantages: np.ndarray
    targets: np.ndarray


def _episode_inputs(values: np.ndarray, n: int | None = None):
    """``next_values``, ``terminated``, ``episode_end`` for one episode of ``len(values)``
    steps that really terminates after its last step (``[T]``, or ``[T, N]`` for n)."""
    t = len(values)
    next_values = np.append(values[1:], 0.0)
    done = np.zeros(t)
    done[-1] = 1.0
    if n is None:
        return next_values, done, done
    col = np.ones((1, n))
    return next_values[:, None] * col, done[:, None] * col, done[:, None] * col


def fixed_trajectory(lambdas=DEFAULT_LAMBDAS, gamma: float = GAMMA) -> list[FixedRow]:
    """δ, A and value targets of the four-step terminal trajectory for each λ."""
    r = np.asarray(FIXED_REWARDS, dtype=np.float64)
    v = np.asarray(FIXED_VALUES, dtype=np.float64)
    nv, term, end = _episode_inputs(v)
    deltas = td_residuals(r, v, nv, term, gamma).numpy()
    rows = []
    for lam in lambdas:
        adv, ret = gae(r, v, nv, term, end, gamma, lam)
        rows.append(FixedRow(float(lam), deltas, adv.numpy(), ret.numpy()))
    return rows


def format_fixed_trajectory(rows: list[FixedRow], gamma: float = GAMMA) -> str:
    lines = [
        title("GAE on a fixed four-step trajectory"),
        f"gamma={gamma}  rewards={list(FIXED_REWARDS)}  values={list(FIXED_VALUES)}",
        "the episode terminates after the last step (no bootstrap)",
        "",
        f"delta (every lambda) = {vec(rows[0].deltas)}",
        "",
        table(["lambda", "A", "target = A + V"],
              [[f"{r.lam:.2f}", vec(r.advantages), vec(r.targets)] for r in rows],
              align="rll"),
        "",
        "delta depends only on one reward and the critic; lambda sets how far later",
        "residuals carry back. The last step is terminal, so its advantage is 0.2 for",
        "every lambda.",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------ bias–variance

REWARD_MEANS = tuple(np.linspace(0.2, 0.9, 8).tolist())
CRITIC_ERROR = (0.30, -0.90, 0.35, -0.25, 0.20, -0.15, 0.10, -0.05)


def true_values(reward_means, gamma: float = GAMMA) -> np.ndarray:
    """``V(s_t) = Σ_k γ^k μ_{t+k}`` for deterministic states and a terminal end."""
    mu = np.asarray(reward_means, dtype=np.float64)
    out = np.zeros_like(mu)
    carry = 0.0
    for t in range(len(mu) - 1, -1, -1):
        carry = mu[t] + gamma * carry
        out[t] = carry
    return out


def lambda_return_moments(reward_means, values, sigma: float, gamma: float,
                          lam: float) -> tuple[float, float, float]:
    """Exact ``(mean, bias, variance)`` of the GAE value target at ``s_0``.

    Setting: states fixed in time, rewards ``r_k ~ N(μ_k, σ²)``
    independent, a fixed critic ``values`` (``V(s_k)``), termination after the last step.
    With ``q = γλ`` the target is ``Σ_k q^k r_k + γ(1−λ) Σ_{k≥1} q^{k−1} V(s_k)`` (the
    ``V(s_0)`` terms cancel), so its mean replaces ``r_k`` by ``μ_k`` and its variance is
    ``σ² Σ_k q^{2k}``. The bias is measured against the true ``V(s_0) = Σ_k γ^k μ_k``.
    """
    mu = np.asarray(reward_means, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if mu.ndim != 1 or v.shape != mu.shape or len(mu) == 0:
        raise ValueError("reward_means and values: expected two non-empty [T] arrays of the "
                         f"same shape, got {mu.shape} and {v.shape}")
    w = (gamma * lam) ** np.arange(len(mu))
    mean = float(w @ mu + gamma * (1.0 - lam) * (w[:-1] @ v[1:]))
    truth = float((gamma ** np.arange(len(mu))) @ mu)
    return mean, mean - truth, float(sigma**2 * (w @ w))


@dataclass
class BVRow:
    lam: float
    mean: float
    bias: float
    std: float
    mse: float
    theory_mean: float
    theory_bias: float
    theory_std: float
    mean_se: float

    @property
    def theory_mse(self) -> float:
        return self.theory_bias**2 + self.theory_std**2


@dataclass
class BiasVariance:
    episodes: int
    seed: int
    sigma: float
    critic_scale: float
    true_v0: float
    critic_v0: float
    rows: list[BVRow]


def bias_variance(lambdas=DEFAULT_LAMBDAS, *, seed: int = 7, episodes: int = 20000,
                  sigma: float = 0.8, critic_scale: float = 1.0,
                  gamma: float = GAMMA) -> BiasVariance:
    """Empirical and analytic moments of the GAE target for ``V(s_0)`` over λ.

    Rewards are drawn once, ``default_rng(seed).normal(μ, σ, size=(episodes, 8))``, and
    shared by every λ; the targets come from :func:`ppokit.core.gae` on the ``[T, N]``
    layout (float64) with the critic ``V_true + critic_scale · CRITIC_ERROR``.
    """
    mu = np.asarray(REWARD_MEANS, dtype=np.float64)
    v_true = true_values(mu, gamma)
    v = v_true + critic_scale * np.asarray(CRITIC_ERROR)
    draws = np.random.default_rng(seed).normal(mu, sigma, size=(episodes, len(mu)))
    rewards = torch.from_numpy(np.ascontiguousarray(draws.T))  # [T, N]
    values = torch.from_numpy(np.repeat(v[:, None], episodes, axis=1))
    nv, term, end = _episode_inputs(v, episodes)
    rows = []
    for lam in lambdas:
        _, targets = gae(rewards, values, nv, term, end, gamma, lam)
        est = targets[0].numpy()
        t_mean, t_bias, t_var = lambda_return_moments(mu, v, sigma, gamma, lam)
        rows.append(BVRow(
            lam=float(lam), mean=float(est.mean()), bias=float(est.mean() - v_true[0]),
            std=float(est.std()), mse=float(np.mean((est - v_true[0]) ** 2)),
            theory_mean=t_mean, theory_bias=t_bias, theory_std=float(np.sqrt(t_var)),
            mean_se=float(np.sqrt(t_var / episodes))))
    return BiasVariance(episodes, seed, float(sigma), float(critic_scale), float(v_true[0]),
                        float(v[0]), rows)


def format_bias_variance(res: BiasVariance) -> str:
    rows = [[f"{r.lam:.2f}", fmt(r.mean), fmt(r.bias), fmt(r.std), fmt(r.mse),
             fmt(r.theory_bias), fmt(r.theory_std), fmt(r.theory_mse), fmt(r.mean_se)]
            for r in res.rows]
    lines = [
        title("GAE lambda: bias and variance of the value target for V(s0)"),
        f"episodes={res.episodes}  seed={res.seed}  sigma={res.sigma:g}  "
        f"critic_scale={res.critic_scale:g}  gamma={GAMMA}",
        f"true_V0={res.true_v0:.4f}  critic_V0={res.critic_v0:.4f}",
        "8 steps, independent N(mu_k, sigma^2) rewards (mu 0.2..0.9), fixed critic =",
        "true values + critic_scale * fixed errors; targets from ppokit.core.gae",
        "",
        table(["lambda", "mean", "bias", "std", "mse", "theory_bias", "theory_std",
               "theory_mse", "mean_SE"], rows, align="r" * 9),
        "",
        "theory_*: exact moments for independent rewards and a fixed critic. mean_SE is the",
        "standard error of the empirical mean (theory_std / sqrt(episodes)); the empirical",
        "bias should lie within a few mean_SE of theory_bias.",
    ]
    return "\n".join(lines)
