"""Unclipped vs PPO-Clip on a two-arm bandit, many epochs on one batch (docs/theory.md#bandit).

The old policy picks the good and the bad arm with probability 0.5 each; the advantages are
fixed at ``[+1, −1]``. Each epoch takes one gradient-ascent step on the *exact* expectation
of the surrogate over the old distribution (no sampled actions), with one logit ``θ``
(``p(good) = σ(θ)``). The PPO-Clip surrogate comes from
:func:`ppokit.core.clipped_surrogate_loss`, gradients from autograd, ``KL(old‖new)`` from
:func:`ppokit.core.categorical_kl`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ppokit.core import categorical_kl, clipped_surrogate_loss

from ._table import fmt, table, title

__all__ = ["BanditStep", "bandit_objective", "bandit_run", "format_bandit", "SNAPSHOT_EPOCHS",
           "OLD_PROBS", "ADVANTAGES"]

OLD_PROBS = (0.5, 0.5)  # (good, bad)
ADVANTAGES = (1.0, -1.0)
SNAPSHOT_EPOCHS = (1, 2, 3, 6, 11, 21, 40)


@dataclass
class BanditStep:
    epoch: int
    p_good: float  # after the step
    ratio_good: float  # after the step
    grad: float  # d objective / dθ used for the step
    kl: float  # KL(old ‖ new) after the step


def bandit_objective(theta: torch.Tensor, clipped: bool, eps: float = 0.2) -> torch.Tensor:
    """``E_{a∼old}[surrogate]`` as a function of the logit ``θ`` (a 0-d tensor).

    The old distribution is uniform, so the expectation is the plain mean over the two arms.
    """
    logp = torch.stack([torch.nn.functional.logsigmoid(theta),
                        torch.nn.functional.logsigmoid(-theta)])
    logp_old = torch.log(torch.tensor(OLD_PROBS, dtype=theta.dtype))
    adv = torch.tensor(ADVANTAGES, dtype=theta.dtype)
    if clipped:
        return -clipped_surrogate_loss(logp, logp_old, adv, clip_eps=eps).loss
    return (torch.exp(logp - logp_old) * adv).mean()


def _grad(theta: float, clipped: bool, eps: float) -> float:
    th = torch.tensor(theta, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(bandit_objective(th, clipped, eps), th)
    return float(g)


def bandit_run(clipped: bool, *, epochs: int = 40, lr: float = 0.3, eps: float = 0.2,
               target_kl: float | None = None) -> list[BanditStep]:
    """Run up to ``epochs`` ascent steps; with ``target_kl`` stop after the first epoch whose
    ``KL(old‖new)`` exceeds it (checked after the step, so that step is kept)."""
    theta = 0.0
    old = torch.tensor(OLD_PROBS, dtype=torch.float64)
    steps = []
    for epoch in range(1, epochs + 1):
        g = _grad(theta, clipped, eps)
        theta += lr * g
        p = float(torch.sigmoid(torch.tensor(theta, dtype=torch.float64)))
        kl = float(categorical_kl(old, torch.tensor([p, 1.0 - p], dtype=torch.float64),
                                  from_logits=False))
        steps.append(BanditStep(epoch, p, p / OLD_PROBS[0], g + 0.0, kl))
        if target_kl is not None and kl > target_kl:
            break
    return steps


def _first_zero_grad(steps: list[BanditStep]) -> BanditStep | None:
    return next((s for s in steps if s.grad == 0.0), None)


def format_bandit(*, epochs: int = 40, lr: float = 0.3, eps: float = 0.2,
                  target_kl: float | None = None) -> str:
    runs = {mode: bandit_run(mode == "PPO-Clip", epochs=epochs, lr=lr, eps=eps,
                             target_kl=target_kl)
            for mode in ("unclipped", "PPO-Clip")}
    rows = []
    for mode, steps in runs.items():
        show = {e for e in SNAPSHOT_EPOCHS if e <= epochs} | {steps[-1].epoch}
        for s in steps:
            if s.epoch in show:
                rows.append([mode, str(s.epoch), fmt(s.p_good), fmt(s.ratio_good),
                             fmt(s.grad), fmt(s.kl)])
    lines = [
        title("Two-arm bandit: many epochs on one batch, unclipped vs PPO-Clip"),
        f"old policy (good, bad) = {OLD_PROBS}, advantages = {ADVANTAGES}, lr={lr:g}, "
        f"eps={eps:g}, epochs={epochs}"
        + (f", target_kl={target_kl:g}" if target_kl is not None else ""),
        "exact expectation over the old distribution (no sampling); one logit theta;",
        "grad is d objective/d theta used for that epoch's step; p, ratio, KL after it",
        "",
        table(["mode", "epoch", "p(good)", "ratio_good", "grad", "KL(old||new)"], rows,
              align="lrrrrr"),
        "",
        "Guards",
        "------",
    ]
    full_clip = runs["PPO-Clip"] if target_kl is None else bandit_run(
        True, epochs=epochs, lr=lr, eps=eps)
    z = _first_zero_grad(full_clip)
    if z is None:
        lines.append(f"clip (PPO-Clip): the gradient is still nonzero after {epochs} epochs")
    else:
        crossed = full_clip[z.epoch - 2]
        lines.append(f"clip (PPO-Clip): last moving step is epoch {crossed.epoch} (ratio "
                     f"{crossed.ratio_good:.4f} past the edge {1 + eps:g}, KL "
                     f"{crossed.kl:.4f});")
        lines.append(f"                 the gradient is 0 from epoch {z.epoch} on")
    lines.append("clip (unclipped): none; the ratio keeps growing")
    p_edge = OLD_PROBS[0] * (1 + eps)
    kl_edge = float(categorical_kl(torch.tensor(OLD_PROBS, dtype=torch.float64),
                                   torch.tensor([p_edge, 1 - p_edge], dtype=torch.float64),
                                   from_logits=False))
    lines.append(f"(for reference: KL(old||new) at the clip edge ratio {1 + eps:g} is "
                 f"{kl_edge:.4f})")
    if target_kl is not None:
        for mode, steps in runs.items():
            last = steps[-1]
            if last.kl > target_kl:
                lines.append(f"target_kl {target_kl:g} ({mode}): stops after epoch {last.epoch} "
                             f"(KL {last.kl:.4f}, ratio {last.ratio_good:.4f})")
            else:
                lines.append(f"target_kl {target_kl:g} ({mode}): never exceeded in {last.epoch} "
                             f"epochs (KL {last.kl:.4f})")
    lines += [
        "",
        "Neither guard is a projection: the clip stops the gradient only after a discrete",
        "step has crossed the edge, and the KL check stops the epochs only after the step",
        "that exceeded the target has been taken.",
    ]
    return "\n".join(lines)
