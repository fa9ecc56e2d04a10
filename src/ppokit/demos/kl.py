"""KL demos (docs/theory.md#kl-estimators).

* ``unobserved_action``: a sampled ratio cannot see the actions that were not sampled. The old
  policy ``[0.5, 0.25, 0.25]`` moves to ``[0.6, 0.4 − 1e−10, 1e−10]``: the observed action's
  ratio is 1.2 (on the edge of a 0.2 clip range), yet the exact ``KL(old‖new)`` is 5.2012.
  The k3 estimator averaged over the *whole* old distribution equals the exact KL (because
  ``E_old[ρ − 1] = 0``); averaged over the one observed action it sees almost nothing.
* ``reference_terms``: per-action k1 terms ``log π_old − log π_ref`` of the RLHF KL reward,
  ``π_old = [0.8, 0.2]``, ``π_ref = [0.5, 0.5]``: 0.4700 and −0.9163, expectation under
  ``π_old`` 0.1927 (the exact KL). Clamping the negative term at 0 changes the objective.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ppokit.core import categorical_kl, kl_k1, kl_k3

from ._table import fmt, table, title

__all__ = ["UnobservedAction", "unobserved_action", "ReferenceTerms", "reference_terms",
           "format_kl"]

OLD = (0.5, 0.25, 0.25)
NEW = (0.6, 0.4 - 1e-10, 1e-10)
REF_OLD = (0.8, 0.2)
REF = (0.5, 0.5)


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


@dataclass
class UnobservedAction:
    old: np.ndarray
    new: np.ndarray
    ratios: np.ndarray
    k1_terms: np.ndarray  # log old − log new per action
    k3_terms: np.ndarray  # (ρ − 1) − log ρ per action
    exact_kl: float  # categorical_kl(old, new)
    k1_expectation: float  # Σ old · k1
    k3_expectation: float  # Σ old · k3

    @property
    def observed_ratio(self) -> float:
        return float(self.ratios[0])


def unobserved_action(old=OLD, new=NEW) -> UnobservedAction:
    o, n = _t(old), _t(new)
    lo, ln = o.log(), n.log()
    k1 = kl_k1(lo, ln)
    k3 = kl_k3(lo, ln)
    return UnobservedAction(
        old=o.numpy(), new=n.numpy(), ratios=(ln - lo).exp().numpy(), k1_terms=k1.numpy(),
        k3_terms=k3.numpy(), exact_kl=float(categorical_kl(o, n, from_logits=False)),
        k1_expectation=float((o * k1).sum()), k3_expectation=float((o * k3).sum()))


@dataclass
class ReferenceTerms:
    old: np.ndarray
    ref: np.ndarray
    terms: np.ndarray  # k1 per action: log π_old − log π_ref
    mean: float  # Σ π_old · terms (the per-token KL reward's expectation)
    clamped_mean: float  # Σ π_old · max(terms, 0): what clamping would optimise
    exact_kl: float  # categorical_kl(π_old, π_ref)


def reference_terms(old=REF_OLD, ref=REF) -> ReferenceTerms:
    o, r = _t(old), _t(ref)
    k1 = kl_k1(o.log(), r.log())
    return ReferenceTerms(
        old=o.numpy(), ref=r.numpy(), terms=k1.numpy(), mean=float((o * k1).sum()),
        clamped_mean=float((o * k1.clamp(min=0)).sum()),
        exact_kl=float(categorical_kl(o, r, from_logits=False)))


def format_kl() -> str:
    u = unobserved_action()
    rows = [[str(i), f"{u.old[i]:.2f}", f"{u.new[i]:.10g}", f"{u.ratios[i]:.4g}",
             fmt(u.k1_terms[i]), fmt(u.old[i] * u.k1_terms[i]), fmt(u.k3_terms[i])]
            for i in range(len(u.old))]
    t1 = table(["action", "old", "new", "ratio", "log old/new", "old*log old/new",
                "k3 = (r-1) - log r"], rows, align="rrrrrrr", indent=3)
    r = reference_terms()
    rrows = [[str(i), f"{r.old[i]:.2f}", f"{r.ref[i]:.2f}", fmt(r.terms[i], sign=True),
              fmt(max(r.terms[i], 0.0), sign=True)] for i in range(len(r.old))]
    t2 = table(["action", "pi_old", "pi_ref", "k1 = log old/ref", "clamped at 0"], rrows,
               align="rrrrr", indent=3)
    lines = [
        title("KL: what a sampled ratio cannot see, and why k1 terms stay signed"),
        "",
        "1. One observed action, two unobserved ones",
        f"   old = {list(OLD)}, new = [0.6, 0.4 - 1e-10, 1e-10]; action 0 was sampled",
        t1,
        f"   observed ratio (action 0)          {u.observed_ratio:.4f}   (clip range 0.8..1.2)",
        f"   k3 of the observed sample alone    {u.k3_terms[0]:.4f}",
        f"   exact KL(old||new), categorical_kl {u.exact_kl:.4f}",
        f"   E_old[k3], all actions             {u.k3_expectation:.4f}",
        f"   E_old[k1], all actions             {u.k1_expectation:.4f}",
        "   Action 2 lost almost all its probability. No sampled ratio of action 0 shows it;",
        "   the full-distribution KL does. The clip bounds the incentive on sampled actions,",
        "   it is not a KL trust region.",
        "",
        "2. Per-token KL reward terms against a reference model",
        t2,
        f"   E_pi_old[k1]          {r.mean:.4f}   (= exact KL(pi_old||pi_ref) {r.exact_kl:.4f})",
        f"   E_pi_old[max(k1, 0)]  {r.clamped_mean:.4f}   clamping negatives changes the "
        "objective",
        "   A single k1 term can be negative; only its expectation is a KL. Keep the sign.",
    ]
    return "\n".join(lines)
