"""PPO-Clip, one sample at a time (docs/theory.md#ppo-clip).

Every objective and gradient comes from :func:`ppokit.core.clipped_surrogate_loss` and
autograd: the gradient reported is ``d/dρ`` of the per-sample surrogate
``min(ρÂ, clip(ρ, 1−ε, 1+ε)Â)``. A sample can lie outside ``[1−ε, 1+ε]`` and still have a
gradient (the "wrong" side); only the side the advantage pushes towards is flattened.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ppokit.core import clipped_surrogate_loss

from ._table import fmt, table, title

__all__ = ["ClipRow", "clip_rows", "TABLE_CASES", "SWEEP_RATIOS", "format_clip",
           "surrogate_curve"]

TABLE_CASES = ((1.35, 1.0), (0.65, 1.0), (1.35, -1.0), (0.65, -1.0), (1.10, 0.5), (0.90, -0.5))
SWEEP_RATIOS = (0.5, 0.8, 1.0, 1.2, 1.5)


@dataclass
class ClipRow:
    ratio: float
    adv: float
    unclipped: float  # ρ Â
    clipped: float  # clip(ρ) Â
    objective: float  # min of the two
    grad: float  # d objective / d ρ (autograd; at ρ = 1 ± ε the in-range side)
    outside: bool  # |ρ − 1| > ε
    grad_zero: bool  # the clip is active: no gradient for this sample
    eps: float = 0.2


def clip_rows(cases, eps: float = 0.2) -> list[ClipRow]:
    """Evaluate ``(ratio, advantage)`` pairs through ``clipped_surrogate_loss``."""
    ratios = torch.tensor([c[0] for c in cases], dtype=torch.float64)
    adv = torch.tensor([c[1] for c in cases], dtype=torch.float64)
    logp = ratios.log().requires_grad_(True)
    out = clipped_surrogate_loss(logp, torch.zeros_like(ratios), adv, clip_eps=eps)
    # samples are independent: the gradient of the sum is each sample's own gradient
    (-out.per_sample.sum()).backward()
    with torch.no_grad():
        r = out.ratio
        grad = (logp.grad / r).numpy()  # d/dρ = d/dlogρ · dlogρ/dρ
        obj = (-out.per_sample).numpy()
        unclipped = (r * adv).numpy()
        clipped = (torch.clamp(r, 1 - eps, 1 + eps) * adv).numpy()
    rows = []
    for i, (rv, av) in enumerate(cases):
        outside = bool(abs(rv - 1.0) > eps + 1e-12)
        rows.append(ClipRow(float(rv), float(av), float(unclipped[i]), float(clipped[i]),
                            float(obj[i]), float(grad[i]) + 0.0, outside,
                            bool(grad[i] == 0.0), float(eps)))
    return rows


def surrogate_curve(ratios: np.ndarray, adv: float, eps: float = 0.2) -> np.ndarray:
    """Per-sample PPO-Clip objective over a grid of ratios (for the figure)."""
    r = torch.as_tensor(np.asarray(ratios, dtype=np.float64))
    out = clipped_surrogate_loss(r.log(), torch.zeros_like(r), torch.full_like(r, adv),
                                 clip_eps=eps)
    return (-out.per_sample).detach().numpy()


def _state(row: ClipRow) -> str:
    if row.grad_zero:
        return "clipped: gradient 0"
    if row.outside:
        return "outside, gradient kept"
    if abs(abs(row.ratio - 1.0) - row.eps) < 1e-9:
        return "on the edge (kink)"
    return "inside the range"


def format_clip(eps: float = 0.2) -> str:
    rows = clip_rows(TABLE_CASES, eps)
    t1 = table(
        ["ratio", "A", "ratio*A", "clip(ratio)*A", "min", "clipped?", "d min/d ratio"],
        [[f"{r.ratio:.2f}", f"{r.adv:+.1f}", f"{r.unclipped:.3f}", f"{r.clipped:.3f}",
          f"{r.objective:.3f}", "yes" if r.grad_zero else "no", fmt(r.grad, 3)]
         for r in rows], align="rrrrrlr")
    sweep = clip_rows([(r, a) for r in SWEEP_RATIOS for a in (1.0, -1.0)], eps)
    pos, neg = sweep[0::2], sweep[1::2]
    t2 = table(
        ["r", "A=+1: min", "grad", "state", "A=-1: min", "grad", "state"],
        [[f"{p.ratio:.1f}", f"{p.objective:+.2f}", fmt(p.grad, 2, sign=True), _state(p),
          f"{n.objective:+.2f}", fmt(n.grad, 2, sign=True), _state(n)]
         for p, n in zip(pos, neg)], align="rrrlrrl")
    lo, hi = 1 - eps, 1 + eps
    lines = [
        title(f"PPO-Clip per sample: min(ratio*A, clip(ratio, {lo:g}, {hi:g})*A)"),
        f"eps={eps:g}; objective and gradient from ppokit.core.clipped_surrogate_loss",
        "",
        table_header := "Single-sample table",
        "-" * len(table_header),
        t1,
        "",
        "'clipped?' means the min picked the clipped term, so the sample's gradient is 0.",
        "Rows 2 and 3 are outside the range too, on the side the advantage pushes away",
        "from, and keep their full gradient: a good action made less likely, a bad action",
        "made more likely, are still corrected.",
        "",
        "Ratio sweep for A = +1 and A = -1",
        "---------------------------------",
        t2,
        "",
        f"A=+1 is capped at {hi:+.2f} for r >= {hi:g}; A=-1 is floored at {-lo:+.2f} for "
        f"r <= {lo:g},",
        "while r=1.5 with A=-1 keeps its full penalty. At r exactly 1 +/- eps the surrogate",
        "has a kink; autograd reports the derivative from inside the range.",
    ]
    return "\n".join(lines)
