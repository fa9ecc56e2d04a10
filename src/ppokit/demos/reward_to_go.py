"""Reward-to-go against the whole return: same expected gradient, smaller variance.

A two-state MDP with episodes of at most :data:`HORIZON` steps (the episode also ends when
the agent takes "finish" in ``s1``). The policy has one logit per state,
``π(a = 1 | s) = σ(θ_s)``, so ``θ = (θ_s0, θ_s1)``. Two one-trajectory estimators of
``∇_θ J``, ``J = E[Σ_t γ^t r_t]``:

* whole return:  ``Σ_t ∇ log π(a_t|s_t) · G(τ)``, ``G(τ) = Σ_t γ^t r_t``
  (:func:`ppokit.core.discounted_return`);
* reward-to-go:  ``Σ_t γ^t ∇ log π(a_t|s_t) · G_t``, ``G_t = Σ_{l≥0} γ^l r_{t+l}``
  (:func:`ppokit.core.reward_to_go`, weights :func:`ppokit.core.discount_weights`, which
  returns them in float32: with ``γ < 1`` the two means agree to about 1e-7, not 1e-12).

Their difference is ``Σ_t ∇ log π(a_t|s_t) · Σ_{k<t} γ^k r_k``: each score multiplies rewards
that were already paid before its action was chosen. Given the past, a score has mean zero,
so every such term has mean zero — the two estimators have the same expectation — but the
terms still add spread. The MDP is small enough to enumerate every trajectory, which gives
the exact means and variances next to the sampled ones; ``∇J`` itself comes from autograd
through a dynamic-programming evaluation of ``J``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ppokit.core import discount_weights, discounted_return, reward_to_go

from ._table import fmt, table, title

__all__ = ["STATES", "ACTIONS", "TRANSITIONS", "HORIZON", "THETA", "score_table",
           "Trajectories", "sample_trajectories", "enumerate_trajectories", "estimators",
           "exact_gradient", "RTGResult", "reward_to_go_experiment", "format_reward_to_go"]

STATES = ("s0", "s1")
ACTIONS = (("stay", "go"), ("back", "finish"))  # action names, per state (index 0, 1)
# (state, action) -> outcomes (probability, next state or None when the episode ends, reward)
TRANSITIONS: dict[tuple[int, int], tuple[tuple[float, int | None, float], ...]] = {
    (0, 0): ((1.0, 0, 1.0),),
    (0, 1): ((0.75, 1, 0.0), (0.25, 0, 0.0)),
    (1, 0): ((1.0, 0, -0.5),),
    (1, 1): ((1.0, None, 3.0),),
}
HORIZON = 5
THETA = (0.0, 0.0)  # default logits: both states start uniform


def score_table(theta) -> np.ndarray:
    """``∇_θ log π(a|s)`` for every ``(s, a)``: ``[2 states, 2 actions, 2 parameters]``
    (autograd through ``log σ(±θ_s)``)."""
    th = torch.tensor(np.asarray(theta, dtype=np.float64), requires_grad=True)
    out = np.zeros((2, 2, 2))
    for s in range(2):
        for a in range(2):
            logp = torch.nn.functional.logsigmoid(th[s] if a == 1 else -th[s])
            (g,) = torch.autograd.grad(logp, th)
            out[s, a] = g.numpy()
    return out


@dataclass
class Trajectories:
    """Time-major ``[T, N]`` arrays of ``N`` episodes padded to ``T = HORIZON`` steps."""

    states: np.ndarray  # int
    actions: np.ndarray  # int
    rewards: np.ndarray  # float, 0 on padding
    alive: np.ndarray  # bool: the step happened
    episode_end: np.ndarray  # bool: the episode ended after this step
    weight: np.ndarray  # [N] probability of each trajectory (1/N for samples)


def _p1(theta, states) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(theta, dtype=np.float64)[states]))


def sample_trajectories(theta=THETA, episodes: int = 20000, seed: int = 0) -> Trajectories:
    """Sample ``episodes`` episodes from ``s0``, all side by side (two uniforms per step:
    the action, then the outcome)."""
    n, t_max = episodes, HORIZON
    u = np.random.default_rng(seed).random((t_max, n, 2))
    states = np.zeros((t_max, n), dtype=np.int64)
    actions = np.zeros((t_max, n), dtype=np.int64)
    rewards = np.zeros((t_max, n))
    alive = np.zeros((t_max, n), dtype=bool)
    end = np.zeros((t_max, n), dtype=bool)
    s = np.zeros(n, dtype=np.int64)
    live = np.ones(n, dtype=bool)
    for t in range(t_max):
        a = (u[t, :, 0] < _p1(theta, s)).astype(np.int64)
        nxt, r, done = s.copy(), np.zeros(n), np.zeros(n, dtype=bool)
        for (ss, aa), outcomes in TRANSITIONS.items():
            sel = live & (s == ss) & (a == aa)
            cum = 0.0
            left = sel.copy()
            for i, (prob, s2, rew) in enumerate(outcomes):
                cum += prob
                last = i == len(outcomes) - 1
                hit = left.copy() if last else left & (u[t, :, 1] < cum)
                left &= ~hit
                r[hit] = rew
                if s2 is None:
                    done[hit] = True
                else:
                    nxt[hit] = s2
        states[t], actions[t], alive[t] = np.where(live, s, 0), np.where(live, a, 0), live
        rewards[t] = np.where(live, r, 0.0)
        end[t] = live & (done | (t == t_max - 1))
        live = live & ~done
        s = nxt
    return Trajectories(states, actions, rewards, alive, end, np.full(n, 1.0 / n))


def enumerate_trajectories(theta=THETA) -> Trajectories:
    """Every possible episode with its probability (a few hundred)."""
    p1 = 1.0 / (1.0 + np.exp(-np.asarray(theta, dtype=np.float64)))
    found: list[tuple[float, list[tuple[int, int, float]], bool]] = []

    def walk(s: int, prob: float, steps: list[tuple[int, int, float]]) -> None:
        if len(steps) == HORIZON:
            found.append((prob, steps, False))
            return
        for a, pa in ((0, 1.0 - p1[s]), (1, p1[s])):
            for po, s2, rew in TRANSITIONS[(s, a)]:
                path = steps + [(s, a, rew)]
                if s2 is None:
                    found.append((prob * pa * po, path, True))
                else:
                    walk(s2, prob * pa * po, path)

    walk(0, 1.0, [])
    k, t_max = len(found), HORIZON
    tr = Trajectories(np.zeros((t_max, k), dtype=np.int64), np.zeros((t_max, k), dtype=np.int64),
                      np.zeros((t_max, k)), np.zeros((t_max, k), dtype=bool),
                      np.zeros((t_max, k), dtype=bool), np.array([f[0] for f in found]))
    for j, (_, path, _) in enumerate(found):
        for t, (s, a, rew) in enumerate(path):
            tr.states[t, j], tr.actions[t, j], tr.rewards[t, j] = s, a, rew
            tr.alive[t, j] = True
        tr.episode_end[len(path) - 1, j] = True
    return tr


def estimators(tr: Trajectories, theta=THETA, gamma: float = 1.0):
    """Per-episode gradient estimates ``(whole, rtg)``, each ``[N, 2]`` (one column per
    parameter)."""
    scores = score_table(theta)[tr.states, tr.actions] * tr.alive[..., None]  # [T, N, 2]
    rewards = torch.from_numpy(tr.rewards)
    g_tau = discounted_return(rewards, gamma).numpy()  # [N]
    g_t = reward_to_go(rewards, gamma, torch.from_numpy(tr.episode_end)).numpy()  # [T, N]
    w = discount_weights(gamma, length=tr.rewards.shape[0]).double().numpy()  # [T]
    whole = scores.sum(0) * g_tau[:, None]
    rtg = (scores * (w[:, None] * g_t)[..., None]).sum(0)
    return whole, rtg


def exact_gradient(theta=THETA, gamma: float = 1.0) -> tuple[float, np.ndarray]:
    """``J(θ)`` by backward induction over the horizon, and ``∇J`` from autograd."""
    th = torch.tensor(np.asarray(theta, dtype=np.float64), requires_grad=True)
    p1 = torch.sigmoid(th)
    v = torch.zeros(2, dtype=torch.float64)  # value with 0 steps left
    for _ in range(HORIZON):
        rows = []
        for s in range(2):
            qs = []
            for a in range(2):
                qs.append(sum(po * (rew + (gamma * v[s2] if s2 is not None else 0.0))
                              for po, s2, rew in TRANSITIONS[(s, a)]))
            rows.append((1 - p1[s]) * qs[0] + p1[s] * qs[1])
        v = torch.stack(rows)
    (grad,) = torch.autograd.grad(v[0], th)
    return float(v[0].detach()), grad.numpy()


@dataclass
class RTGResult:
    theta: tuple[float, float]
    gamma: float
    episodes: int
    seed: int
    j: float
    grad: np.ndarray  # [2] exact ∇J
    exact_mean: dict[str, np.ndarray]  # "whole" / "rtg" -> [2]
    exact_var: dict[str, np.ndarray]
    mean: dict[str, np.ndarray]  # sampled
    mean_se: dict[str, np.ndarray]
    var: dict[str, np.ndarray]  # sampled (ddof 1)
    var_se: dict[str, np.ndarray]
    diff_mean: np.ndarray  # sampled mean of whole - rtg (paired), [2]
    diff_se: np.ndarray
    mean_length: float
    finished: float  # share of sampled episodes that ended by "finish"
    n_trajectories: int  # distinct episodes the enumeration found


def _var_se(x: np.ndarray) -> np.ndarray:
    """Standard error of the sample variance (large-sample: ``sqrt((m4 − s⁴)/n)``)."""
    c = x - x.mean(0)
    m2, m4 = (c**2).mean(0), (c**4).mean(0)
    return np.sqrt(np.maximum(m4 - m2**2, 0.0) / len(x))


def reward_to_go_experiment(*, theta=THETA, gamma: float = 1.0, episodes: int = 20000,
                            seed: int = 0) -> RTGResult:
    j, grad = exact_gradient(theta, gamma)
    full = enumerate_trajectories(theta)
    ex = dict(zip(("whole", "rtg"), estimators(full, theta, gamma)))
    p = full.weight
    exact_mean = {k: p @ x for k, x in ex.items()}
    exact_var = {k: p @ (x - exact_mean[k]) ** 2 for k, x in ex.items()}
    tr = sample_trajectories(theta, episodes, seed)
    sm = dict(zip(("whole", "rtg"), estimators(tr, theta, gamma)))
    root_n = np.sqrt(episodes)
    diff = sm["whole"] - sm["rtg"]
    finished = float((tr.episode_end & (tr.states == 1) & (tr.actions == 1)).any(0).mean())
    return RTGResult(
        tuple(float(x) for x in theta), gamma, episodes, seed, j, grad, exact_mean, exact_var,
        {k: x.mean(0) for k, x in sm.items()},
        {k: x.std(0, ddof=1) / root_n for k, x in sm.items()},
        {k: x.var(0, ddof=1) for k, x in sm.items()},
        {k: _var_se(x) for k, x in sm.items()},
        diff.mean(0), diff.std(0, ddof=1) / root_n,
        float(tr.alive.sum(0).mean()), finished, len(p))


def _mdp_table() -> str:
    rows = []
    for (s, a), outcomes in TRANSITIONS.items():
        for prob, s2, rew in outcomes:
            rows.append([STATES[s], f"{a} {ACTIONS[s][a]}", f"{prob:g}",
                         "end" if s2 is None else STATES[s2], f"{rew:+g}"])
    return table(["state", "action", "prob", "next", "reward"], rows, indent=2,
                 align="llrlr")


def format_reward_to_go(*, gamma: float = 1.0, episodes: int = 20000, seed: int = 0) -> str:
    res = reward_to_go_experiment(gamma=gamma, episodes=episodes, seed=seed)
    k_se = 3.0
    rows = []
    for i, name in enumerate(("theta_s0", "theta_s1")):
        for key, label in (("whole", "whole G(tau)"), ("rtg", "reward-to-go")):
            rows.append([name, label,
                         f"{fmt(res.mean[key][i], sign=True)} +- {fmt(res.mean_se[key][i])}",
                         fmt(res.exact_mean[key][i], sign=True),
                         f"{fmt(res.var[key][i])} +- {fmt(res.var_se[key][i])}",
                         fmt(res.exact_var[key][i])])
    ratio = res.exact_var["rtg"] / res.exact_var["whole"]
    lines = [
        title("Reward-to-go vs the whole return: same mean, smaller variance"),
        f"two-state MDP, start s0, at most {HORIZON} steps, gamma = {res.gamma:g}; one logit per "
        f"state,",
        f"pi(action 1 | s) = sigmoid(theta_s), theta = ({res.theta[0]:g}, {res.theta[1]:g})",
        _mdp_table(),
        "",
        f"J = E[sum_t gamma^t r_t] = {res.j:.4f}; exact dJ/dtheta = "
        f"({fmt(res.grad[0], sign=True)}, {fmt(res.grad[1], sign=True)}) (autograd through",
        "backward induction over the horizon)",
        f"{res.episodes} sampled episodes (seed {res.seed}): mean length "
        f"{res.mean_length:.3f} steps, {res.finished:.1%} end by 'finish';",
        f"exact columns: all {res.n_trajectories} possible episodes, weighted by their "
        "probability",
        "whole:        sum_t grad log pi(a_t|s_t) * G(tau)",
        "reward-to-go: sum_t gamma^t grad log pi(a_t|s_t) * G_t",
        "",
        table(["param", "estimator", "sampled mean +- SE", "exact mean",
               "sampled var +- SE", "exact var"], rows, indent=2, align="llrrrr"),
        "",
        "paired difference whole - reward-to-go on the same episodes (exact mean 0):",
        "  " + ", ".join(f"{fmt(m, sign=True)} +- {fmt(s)}" for m, s in zip(res.diff_mean,
                                                                        res.diff_se)),
        f"variance ratio reward-to-go / whole (exact): {ratio[0]:.3f} (theta_s0), "
        f"{ratio[1]:.3f} (theta_s1)",
    ]
    same = all(abs(res.diff_mean[i]) < k_se * res.diff_se[i] for i in range(2))
    lower = all(res.var["rtg"][i] + k_se * res.var_se["rtg"][i]
                < res.var["whole"][i] - k_se * res.var_se["whole"][i] for i in range(2))
    lines += [
        f"sampled: means agree within {k_se:g} SE: {'yes' if same else 'NO'}; reward-to-go "
        f"variance lower by more than {k_se:g} SE each: {'yes' if lower else 'NO'}",
        "",
        "The dropped terms are scores times rewards paid before the action: zero on average",
        "(a score has mean zero whatever happened earlier), but not zero on any one episode.",
        "Leaving them out keeps the mean and removes their spread.",
    ]
    return "\n".join(lines)
