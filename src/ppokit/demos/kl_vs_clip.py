"""KL penalty ("spring") against the clip ("guard rail"), one sample (docs/theory.md#kl-vs-clip).

Per sample with ratio ``r`` and advantage ``A``:

* KL-penalised surrogate ``f_β(r) = r A − β (r − 1 − log r)``. The penalty is the k3
  estimator (:func:`ppokit.core.kl_k3`): zero at ``r = 1``, rising on both sides, and its
  expectation over actions drawn from the old policy is ``KL(π_old‖π_new)``.
  ``f_β' = A − β (1 − 1/r)``, so the maximiser is ``r* = β/(β − A)`` when ``β > A`` (for
  ``A = +1``: ``β/(β − 1)``; for ``A = −1``: ``β/(β + 1)``); for ``A = +1`` and ``β ≤ 1`` the
  objective grows without bound.
* PPO-Clip ``min(r A, clip(r, 1−ε, 1+ε) A)`` (:func:`ppokit.core.clipped_surrogate_loss`):
  no single maximiser — a plateau from ``1+ε`` up (``A > 0``) or from ``1−ε`` down (``A < 0``).

The spring pulls ``r`` back once it is past ``r*`` (negative slope); the rail only stops
pushing (zero slope) and never pulls back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ppokit.core import clipped_surrogate_loss, kl_k3

from ._table import table, title

__all__ = ["kl_objective", "clip_objective", "kl_maximiser", "numeric_maximiser",
           "MaximiserRow", "maximisers", "DEFAULT_BETAS", "TABLE_RATIOS", "format_kl_vs_clip"]

DEFAULT_BETAS = (0.5, 1.0, 2.0, 4.0, 6.0, 10.0, 20.0, 50.0)
TABLE_RATIOS = (0.5, 0.8, 0.9, 1.0, 1.1, 1.2, 1.5, 2.0, 3.0)
_GRID = np.geomspace(1e-3, 1e3, 6001)


def kl_objective(ratios, adv: float, beta: float) -> np.ndarray:
    """``r A − β k3(r)`` over an array of ratios."""
    r = torch.as_tensor(np.asarray(ratios, dtype=np.float64))
    pen = kl_k3(torch.zeros_like(r), r.log())  # (r − 1) − log r
    return (r * adv - beta * pen).numpy()


def clip_objective(ratios, adv: float, eps: float = 0.2) -> np.ndarray:
    r = torch.as_tensor(np.asarray(ratios, dtype=np.float64))
    out = clipped_surrogate_loss(r.log(), torch.zeros_like(r), torch.full_like(r, adv),
                                 clip_eps=eps)
    return (-out.per_sample).numpy()


def kl_maximiser(adv: float, beta: float) -> float:
    """Closed-form ``argmax_r f_β(r)``: ``β/(β − A)``, or ``inf`` if unbounded (β ≤ A)."""
    return beta / (beta - adv) if beta > adv else math.inf


def numeric_maximiser(adv: float, beta: float) -> float:
    """Numerical ``argmax_r f_β(r)`` without the closed form: a log-spaced grid over
    ``r ∈ [1e−3, 1e3]``, then golden-section search on ``log r`` between the grid
    neighbours. ``inf`` when the grid maximum is its top edge (still rising there)."""
    f = kl_objective(_GRID, adv, beta)
    i = int(np.argmax(f))
    if i == len(_GRID) - 1:
        return math.inf
    lo, hi = math.log(_GRID[max(i - 1, 0)]), math.log(_GRID[i + 1])
    g = (math.sqrt(5.0) - 1.0) / 2.0

    def val(x: float) -> float:
        return float(kl_objective(np.array([math.exp(x)]), adv, beta)[0])

    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = val(a), val(b)
    for _ in range(80):
        if fa < fb:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = val(b)
        else:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = val(a)
    return math.exp((lo + hi) / 2.0)


@dataclass
class MaximiserRow:
    beta: float
    r_pos: float  # closed form, A = +1
    r_pos_numeric: float
    r_neg: float  # closed form, A = −1
    r_neg_numeric: float


def maximisers(betas=DEFAULT_BETAS) -> list[MaximiserRow]:
    return [MaximiserRow(float(b), kl_maximiser(1.0, b), numeric_maximiser(1.0, b),
                         kl_maximiser(-1.0, b), numeric_maximiser(-1.0, b)) for b in betas]


def _r(x: float) -> str:
    return "unbounded" if math.isinf(x) else f"{x:.4f}"


def format_kl_vs_clip(eps: float = 0.2, betas=DEFAULT_BETAS) -> str:
    rows = maximisers(betas)
    t1 = table(["beta", "A=+1: r*", "numeric", "A=-1: r*", "numeric"],
               [[f"{m.beta:g}", _r(m.r_pos), _r(m.r_pos_numeric), _r(m.r_neg),
                 _r(m.r_neg_numeric)] for m in rows], align="rrrrr")
    show_b = (1.0, 4.0, 6.0)
    r = np.array(TABLE_RATIOS)
    pen = kl_objective(r, 0.0, -1.0)  # 0·r + k3(r)
    cols = [clip_objective(r, 1.0, eps)] + [kl_objective(r, 1.0, b) for b in show_b]
    cols += [clip_objective(r, -1.0, eps)] + [kl_objective(r, -1.0, b) for b in show_b]
    heads = (["r", "k3(r)", "+1 clip"] + [f"+1 b={b:g}" for b in show_b] + ["-1 clip"]
             + [f"-1 b={b:g}" for b in show_b])
    t2 = table(heads, [[f"{x:.1f}", f"{pen[i]:.4f}"] + [f"{c[i]:+.3f}" for c in cols]
                       for i, x in enumerate(r)], align="r" * len(heads))
    b_pos = (1 + eps) / eps  # β/(β−1) = 1+ε
    b_neg = (1 - eps) / eps  # β/(β+1) = 1−ε
    lines = [
        title("KL penalty (spring) vs clip (guard rail), one sample"),
        "KL-penalised: f(r) = r*A - beta*(r - 1 - log r)    clip: min(r*A, clip(r)*A), "
        f"eps={eps:g}",
        "",
        "Where the maximiser of r lands",
        t1,
        f"  clip: A=+1 -> any r >= {1 + eps:g} (plateau {1 + eps:+.2f}); "
        f"A=-1 -> any r <= {1 - eps:g} (plateau {-(1 - eps):+.2f})",
        f"  the spring's maximiser sits on the clip edge at beta={b_pos:g} (A=+1) and "
        f"beta={b_neg:g} (A=-1)",
        "",
        "Objective over r: '+1 ...' columns are A=+1, '-1 ...' columns A=-1; b = beta",
        t2,
        "",
        "Larger beta pulls r* towards 1 from both sides, smoothly. Past r* the spring's",
        "slope is negative: it pulls r back. The clip is flat past its edge on the side the",
        "advantage pushes to: it stops pushing but does not pull back, and on the other",
        "side it does nothing at all. For A=+1 a spring weaker than |A| (beta <= 1) does",
        "not hold r at all.",
    ]
    return "\n".join(lines)
