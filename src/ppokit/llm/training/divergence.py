"""The divergence guard: an update that moves the policy too far is undone and retried at a
smaller learning rate, instead of training on a wrecked model.

One optimiser step at a learning rate a pretrained model does not tolerate can move every
weight coherently and leave a policy that no longer writes language; the KL term to the
reference then grows without bound and the next updates only make it worse. The guard
watches two figures of each iteration's update:

* ``kl_after``: how far the update moved the policy, the mean over action tokens of the k3
  estimate of KL(π_old ‖ π_new) on the iteration's own samples (π_old is the policy that
  sampled them, π_new the policy after the update), measured on up to ``PROBE_ROWS``
  sequences spread over the batch, without a gradient. PPO's target KL is of the order of
  0.01–0.05 per step; a whole iteration that moves the policy half a nat per token has
  broken it;
* ``grad_norm_max``: the largest gradient norm (before clipping) of the update's steps;
  and any non-finite loss or gradient.

When a figure passes its limit (``guard_kl``, ``guard_grad_norm``), the trained parameters,
the optimiser state and the minibatch shuffling are put back as they were before the
update, every learning rate is halved, and the update is run again on the same samples;
after ``guard_retries`` halvings in one iteration training stops with
:class:`TrainingDiverged`, whose message names the figures and what to change. Each
rollback is logged, and ``guard_rollbacks`` and ``learning_rate`` are in the metrics.
"""

from __future__ import annotations

import copy
import math

import torch

from ppokit.core.validation import NonFiniteError
from ppokit.errors import UsageError

__all__ = ["TrainingDiverged", "DivergenceGuard", "PROBE_ROWS", "update_kl", "guarded_update",
           "tolerated_learning_rate", "learning_rate_warning"]

PROBE_ROWS = 8
# models below this size (the built-in model, test and bench models) train at their own rates
PRETRAINED_MIN_PARAMS = 20_000_000
REFERENCE_PARAMS = 135_000_000  # SmolLM2-135M, where the rates below were measured


class TrainingDiverged(UsageError):
    """The guard's retries were exhausted: training stopped (the last checkpoint is
    intact)."""


