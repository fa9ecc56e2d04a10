"""``ppokit check``: pre-flight acceptance checks on a policy before spending compute.

>>> from ppokit.checks import run_checks
>>> report = run_checks(policy, env="CartPole-v1")      # doctest: +SKIP
>>> report.ok, report.failed                              # doctest: +SKIP

``run_checks`` works on any object with ppokit's policy interface
(:class:`ppokit.policies.Policy`: ``act``, ``evaluate``, ...). The checks and what each
failure usually means are described in :mod:`ppokit.checks.policy_checks` and
:mod:`ppokit.checks.labels`; :func:`run_token_checks` (:mod:`ppokit.checks.token_checks`)
runs the token-layout checks on a causal language model.
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
           "run_checks", "run_token_checks", "POLICY_CHECKS"]


def run_token_checks(model, tokenizer, **kwargs) -> CheckReport:
    """Token-layout checks on a causal LM (see
    :func:`ppokit.checks.token_checks.run_token_checks` for the arguments)."""
    from .token_checks import run_token_checks as _run

    return _run(model, tokenizer, **kwargs)

POLICY_CHECKS = ("ratio-identity", "zero-advantage-gradient", "flipped-advantage-direction",
                 "surrogate-finite-difference")


def run_checks(policy, batch: Batch | None = None, *, env: str = "CartPole-v1",
               surrogate: Surrogate | None = None, clip_eps: float = 0.2, n: int = 256,
               seed: int = 0, labels: bool = False, trainer_cls=None,
               extra: list[Callable[[], CheckResult]] | None = None,
               target: str | None = None) -> CheckReport:
    """Run the pre-flight checks on ``policy``.

    Args:
        policy: an object with ppokit's policy interface (a ``torch.nn.Module``).
        batch: observations, actions and collection-time log-probs to check on; when
            omitted, ``n`` transitions are collected from ``env`` with ``policy.act``.
        surrogate: the policy loss ``(logp, logp_old, advantages, mask=None) -> scalar``
            to check; default ppokit's PPO-Clip with ``clip_eps``.
        labels: also run ``labels-frozen``: a tiny rollout and a two-epoch update of
            ppokit's trainer (``trainer_cls``, default :class:`ppokit.algos.Trainer`) on
            ``env`` with a copy of ``policy``.
        extra: further checks (zero-argument callables returning a :class:`CheckResult`).
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
    if labels:
        from .labels import check_labels_frozen

        results.append(check_labels_frozen(policy, env=env, trainer_cls=trainer_cls,
                                           seed=seed))
    for fn in extra or []:
        results.append(fn())
    return CheckReport(target or type(policy).__name__, results)
