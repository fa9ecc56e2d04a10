"""KL estimators and controllers (docs/theory.md#kl-estimators).

Per-sample estimators of ``KL(p ‖ q)`` from actions sampled from ``p``, given
``logp = log p(a)`` and ``logq = log q(a)`` of the sampled action. With
``log_r = logq − logp``:

* ``k1 = −log_r = logp − logq``: unbiased, **can be negative per sample**. This is the
  per-token KL reward ``log π_old − log π_ref`` of RLHF, and it must not be clamped at 0:
  clamping changes the objective (docs/theory.md#signed-kl-terms: 0.4700, −0.9163, mean 0.1927).
* ``k2 = ½ log_r²``: non-negative, biased, low variance.
* ``k3 = (r − 1) − log_r``: non-negative and unbiased (``E_p[r − 1] = 0``). Stable-Baselines3's
  and CleanRL's ``approx_kl`` is k3 with ``p`` = old policy and ``q`` = new policy.

An estimator unbiased in *value* need not be in *gradient*. Used as a loss on tokens sampled
from the policy ``π`` being trained (``p = π``, ``q = π_ref``, the sampled tokens held fixed),
the per-sample gradients have the expectations (docs/theory.md#the-kl-loss-and-its-gradient):

* k1: ``E_π[∇log π] = 0`` — no pull towards the reference at all;
* k2: ``E_π[(log π − log π_ref) ∇log π] = ∇KL(π ‖ π_ref)`` — the gradient of the KL it
  penalises;
* k3: ``E_π[(1 − π_ref/π) ∇log π] = ∇KL(π_ref ‖ π)`` — the *other* direction's gradient.

:data:`KL_LOSS_ESTIMATORS` lists the ones the KL loss term offers, with that direction.
None of these estimators is clamped or bounded.

:func:`categorical_kl` is the exact KL between full categorical distributions, for when the
whole distribution is available (it sees the unobserved actions that a sampled ratio cannot:
docs/theory.md#unobserved-actions, KL 5.2012 at an observed ratio of 1.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .validation import Tensor, check_positive, check_same_shape, float_inputs

__all__ = [
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_estimate",
    "KL_ESTIMATORS",
    "KL_LOSS_ESTIMATORS",
    "DEFAULT_KL_LOSS_ESTIMATOR",
    "categorical_kl",
    "AdaptiveKLController",
    "ProportionalKLController",
    "FixedKLController",
]


def _pair(logp, logq):
    f = float_inputs({"logp": logp, "logq": logq}, finite=("logp", "logq"))
    check_same_shape(f["logp"], "logp", logq=f["logq"])
    return f["logp"], f["logq"]


def kl_k1(logp, logq) -> Tensor:
    """k1 ``= logp − logq`` per sample (any shape, same for both). May be negative."""
    logp, logq = _pair(logp, logq)
    return logp - logq


def kl_k2(logp, logq) -> Tensor:
    """k2 ``= ½ (logq − logp)²`` per sample (any shape ``[...]``, same for both). Non-negative."""
    logp, logq = _pair(logp, logq)
    return 0.5 * (logq - logp) ** 2


def kl_k3(logp, logq) -> Tensor:
    """k3 ``= exp(logq − logp) − 1 − (logq − logp)`` per sample (any shape ``[...]``, same for
    both). Non-negative.

    Computed as ``expm1(d) − d`` for accuracy near ``d = 0``."""
    logp, logq = _pair(logp, logq)
    d = logq - logp
    return torch.expm1(d) - d


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}

# The estimators of the KL-to-reference loss term (ppokit.core.kl_penalty_loss; the token
# trainer's kl_estimator), each with the gradient its expected gradient is when the tokens
# are samples of the policy being trained (module doc). k1 is not one: its expected
# gradient is 0, it belongs in the reward (kl_mode=reward).
KL_LOSS_ESTIMATORS = {
    "k2": "∇KL(π ‖ π_ref)",  # ½ (log π − log π_ref)²: the gradient of the KL penalised
    "k3": "∇KL(π_ref ‖ π)",  # GRPO's form π_ref/π − 1 − log(π_ref/π): the reverse one's
}
DEFAULT_KL_LOSS_ESTIMATOR = "k2"


def kl_estimate(logp, logq, kind: str = "k3") -> Tensor:
    """Dispatch to ``k1``/``k2``/``k3`` by name (inputs any shape ``[...]``, identical; output
    the same shape); an unknown name lists the known ones."""
    try:
        fn = KL_ESTIMATORS[kind]
    except KeyError:
        raise ValueError(f"kind: unknown KL estimator {kind!r}; known: "
                         f"{', '.join(sorted(KL_ESTIMATORS))}") from None
    return fn(logp, logq)


def categorical_kl(p_logits_or_probs, q_logits_or_probs, *, from_logits: bool = True,
                   dim: int = -1) -> Tensor:
    """Exact ``KL(p ‖ q) = Σ_a p(a) (log p(a) − log q(a))`` over axis ``dim``.

    Shapes: ``[..., A]`` for both (identical); returns ``[...]``. With
    ``from_logits=False`` the inputs are probabilities (each row must sum to 1 within 1e-5).
    Terms with ``p(a) = 0`` contribute 0.
    """
    f = float_inputs({"p": p_logits_or_probs, "q": q_logits_or_probs})
    p, q = f["p"], f["q"]
    check_same_shape(p, "p", q=q)
    if from_logits:
        logp = torch.log_softmax(p, dim=dim)
        logq = torch.log_softmax(q, dim=dim)
    else:
        for name, t in (("p", p), ("q", q)):
            if bool((t < 0).any()) or not bool(
                    torch.allclose(t.sum(dim), torch.ones_like(t.sum(dim)), atol=1e-5)):
                raise ValueError(f"{name}: expected probabilities (non-negative, summing to 1 "
                                 f"along dim {dim})")
        logp, logq = torch.log(p), torch.log(q)
    pp = logp.exp()
    terms = torch.where(pp > 0, pp * (logp - logq), torch.zeros_like(pp))
    return terms.sum(dim)


class _ValueState:
    """``state_dict``/``load_state_dict`` of a controller whose only state is ``value``."""

    value: float

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


@dataclass
class FixedKLController(_ValueState):
    """A constant KL coefficient β (a scalar; ``update(kl)`` takes the measured KL, shape
    ``[]``, and ignores it)."""

    value: float

    def update(self, kl: float, n_steps: int = 1) -> float:  # noqa: ARG002 - same interface
        return self.value


@dataclass
class AdaptiveKLController(_ValueState):
    """The adaptive KL penalty of the PPO paper (Schulman et al. 2017, §4).

    After each policy update with measured ``d = KL``: if ``d > target · tolerance`` then
    ``β ← β · factor``; if ``d < target / tolerance`` then ``β ← β / factor``. The paper
    uses tolerance 1.5 and factor 2. ``β`` is clamped to ``[beta_min, beta_max]``.
    """

    value: float
    target: float
    tolerance: float = 1.5
    factor: float = 2.0
    beta_min: float = 1e-6
    beta_max: float = 1e6

    def __post_init__(self):
        check_positive(self.value, "value")
        check_positive(self.target, "target")
        if not self.tolerance > 1:
            raise ValueError(f"tolerance: expected a number > 1, got {self.tolerance!r}")
        if not self.factor > 1:
            raise ValueError(f"factor: expected a number > 1, got {self.factor!r}")

    def update(self, kl: float, n_steps: int = 1) -> float:  # noqa: ARG002
        if not math.isfinite(kl):
            raise ValueError(f"kl: expected a finite number, got {kl!r}")
        if kl > self.target * self.tolerance:
            self.value *= self.factor
        elif kl < self.target / self.tolerance:
            self.value /= self.factor
        self.value = min(max(self.value, self.beta_min), self.beta_max)
        return self.value


@dataclass
class ProportionalKLController(_ValueState):
    """The proportional controller of Ziegler et al. 2019 used for RLHF (scalars; ``kl`` is the
    batch-mean KL per sequence, shape ``[]``):
    ``e = clip(KL/target − 1, −0.2, 0.2)``, ``β ← β (1 + e · n_steps / horizon)``."""

    value: float
    target: float
    horizon: float = 10000.0

    def __post_init__(self):
        check_positive(self.value, "value")
        check_positive(self.target, "target")
        check_positive(self.horizon, "horizon")

    def update(self, kl: float, n_steps: int = 1) -> float:
        if not math.isfinite(kl):
            raise ValueError(f"kl: expected a finite number, got {kl!r}")
        err = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n_steps / self.horizon
        return self.value
