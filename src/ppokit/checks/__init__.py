"""``ppokit check``: pre-flight acceptance checks on a policy before spending compute.

>>> from ppokit.checks import run_checks
>>> report = run_checks(policy, env="CartPole-v1")      # doctest: +SKIP
>>> report.ok, report.failed                              # doctest: +SKIP

``run_checks`` works on any object with ppokit's policy interface
(:class:`ppokit.policies.Policy`: ``act``, ``evaluate``, ...). The checks and what each
failure usually means are described in :mod:`ppokit.checks.policy_checks`.
"""

from __future__ import annotations

from collections.abc import Callable

from .policy_checks import (
    Batch,
    Surrogate,
    check_finite_difference,
    check_flipped_direction,
    check_ratio_identity,
    check_zero_advantage,
    collect_batch,
    ppo_surrogate,
)
from .result import CheckReport, CheckResult

__all__ = ["Batch", "CheckReport", "CheckResult", "collect_batch", "ppo_surrogate",
           "run_checks", "POLICY_CHECKS"]

POLICY_CHECKS = ("ratio-identity", "zero-advantage-gradient", "flipped-advantage-direction",
                 "surrogate-finite-difference")


def run_checks(policy, batch: Batch | None = None, *, env: str = "CartPole-v1",
               surrogate: Surrogate | None = None, clip_eps: float = 0.2, n: int = 256,
               seed: int = 0, extra: list[Callable[[], CheckResult]] | None = None,
               target: str | None = None) -> CheckReport:
    """Run the pre-flight checks on ``policy``.

    Args:
        policy: an object with ppokit's policy interface (a ``torch.nn.Module``).
        batch: observations, actions and collection-time log-probs to check on; when
            omitted, ``n`` transitions are collected from ``env`` with ``policy.act``.
        surrogate: the policy loss ``(logp, logp_old, advantages, mask=None) -> scalar``
            to check; default ppokit's PPO-Clip with ``clip_eps``.
        extra: further checks (zero-argument callables returning a :class:`CheckResult`),
            e.g. the label-freezing check of a trainer.
    """
    surrogate = surrogate or ppo_surrogate(clip_eps)
    if batch is None:
        batch = collect_batch(policy, env, n=n, seed=seed)
    results = [
        check_ratio_identity(policy, batch),
        check_zero_advantage(policy, batch, surrogate, seed=seed),
        check_flipped_direction(policy, batch, surrogate, seed=seed),
        check_finite_difference(policy, batch, surrogate, seed=seed),
    ]
    for fn in extra or []:
        results.append(fn())
    return CheckReport(target or type(policy).__name__, results)
