"""The update policy both trainers share: one :class:`Updater` per run.

A trainer collects a batch (environment steps, or sampled completions) and labels it
(advantages, returns, frozen log-probabilities); what happens next is the same for both,
and lives here rather than in each trainer:

* the **spec** (:class:`~ppokit.engine.update.UpdateSpec`): every loss hyperparameter,
  including a registered loss's or estimator's own options (``spec.options``);
* the **schedules**: the learning rate and the clip range, each constant or decayed
  linearly with the share of the run still to go (:class:`Schedule`);
* the **KL controller**: the coefficient of the KL term (``kl_coef``, logged under that
  name by both trainers), fixed or adapted after each update from the measured KL
  (:func:`kl_controller`; ``adapt(kl, n_steps)`` whatever the controller);
* the **step backend**: the eager minibatch step
  (:func:`~ppokit.engine.update.eager_minibatch_step`) unless the trainer hands a faster
  one (the fused step, :mod:`ppokit.engine.fused`) that computes the same thing;
* the **observers**: ``observers`` see each minibatch before its step, ``loss_observers``
  each label a loss function receives (``"logp_old"``, ``"advantages"``, ``"returns"``,
  ``"values_old"``), which is how ``ppokit check`` verifies that labels stay frozen
  through the epochs without touching the loss registry.

A trainer's iteration is then: collect → label → :meth:`Updater.begin` (this iteration's
learning rate and clip range) → :meth:`Updater.update` → :meth:`Updater.adapt` → record
(:meth:`Updater.begin`'s values and :meth:`Updater.update`'s statistics under one
vocabulary: ``learning_rate``, ``clip_range``, ``kl_coef``).

The optimiser and the parameters are passed to each call rather than held: a trainer (or
``ppokit check``) may replace them between iterations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from ppokit.core.kl import AdaptiveKLController, FixedKLController

from .update import LabelledBatch, UpdateSpec, eager_minibatch_step, run_update

__all__ = ["Schedule", "Updater", "kl_controller", "SCHEDULES"]

SCHEDULES = ("constant", "linear")


@dataclass(frozen=True)
class Schedule:
    """A hyperparameter's value over a run: ``value`` throughout (``constant``) or
    ``value × remaining`` (``linear``, to 0 at the end), ``remaining`` the share of the
    run still to go, in ``[0, 1]``."""

    value: float
    kind: str = "constant"

    def __post_init__(self):
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {', '.join(SCHEDULES)}, got "
                             f"{self.kind!r}")

    def at(self, remaining: float) -> float:
        if self.kind == "linear":
            return self.value * min(max(remaining, 0.0), 1.0)
        return self.value


def kl_controller(kl_coef: float, kl_target: float | None):
    """The KL coefficient's controller: adapted towards ``kl_target`` after each update
    (:class:`~ppokit.core.kl.AdaptiveKLController`) when a target is set, else fixed."""
    if kl_target:
        return AdaptiveKLController(kl_coef, kl_target)
    return FixedKLController(kl_coef)


@dataclass
class Updater:
    """The spec, the schedules, the KL controller and the observers of one run's updates
    (module docstring).

    ``lr`` ``None``: the optimiser's learning rates are left as they are (a trainer that
    changes them itself, as the LLM trainer's divergence guard does on a rollback).
    ``clip`` ``None``: the spec's clip range, unscheduled. ``kl`` ``None``: the loss has
    no KL term and ``kl_coef`` is ``None``. ``spec`` ``None``: each :meth:`update` is
    given its spec (the LLM trainer's follows the KL coefficient: the KL term enters the
    loss only while it is positive)."""

    spec: UpdateSpec | None
    lr: Schedule | None = None
    clip: Schedule | None = None
    kl: Any = None
    observers: list[Callable[[dict], None]] = field(default_factory=list)
    loss_observers: list[Callable[[str, Tensor], None]] = field(default_factory=list)

    def __post_init__(self):
        self._base_lrs: list[float] | None = None
        self._clip_now: float | None = None

    @property
    def kl_coef(self) -> float | None:
        """The KL term's coefficient the next update uses (``None`` without a KL term)."""
        return None if self.kl is None else float(self.kl.value)

    def begin(self, optimizer, remaining: float = 1.0) -> dict[str, float | None]:
        """This iteration's values at ``remaining`` (share of the run left): the learning
        rate is set on ``optimizer`` (each parameter group scaled from its own starting
        rate, so a critic's separate rate keeps its ratio), the clip range returned."""
        lr = None
        if self.lr is not None:
            lr = self.lr.at(remaining)
            groups = optimizer.param_groups
            if self._base_lrs is None or len(self._base_lrs) != len(groups):
                self._base_lrs = [float(g["lr"]) for g in groups]
            first = self._base_lrs[0] or 1.0
            for g, base in zip(groups, self._base_lrs):
                g["lr"] = lr * base / first
        self._clip_now = None if self.clip is None else self.clip.at(remaining)
        return {"learning_rate": lr, "clip_range": self._clip_now, "kl_coef": self.kl_coef}

    @property
    def clip_range(self) -> float | None:
        """The clip range of the current iteration (:meth:`begin`'s; before it, the
        schedule's start); ``None`` without a clip schedule: the spec's."""
        if self.clip is None:
            return None
        return self.clip.value if self._clip_now is None else self._clip_now

    def eager_step(self, spec: UpdateSpec, forward, optimizer, params: list[Tensor],
                   dp=None) -> Callable:
        """The eager minibatch step with this updater's KL coefficient and loss
        observers: ``step(mb, clip_range, kl_limit)``."""
        observe = self._observe if self.loss_observers else None
        kl_coef = self.kl_coef

        def step(mb, clip_range, kl_limit):
            return eager_minibatch_step(spec, forward, optimizer, params, mb,
                                        clip_range=clip_range, kl_coef=kl_coef,
                                        kl_limit=kl_limit, dp=dp, observe=observe)
        return step

    def _observe(self, label: str, t: Tensor) -> None:
        for fn in self.loss_observers:
            fn(label, t)

    def update(self, batch: LabelledBatch, forward, optimizer, params: list[Tensor], *,
               generator, step: Callable | None = None, spec: UpdateSpec | None = None,
               dp=None) -> dict[str, Any]:
        """One update (:func:`~ppokit.engine.update.run_update`) of ``batch`` at this
        iteration's clip range and KL coefficient. ``step``: a faster backend for the
        minibatch step (default: :meth:`eager_step`); ``spec``: this update's spec when
        the trainer adjusts it (a recurrent policy's minibatch size in sequences).
        Returns the update's statistics with ``kl_coef``, the coefficient it used."""
        spec = spec or self.spec
        if spec is None:
            raise ValueError("Updater.update: spec: this updater holds none; pass one")
        inner = step or self.eager_step(spec, forward, optimizer, params, dp)
        observers = self.observers
        if observers:
            def inner_step(mb, clip_range, kl_limit):
                for fn in observers:
                    fn(mb)
                return inner(mb, clip_range, kl_limit)
        else:
            inner_step = inner
        out = run_update(spec, batch, forward, optimizer, params, generator=generator,
                         clip_range=self.clip_range, kl_coef=self.kl_coef,
                         step_fn=inner_step, dp=dp)
        out["kl_coef"] = self.kl_coef
        return out

    def adapt(self, kl: float, n_steps: int = 1) -> None:
        """After an update that took a step: the KL controller sees the measured ``kl``
        (a fixed coefficient ignores it)."""
        if self.kl is not None:
            self.kl.update(kl, n_steps)

    def state_dict(self) -> dict:
        return {"kl_controller": None if self.kl is None else self.kl.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.kl is not None and state.get("kl_controller") is not None:
            self.kl.load_state_dict(state["kl_controller"])