def update_kl(new_logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over ``mask`` of k3 = r − 1 − log r with r = π_new / π_old, the tokens sampled
    from π_old: an estimate of KL(π_old ‖ π_new) per action token (0 without one)."""
    d = (new_logp - old_logp)[mask]
    if d.numel() == 0:
        return 0.0
    return float((torch.expm1(d) - d).mean())


class DivergenceGuard:
    """Snapshots and rollbacks around one update (see the module docstring)."""

    def __init__(self, kl_limit: float | None, grad_norm_limit: float | None, retries: int,
                 log=print):
        self.kl_limit, self.grad_limit, self.retries = kl_limit, grad_norm_limit, retries
        self.log = log

    @property
    def enabled(self) -> bool:
        return self.kl_limit is not None or self.grad_limit is not None

    def snapshot(self, params: list[torch.Tensor], opt, generator: torch.Generator):
        return ([p.detach().clone() for p in params], copy.deepcopy(opt.state_dict()),
                generator.get_state())

    @staticmethod
    def restore(snap, params: list[torch.Tensor], opt, generator: torch.Generator) -> None:
        saved, opt_state, gen_state = snap
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
        opt.load_state_dict(opt_state)
        generator.set_state(gen_state)

    def problem(self, upd: dict, kl_after: float | None) -> str | None:
        """Why this update must be undone (None: it stands)."""
        for key in ("policy_loss", "grad_norm_max", "value_loss", "kl_loss"):
            v = upd.get(key)
            if v is not None and not math.isfinite(v):
                return f"{key} is {v}"
        g = upd.get("grad_norm_max")
        if self.grad_limit is not None and g is not None and g > self.grad_limit:
            return f"gradient norm {g:.3g} > guard_grad_norm {self.grad_limit:g}"
        if kl_after is not None and not math.isfinite(kl_after):
            return f"kl_after is {kl_after}"
        if self.kl_limit is not None and kl_after is not None and kl_after > self.kl_limit:
            return (f"the update moved the policy {kl_after:.3g} nats per token (kl_after) > "
                    f"guard_kl {self.kl_limit:g}")
        return None


def tolerated_learning_rate(n_params: int, lora: bool) -> float:
    """A rule of thumb for the largest learning rate a pretrained model of ``n_params``
    parameters takes without one update wrecking it: ten times ppokit's default for a
    pretrained model (``LEARNING_RATES`` in ppokit.llm.training.config, measured on a 135M-parameter
    model: docs/real_models.md), scaled as 1/sqrt(size) — larger models are wider, and the
    change an Adam step makes to a layer's output grows with its width."""
    from .config import LEARNING_RATES

    base = LEARNING_RATES["lora" if lora else "full"]
    return 10 * base * math.sqrt(REFERENCE_PARAMS / max(n_params, 1))


def learning_rate_warning(lr: float, n_params: int, lora: bool) -> str | None:
    """The pre-flight warning for a learning rate far above :func:`tolerated_learning_rate`
    (None: no warning; always None below ``PRETRAINED_MIN_PARAMS``)."""
    if n_params < PRETRAINED_MIN_PARAMS:
        return None
    limit = tolerated_learning_rate(n_params, lora)
    if lr <= limit:
        return None
    how = "with LoRA adapters" if lora else "fully fine-tuned"
    return (f"warning: learning_rate {lr:g} is {lr / limit:.0f}x the about {limit:.1g} that a "
            f"{n_params / 1e6:.0f}M-parameter pretrained model tolerates {how} "
            "(docs/real_models.md); one update may wreck it (the divergence guard, guard_kl, "
            "undoes such an update and halves the rate)")


def guarded_update(tr, roll, lab) -> dict:
    """The trainer ``tr``'s update of ``roll`` under its divergence guard: an update whose
    gradient or movement passes the guard's limits is undone and run again at half the
    learning rate, at most ``guard_retries`` times; ``kl_after``, ``guard_rollbacks`` and
    ``learning_rate`` join its statistics."""
    guard = tr.guard
    params = tr.trained_parameters()
    snap = guard.snapshot(params, tr.opt, tr.shuffle_gen) if guard.enabled else None
    base_lrs = [g["lr"] for g in tr.opt.param_groups]
    rollbacks = 0
    while True:
        try:
            upd = tr.update(roll, lab)
        except NonFiniteError as exc:  # a step made the policy's outputs NaN or inf
            if not guard.enabled:
                raise
            upd, kl_after = {}, None
            problem = f"the update made the policy non-finite ({exc})"
        else:
            kl_after = tr.movement(roll, lab) if guard.enabled else None
            problem = guard.problem(upd, kl_after)
        if problem is None:
            break
        lr = tr.opt.param_groups[0]["lr"]
        if rollbacks >= tr.cfg.guard_retries:
            guard.restore(snap, params, tr.opt, tr.shuffle_gen)  # lr as it was
            raise TrainingDiverged(
                f"iteration {tr.iteration + 1}: {problem}, still at learning rate "
                f"{lr:.3g} after {rollbacks} halving(s); training stopped before this "
                "update was kept (the last checkpoint in the run directory is intact). "
                "Lower --learning-rate (or train LoRA adapters: --lora-r 16), or raise "
                "--guard-kl / --guard-grad-norm if the movement is intended")
        guard.restore(snap, params, tr.opt, tr.shuffle_gen)
        rollbacks += 1
        for group, base in zip(tr.opt.param_groups, base_lrs):
            group["lr"] = base * 0.5 ** rollbacks
        tr.log(f"guard: iteration {tr.iteration + 1}: {problem}; the update was "
                 f"undone and is retried at learning rate {lr * 0.5:.3g}")
    upd["kl_after"] = kl_after
    upd["guard_rollbacks"] = rollbacks
    upd["learning_rate"] = tr.opt.param_groups[0]["lr"]
    return upd


def check_scales(cfg, rec: dict, warned: set, log) -> None:
    """Warn (once each) when a fixed term of the objective dwarfs the rewards: the
    truncation penalty, or the KL term, more than 10 times the scores' spread (``warned``:
    the warnings given so far)."""
    spread = rec.get("score_std", 0.0)
    if not spread or spread <= 0:
        return
    if (cfg.truncation == "penalty" and rec.get("truncated_frac", 0) > 0
            and cfg.truncation_penalty > 10 * spread and "penalty" not in warned):
        warned.add("penalty")
        log(f"warning: truncation_penalty {cfg.truncation_penalty:g} is "
                 f"{cfg.truncation_penalty / spread:.0f}x the spread of the rewards "
                 f"(std {spread:.3g}): the penalty, not the reward, decides what is "
                 "learned (shorter responses); consider truncation=none or mask, or a "
                 "smaller penalty")
    beta = rec.get("kl_coef") or 0.0
    kl_term = abs(beta) * abs(rec.get("kl_ref", 0.0))
    if cfg.kl_mode != "none" and kl_term > 10 * spread and "kl" not in warned:
        warned.add("kl")
        log(f"warning: the KL term (kl_coef {beta:.3g} x kl_ref "
                 f"{rec['kl_ref']:.3g} nats = {kl_term:.3g}) is {kl_term / spread:.0f}x "
                 f"the spread of the rewards (std {spread:.3g}): staying near the "
                 "reference dominates the objective; consider a smaller kl_coef")
