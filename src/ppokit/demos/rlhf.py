"""The RLHF objective on a five-action "sentence" distribution (docs/theory.md#rlhf-objective).

Maximise ``J(π) = Σ_a π(a) R(a) − β KL(π‖π_ref)`` over the probability simplex. The
maximiser has the closed form ``π*(a) ∝ π_ref(a) exp(R(a)/β)`` (and
``J(π*) = β log Σ_a π_ref(a) exp(R(a)/β)``); :func:`gradient_ascent` reaches it without the
formula, by exponentiated-gradient ascent with ``KL`` from
:func:`ppokit.core.categorical_kl`, all β at once. As ``β → 0``, ``π*`` collapses onto the
highest-reward action; as ``β`` grows it stays at ``π_ref``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ppokit.core import categorical_kl

from ._table import table, title

__all__ = ["ACTIONS", "REWARDS", "REFERENCE", "DEFAULT_BETAS", "closed_form", "gradient_ascent",
           "RLHFRow", "rlhf_sweep", "format_rlhf"]

ACTIONS = ("terse", "helpful", "verbose", "flattering", "off-topic")
REWARDS = (0.2, 1.0, 0.8, 0.9, -1.0)
REFERENCE = (0.35, 0.15, 0.15, 0.05, 0.30)
DEFAULT_BETAS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0)


def _log_ref(ref) -> torch.Tensor:
    return torch.log(torch.tensor(ref, dtype=torch.float64))


def closed_form(beta: float, rewards=REWARDS, ref=REFERENCE) -> np.ndarray:
    """``π* = softmax(log π_ref + R/β)``."""
    z = _log_ref(ref) + torch.tensor(rewards, dtype=torch.float64) / beta
    return torch.softmax(z, dim=-1).numpy()


def objective(pi, beta: float, rewards=REWARDS, ref=REFERENCE) -> tuple[float, float, float]:
    """``(J, E_π[R], KL(π‖π_ref))`` for a probability vector ``π``."""
    p = torch.as_tensor(np.asarray(pi, dtype=np.float64))
    kl = float(categorical_kl(p, torch.tensor(ref, dtype=torch.float64), from_logits=False))
    er = float(p @ torch.tensor(rewards, dtype=torch.float64))
    return er - beta * kl, er, kl


def gradient_ascent(betas, rewards=REWARDS, ref=REFERENCE, *, steps: int = 60,
                    step: float = 0.5) -> np.ndarray:
    """Maximise ``J`` for every β by exponentiated-gradient (mirror) ascent on the simplex:
    ``log π ← log π + (step/β) ∇_π J``, renormalised, from ``π = π_ref``. ``∇_π J`` comes from
    autograd through :func:`ppokit.core.categorical_kl`; the formula for ``π*`` is not used.
    Each step shrinks the distance to the optimum in log space by ``1 − step``.
    Returns ``[len(betas), A]`` probabilities."""
    log_ref = _log_ref(ref)
    b = torch.tensor(betas, dtype=torch.float64)
    r = torch.tensor(rewards, dtype=torch.float64)
    ref_p = log_ref.exp().expand(len(betas), -1)
    logp = log_ref.repeat(len(betas), 1)
    for _ in range(steps):
        p = logp.exp().requires_grad_(True)
        j = (p * r).sum(-1) - b * categorical_kl(p, ref_p, from_logits=False)
        (g,) = torch.autograd.grad(j.sum(), p)
        logp = torch.log_softmax(logp + (step / b)[:, None] * g, dim=-1)
    return logp.exp().numpy()


@dataclass
class RLHFRow:
    beta: float
    pi: np.ndarray  # closed form
    pi_ascent: np.ndarray  # gradient ascent
    objective: float
    expected_reward: float
    kl: float

    @property
    def max_gap(self) -> float:
        return float(np.abs(self.pi - self.pi_ascent).max())


def rlhf_sweep(betas=DEFAULT_BETAS, *, steps: int = 60) -> list[RLHFRow]:
    ga = gradient_ascent(betas, steps=steps)
    rows = []
    for i, beta in enumerate(betas):
        pi = closed_form(beta)
        j, er, kl = objective(pi, beta)
        rows.append(RLHFRow(float(beta), pi, ga[i], j, er, kl))
    return rows


def format_rlhf(betas=DEFAULT_BETAS) -> str:
    rows = rlhf_sweep(betas)
    heads = ["beta"] + list(ACTIONS) + ["E[R]", "KL", "J", "max|GA-pi*|"]
    body = [[f"{r.beta:g}"] + [f"{x:.4f}" for x in r.pi]
            + [f"{r.expected_reward:.4f}", f"{r.kl:.4f}", f"{r.objective:.4f}",
               f"{r.max_gap:.1e}"] for r in rows]
    ref_row = (["pi_ref"] + [f"{x:.4f}" for x in REFERENCE]
               + [f"{float(np.dot(REFERENCE, REWARDS)):.4f}", "0.0000", "", ""])
    rew_row = ["reward"] + [f"{x:+.2f}" for x in REWARDS] + ["", "", "", ""]
    best = ACTIONS[int(np.argmax(REWARDS))]
    lines = [
        title("RLHF objective: max_pi E_pi[R] - beta * KL(pi || pi_ref), five actions"),
        "closed form pi* ~ pi_ref * exp(R / beta); max|GA-pi*| compares it with 60 steps of",
        "exponentiated-gradient ascent on J (gradients by autograd through",
        "ppokit.core.categorical_kl), which never uses the formula",
        "",
        table(heads, [rew_row, ref_row] + body, align="r" * len(heads)),
        "",
        f"beta -> 0: pi* collapses onto the highest-reward action ('{best}'), whatever its",
        "reference probability; the KL to the reference grows to -log pi_ref(best).",
        "beta large: pi* stays at pi_ref and the expected reward stays at the reference's.",
        "In between, 'flattering' (reward 0.9, rare under pi_ref) gains less than its",
        "reward suggests: the KL term prices moving probability away from the reference.",
    ]
    return "\n".join(lines)
