"""The one update engine: epochs × minibatches (× micro-batches) of a labelled batch.

Both trainers call :func:`run_update`. What differs between them is only what they hand
it: the environment trainer a batch of samples (``[N]`` rows) and a forward adapter that
evaluates its actor-critic on observations; the token trainer a batch of sequences
(``[B, L]`` rows with an action mask) and an adapter that runs the language model (and its
critic). Everything else — the surrogate, the loss assembly from :mod:`ppokit.core`, the
aggregation over tokens and sequences, gradient clipping, the optimiser step and the
target-KL early stop — happens here, once, and means the same for both:

* **Loss.** ``policy + vf_coef · value − ent_coef · entropy + kl_coef · kl`` assembled by
  :class:`ppokit.core.LossTerms`. The policy term is the registry's ``policy_loss``
  (:data:`ppokit.core.POLICY_LOSSES`: ``clip``, ``vanilla``, ``kl_penalty`` or one the
  user registered; it receives this spec and reads its own hyperparameters); the KL term
  is anchored at the old policy (``kl_anchor="old"``, PPO-KL's penalty, k3 in ratio form)
  or the reference model (``"ref"``, ``kl_estimator`` of the current vs the reference
  policy: k2 by default, whose expected gradient is ``∇KL(π ‖ π_ref)``, or GRPO's k3, whose
  expected gradient is ``∇KL(π_ref ‖ π)``; :func:`ppokit.core.kl_penalty_loss`), or absent.
* **Aggregation.** Policy, entropy and KL terms use ``agg``
  (:func:`ppokit.core.aggregate`); the value loss is always the mean over valid elements.
  With gradient accumulation (and on several ranks) each micro-batch divides by its
  *minibatch's* token and sequence counts — a row without any action is not a sequence,
  as :func:`ppokit.core.aggregate` counts — so accumulation changes memory, not the
  update, whatever rows a micro-batch holds.
* **Gradient clipping.** One global norm over every trained parameter (``max_grad_norm``;
  ``None`` = off); ``grad_norm`` is the norm before clipping.
* **Target KL.** An early stop, never a trust region. ``target_kl_check="minibatch"``:
  before each optimiser step, the minibatch's ``approx_kl`` (k3 of π_old against the
  current policy, measured on this minibatch before the step) is compared with
  ``1.5 · target_kl``; above it, the step is skipped and the update ends.
  ``"epoch"``: after each epoch, the mean ``approx_kl`` of its steps against ``target_kl``.
* **Advantage normalisation.** ``normalize_advantage`` whitens (ddof 1, eps 1e-8) over the
  valid elements of each minibatch (``advantage_norm_scope="minibatch"``) or of the whole
  batch once (``"batch"``).
* **Importance weights.** A batch column ``is_weight`` (the token trainer's truncated
  importance weights for the sampler–trainer mismatch, ``rollout_is="truncate"``)
  multiplies each element's advantage after any whitening: each element's policy term is
  scaled by its weight, for every registered surrogate linear in the advantage, since
  ``min(r·wA, clip(r)·wA) = w·min(r·A, clip(r)·A)`` for ``w > 0``.

The batch is validated and detached once per rollout (:class:`LabelledBatch`). A faster
step than :func:`eager_minibatch_step` (the fused one, :mod:`ppokit.engine.fused`) plugs
in as ``step_fn``. The schedules, the KL controller and the observers around an update
are :class:`ppokit.engine.updater.Updater`'s. Derivations: docs/theory.md.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ppokit.core import (
    DEFAULT_KL_LOSS_ESTIMATOR,
    KL_LOSS_ESTIMATORS,
    POLICY_LOSSES,
    LossTerms,
    PolicyLoss,
    entropy_bonus,
    kl_penalty_loss,
    masked_whiten,
    ppo_kl_penalty_loss,
    value_loss,
)
from ppokit.core.losses import AGGREGATION_MODES
from ppokit.core.options import EMPTY, Options

from .batch import LabelledBatch, take_rows  # noqa: F401 (LabelledBatch re-exported)

__all__ = ["UpdateSpec", "LabelledBatch", "Forward", "run_update", "eager_minibatch_step",
           "clip_grad_norm_",
           "STAT_KEYS", "UPDATE_KEYS"]

# per-minibatch statistics, in this order in every backend
STAT_KEYS = ("policy_loss", "value_loss", "entropy", "approx_kl", "approx_kl_k1", "clipfrac",
             "clip_active_frac", "ratio_min", "ratio_max", "grad_norm", "kl_loss")
# what run_update returns besides the averaged STAT_KEYS
UPDATE_KEYS = ("n_updates", "early_stop_epoch", "early_stop_minibatch", "grad_norm_max")

KL_ANCHORS = ("none", "old", "ref")
TARGET_KL_CHECKS = ("minibatch", "epoch")
NORM_SCOPES = ("minibatch", "batch")
VALUE_CLIP_MODES = ("max", "clipped")
TARGET_KL_FACTOR = 1.5


@dataclass(frozen=True)
class UpdateSpec:
    """Everything that decides one update, frozen; the same fields for both trainers."""

    policy_loss: str = "clip"  # a POLICY_LOSSES name (clip | vanilla | kl_penalty | yours)
    clip_range: float = 0.2  # ε (ε_low with clip_range_high); scheduled values override
    clip_range_high: float | None = None  # asymmetric upper ε (None: clip_range)
    dual_clip: float | None = None  # c > 1: floor of the surrogate for Â < 0
    agg: str = "token-mean"  # aggregation of the policy, entropy and KL terms
    norm_length: float | None = None  # the constant of seq-mean-token-sum-norm
    use_critic: bool = True  # a value term (the forward adapter returns values)
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    kl_anchor: str = "none"  # none | old (PPO-KL penalty) | ref (reference model)
    kl_coef: float = 0.0  # β of the KL term (a controller's value overrides per update)
    kl_estimator: str = DEFAULT_KL_LOSS_ESTIMATOR  # kl_anchor="ref": a KL_LOSS_ESTIMATORS name
    clip_range_vf: float | None = None  # value clipping around the rollout's values
    value_clip_mode: str = "max"  # max (pessimistic) | clipped
    max_grad_norm: float | None = 0.5  # one global norm; None: no clipping
    target_kl: float | None = None
    target_kl_check: str = "minibatch"  # minibatch (before each step, 1.5×) | epoch
    n_epochs: int = 10
    minibatch_size: int = 64  # rows (samples or sequences) per minibatch; 0: all
    grad_accum: int = 1  # micro-batches per minibatch
    normalize_advantage: bool = True
    advantage_norm_scope: str = "minibatch"  # minibatch | batch
    options: Mapping[str, Any] = EMPTY  # the policy loss's own (its registration's options)

    def with_values(self, clip_range: float | None = None, kl_coef: float | None = None
                    ) -> UpdateSpec:
        """This spec with one update's scheduled clip range / controlled KL coefficient
        (``None``: keep the spec's)."""
        clip = self.clip_range if clip_range is None else float(clip_range)
        beta = self.kl_coef if kl_coef is None else float(kl_coef)
        if clip == self.clip_range and beta == self.kl_coef:
            return self
        return _with_values(self, clip, beta)  # once per update, not per minibatch

    def __post_init__(self):
        def bad(name, expected):
            raise ValueError(f"{name}: expected {expected}, got {getattr(self, name)!r}")

        if self.policy_loss not in POLICY_LOSSES:
            bad("policy_loss", f"one of {', '.join(POLICY_LOSSES.names())}")
        if self.agg not in AGGREGATION_MODES:
            bad("agg", f"one of {', '.join(AGGREGATION_MODES)}")
        for name, allowed in (("kl_anchor", KL_ANCHORS), ("target_kl_check", TARGET_KL_CHECKS),
                              ("advantage_norm_scope", NORM_SCOPES),
                              ("value_clip_mode", VALUE_CLIP_MODES)):
            if getattr(self, name) not in allowed:
                bad(name, f"one of {', '.join(allowed)}")
        if self.kl_estimator not in KL_LOSS_ESTIMATORS:
            bad("kl_estimator", f"one of {', '.join(KL_LOSS_ESTIMATORS)}")
        if not self.clip_range > 0:
            bad("clip_range", "a number > 0")
        for name in ("n_epochs", "grad_accum"):
            if int(getattr(self, name)) < 1:
                bad(name, "an integer >= 1")
        if self.minibatch_size < 0:
            bad("minibatch_size", "an integer >= 0")
        if not isinstance(self.options, Options):  # a plain dict from Python: read-only
            object.__setattr__(self, "options", Options(self.options))


@functools.lru_cache(maxsize=8)
def _with_values(spec: UpdateSpec, clip_range: float, kl_coef: float) -> UpdateSpec:
    return replace(spec, clip_range=clip_range, kl_coef=kl_coef)


class Forward(NamedTuple):
    """What a forward adapter returns for a set of rows: log-probs of the taken actions
    (with gradient), their entropies, and the critic's values (``None`` without one); each
    shaped like the rows' ``logp`` (``[M]`` or ``[M, L]``)."""

    logp: Tensor
    entropy: Tensor
    values: Tensor | None = None


def _counts(rows: dict[str, Tensor]) -> dict[str, Any]:
    """The denominators :func:`ppokit.core.aggregate` uses by default on ``rows``, as
    numbers: ``num_tokens`` (valid positions) and ``num_seqs`` (rows holding at least one;
    a row without any action is not a sequence), each at least 1. Handed to every
    micro-batch (and every rank), they make the sum of the micro-batches' terms the whole
    minibatch's term, whatever the micro-batches hold — empty rows, or nothing valid."""
    tokens, seqs = _valid_counts(rows)
    return {"num_tokens": float(max(tokens, 1)), "num_seqs": float(max(seqs, 1))}


def _valid_counts(rows: dict[str, Tensor]) -> tuple[int, int]:
    """``(valid positions, rows holding at least one)`` of ``rows`` (``[M]`` rows are the
    ``[M, 1]`` layout: each valid element is a sequence), unclamped."""
    m = rows.get("mask")
    logp = rows["logp"]
    if m is None:
        return logp.numel(), logp.shape[0]
    per_row = m.reshape(m.shape[0], -1).sum(1)
    return int(per_row.sum()), int((per_row > 0).sum())


def eager_minibatch_step(spec: UpdateSpec, forward: Callable[[dict], Forward],
                         optimizer, params: list[Tensor], mb: dict[str, Tensor], *,
                         clip_range: float | None = None, kl_coef: float | None = None,
                         kl_limit: float | None = None, dp=None, observe: Callable | None = None
                         ) -> dict[str, Tensor] | None:
    """Loss, backward, global gradient clipping and optimiser step for one minibatch
    (split into ``spec.grad_accum`` micro-batches). Returns detached statistics keyed by
    :data:`STAT_KEYS`, or ``None`` when ``kl_limit`` is given and the minibatch's
    ``approx_kl`` exceeds it: then no step is taken.

    ``dp`` (a :class:`ppokit.engine.dist.DataParallel`): ``mb`` is the whole global
    minibatch on every rank, its ``owner`` entry the rank of each row; this rank computes
    its own rows only (micro-batches of the global minibatch, dividing by its global
    counts), then gradients and statistics are summed across ranks.

    The loss reads every hyperparameter from ``spec``; ``clip_range`` / ``kl_coef`` (this
    update's scheduled or controlled values) replace the spec's when given. ``observe(label,
    tensor)`` sees each label the loss functions receive (``ppokit check``)."""
    spec = spec.with_values(clip_range, kl_coef)
    surrogate = POLICY_LOSSES.get(spec.policy_loss)  # fn(spec, logp, logp_old, adv, mask)
    mb = _weighted_advantages(spec, mb)
    agg_kw: dict[str, Any] = {"agg": spec.agg, "norm_length": spec.norm_length}
    split = spec.grad_accum > 1 or dp is not None
    if split:  # each micro-batch divides by the minibatch's counts
        agg_kw.update(_counts(mb))
    chunks = _micro_batches(mb, spec.grad_accum, dp)
    optimizer.zero_grad(set_to_none=True)
    sums: dict[str, Tensor] = {}
    total_tokens = _counts(mb)["num_tokens"]
    for idx in chunks:
        idle = idx is _IDLE  # a zero-weight pass on one row: collectives only
        if idle:
            idx = torch.zeros(1, dtype=torch.long)
        micro = mb if idx is None else {k: take_rows(v, idx) for k, v in mb.items()}
        m = micro.get("mask")
        f = forward(micro)
        if observe is not None:
            _observe_labels(observe, spec, micro)
        pl = _with_stats(spec.policy_loss,
                         surrogate(spec, f.logp, micro["logp"], micro["advantages"], m,
                                   **agg_kw), f.logp, micro["logp"], m)
        if kl_limit is not None and not split and float(pl.stats["approx_kl"]) > kl_limit:
            return None
        terms = _loss_terms(spec, f, micro, pl, agg_kw)
        total = terms.total(vf_coef=spec.vf_coef, ent_coef=spec.ent_coef,
                            kl_coef=spec.kl_coef)
        if idle:
            (0.0 * total).backward()
            continue
        total.backward()
        # the micro-batch's share of the minibatch's valid positions (0 for one without)
        w = 1.0 if idx is None else _valid_counts(micro)[0] / total_tokens
        _accumulate(sums, pl, terms, w)
    if dp is not None:
        sums = _sum_across_ranks(dp, sums, spec)
    if kl_limit is not None and split and float(sums["approx_kl"]) > kl_limit:
        optimizer.zero_grad(set_to_none=True)
        return None
    if dp is not None:
        dp.sum_grads_(params)
    max_norm = spec.max_grad_norm if spec.max_grad_norm is not None else float("inf")
    if dp is not None and getattr(dp, "lockstep", False):  # sharded parameters
        sums["grad_norm"] = dp.clip_grad_norm_(params, max_norm)
    else:
        sums["grad_norm"] = clip_grad_norm_(params, max_norm)
    optimizer.step()
    return sums


def _observe_labels(observe: Callable, spec: UpdateSpec, micro: dict[str, Tensor]) -> None:
    """Hand ``observe`` the labels the loss functions are about to receive."""
    for label, key in (("logp_old", "logp"), ("advantages", "advantages"),
                       ("returns", "returns"), ("values_old", "values")):
        if (spec.use_critic or key in ("logp", "advantages")) and key in micro:
            observe(label, micro[key])


def _weighted_advantages(spec: UpdateSpec, mb: dict[str, Tensor]) -> dict[str, Tensor]:
    """``mb`` with its advantages whitened over the minibatch (``advantage_norm_scope``
    minibatch) and then times the elements' importance weights (``is_weight``, removed)."""
    if spec.normalize_advantage and spec.advantage_norm_scope == "minibatch":
        mb = dict(mb)
        mb["advantages"] = masked_whiten(mb["advantages"], mb.get("mask"))
    if "is_weight" in mb:  # importance weights of the elements, after any whitening
        mb = dict(mb)
        mb["advantages"] = mb["advantages"] * mb.pop("is_weight")
    return mb


def _micro_batches(mb: dict[str, Tensor], accum: int, dp) -> tuple:
    """The row indices of each micro-batch this rank computes: ``(None,)`` for the whole
    minibatch in one pass; with ``dp``, this rank's own rows in ``accum`` pieces, padded
    with idle passes where the ranks must run the same passes (sharded models)."""
    if dp is not None:
        mine = torch.nonzero(mb["owner"] == dp.rank).squeeze(1)
        chunks = mine.chunk(accum) if len(mine) else ()
        if getattr(dp, "lockstep", False):  # sharded models: the same passes on every rank
            chunks = tuple(chunks) + (_IDLE,) * (accum - len(chunks))
        return tuple(chunks)
    return torch.arange(mb["logp"].shape[0]).chunk(accum) if accum > 1 else (None,)


def _loss_terms(spec: UpdateSpec, f: Forward, micro: dict[str, Tensor], pl,
                agg_kw: dict[str, Any]) -> LossTerms:
    """The micro-batch's loss terms: the policy loss ``pl``, the entropy bonus, the
    critic's value loss and the KL penalty the spec asks for."""
    m = micro.get("mask")
    terms = LossTerms(policy=pl.loss, entropy=entropy_bonus(f.entropy, m, **agg_kw))
    if spec.use_critic:
        terms.value = value_loss(
            f.values, micro["returns"], m, values_old=micro.get("values"),
            clip_range_vf=spec.clip_range_vf, clip_mode=spec.value_clip_mode,
            agg="token-mean", num_tokens=agg_kw.get("num_tokens"))
    if spec.kl_anchor == "old":
        terms.kl = ppo_kl_penalty_loss(f.logp, micro["logp"], m, **agg_kw)
    elif spec.kl_anchor == "ref":
        terms.kl = kl_penalty_loss(f.logp, micro["ref_logp"], m,
                                   estimator=spec.kl_estimator, **agg_kw)
    return terms


_RATIO_STATS = ("approx_kl", "approx_kl_k1", "ratio_min", "ratio_max")


def _with_stats(name: str, pl, logp: Tensor, logp_old: Tensor, mask: Tensor | None):
    """A policy loss's result with every statistic the engine reads: a registered loss
    that returns fewer (a user's, say) gets the ratio statistics measured here, and NaN
    for the clip fractions it did not define."""
    if not isinstance(pl, PolicyLoss) or not isinstance(pl.loss, Tensor) \
            or pl.loss.ndim != 0:
        raise TypeError(f"policy loss {name!r}: expected a PolicyLoss with a scalar loss "
                        f"(ppokit.core.PolicyLoss), got {type(pl).__name__}")
    stats = pl.stats
    if all(k in stats for k in _RATIO_STATS) and "clipfrac" in stats \
            and "clip_active_frac" in stats:
        return pl
    stats = dict(stats)
    with torch.no_grad():
        lr = (logp.detach() - logp_old).float()
        if mask is not None:
            lr = torch.where(mask, lr, torch.zeros((), dtype=lr.dtype))
        n = lr.numel() if mask is None else mask.sum().clamp(min=1)
        ratio = lr.exp()
        stats.setdefault("approx_kl", (torch.expm1(lr) - lr).sum() / n)
        stats.setdefault("approx_kl_k1", (-lr).sum() / n)
        valid = torch.ones_like(lr, dtype=torch.bool) if mask is None else mask
        inf = torch.tensor(float("inf"))
        stats.setdefault("ratio_min", torch.where(valid, ratio, inf).min())
        stats.setdefault("ratio_max", torch.where(valid, ratio, -inf).max())
        nan = torch.tensor(float("nan"))
        stats.setdefault("clipfrac", nan)
        stats.setdefault("clip_active_frac", nan)
    return dataclasses.replace(pl, stats=stats)


def clip_grad_norm_(params: list[Tensor], max_norm: float) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` with the same numbers, the per-tensor loops done
    by torch's multi-tensor (``_foreach``) kernels. torch takes that route itself only on
    accelerators; on a CPU its Python loop over a language model's hundred-odd parameters
    is part of the cost (tested equal in ``tests/test_engine_clip.py``)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    if any(g.is_sparse or g.device != grads[0].device or g.dtype != grads[0].dtype
           for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm).detach()
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
    # a factor of exactly 1 changes no gradient: on the CPU, where reading it back costs no
    # device synchronisation, the pass over every gradient is skipped then (most steps of
    # a language model's update clip nothing); a NaN factor still multiplies
    if grads[0].device.type != "cpu" or float(coef) != 1.0:
        torch._foreach_mul_(grads, coef)
    return total.detach()


_IDLE = object()  # marks a lockstep pass of a rank without rows (engine.dist)

_SUMMED = ("policy_loss", "entropy", "value_loss", "kl_loss", "approx_kl", "approx_kl_k1",
           "clipfrac", "clip_active_frac")


def _sum_across_ranks(dp, sums: dict[str, Tensor], spec: UpdateSpec) -> dict[str, Tensor]:
    """This rank's share of the minibatch statistics → the minibatch's (identical on every
    rank). Each share is already weighted by the global counts, so the shares add up; a
    rank that owned no row of the minibatch contributes zeros (and ±inf to the ratio
    extremes). A term the spec does not have stays NaN."""
    absent = {"value_loss": not spec.use_critic, "kl_loss": spec.kl_anchor == "none"}
    vec = torch.stack([torch.zeros(()) if absent.get(k) else
                       sums.get(k, torch.zeros(())).float().reshape(()) for k in _SUMMED])
    dp.sum_(vec)
    out = {k: (torch.tensor(float("nan")) if absent.get(k) else vec[i])
           for i, k in enumerate(_SUMMED)}
    out["ratio_min"] = dp.min_(sums.get("ratio_min", torch.tensor(float("inf"))).float()
                               .reshape(()).clone())
    out["ratio_max"] = dp.max_(sums.get("ratio_max", torch.tensor(float("-inf"))).float()
                               .reshape(()).clone())
    return out


def _accumulate(sums: dict[str, Tensor], pl, terms: LossTerms, w: float) -> None:
    nan = torch.tensor(float("nan"))
    add = {"policy_loss": pl.loss.detach(), "entropy": terms.entropy.detach(),
           "value_loss": terms.value.detach() if terms.value is not None else nan,
           "kl_loss": terms.kl.detach() if terms.kl is not None else nan}
    for k, v in add.items():  # already normalised by the minibatch's counts: a sum
        sums[k] = sums[k] + v if k in sums else v
    for k in ("approx_kl", "approx_kl_k1", "clipfrac", "clip_active_frac"):
        v = pl.stats[k].detach() * w
        sums[k] = sums[k] + v if k in sums else v
    lo, hi = pl.stats["ratio_min"].detach(), pl.stats["ratio_max"].detach()
    sums["ratio_min"] = torch.minimum(sums["ratio_min"], lo) if "ratio_min" in sums else lo
    sums["ratio_max"] = torch.maximum(sums["ratio_max"], hi) if "ratio_max" in sums else hi


def run_update(spec: UpdateSpec, batch: LabelledBatch, forward: Callable[[dict], Forward],
               optimizer, params: list[Tensor], *, generator: torch.Generator,
               clip_range: float | None = None, kl_coef: float | None = None,
               step_fn: Callable | None = None, dp=None) -> dict[str, Any]:
    """``spec.n_epochs`` passes over ``batch`` in shuffled minibatches of
    ``spec.minibatch_size`` rows (one unshuffled minibatch when it covers the batch).

    ``clip_range`` / ``kl_coef``: this update's values when scheduled or controlled
    (default: the spec's). ``step_fn(mb, clip_range, kl_limit)``: a faster minibatch step
    (it must compute what :func:`eager_minibatch_step` computes, returning its statistics
    as a dict or as a vector ordered as :data:`STAT_KEYS`' first entries, or ``None`` for
    an early stop). Returns the mean of each statistic over the steps taken (``ratio_min``
    / ``ratio_max``: min / max; ``None`` when no step was taken) and :data:`UPDATE_KEYS`.

    ``dp`` (data parallelism, :mod:`ppokit.engine.dist`): every rank passes the whole
    batch (with an ``owner`` row entry) and a ``generator`` in the same state, so all
    ranks form the same minibatches; the default step then computes each rank's rows and
    sums across ranks.
    """
    spec = spec.with_values(clip_range, kl_coef)  # the update's values live in its spec
    clip = spec.clip_range
    if spec.normalize_advantage and spec.advantage_norm_scope == "batch":
        data = dict(batch.data)
        data["advantages"] = masked_whiten(data["advantages"], batch.mask)
        batch = LabelledBatch(data, batch.mask)
    n = batch.n_rows
    mb_size = min(spec.minibatch_size or n, n)
    kl_limit = (TARGET_KL_FACTOR * spec.target_kl if spec.target_kl is not None
                and spec.target_kl_check == "minibatch" else None)
    if step_fn is None:
        def step_fn(mb, clip_range, kl_limit):
            return eager_minibatch_step(spec, forward, optimizer, params, mb,
                                        clip_range=clip_range, kl_limit=kl_limit, dp=dp)
    stats: list = []
    stop_epoch = stop_mb = None
    for epoch in range(spec.n_epochs):
        epoch_start = len(stats)
        if mb_size >= n:  # one minibatch: the whole batch (its order changes nothing)
            batches = [batch.rows(None)]
        else:
            perm = torch.randperm(n, generator=generator)
            batches = (batch.rows(perm[s:s + mb_size]) for s in range(0, n, mb_size))
        for k, mb in enumerate(batches):
            out = step_fn(mb, clip, kl_limit)
            if out is None:
                stop_epoch, stop_mb = epoch, k
                break
            stats.append(out)
        if stop_epoch is not None:
            break
        if spec.target_kl is not None and spec.target_kl_check == "epoch":
            kls = [float(_get(s, "approx_kl")) for s in stats[epoch_start:]]
            if kls and sum(kls) / len(kls) > spec.target_kl:
                stop_epoch, stop_mb = epoch, len(kls) - 1
                break
    return summarise(stats, stop_epoch, stop_mb)


def _get(s, key: str):
    return s[STAT_KEYS.index(key)] if isinstance(s, Tensor) else s[key]


def summarise(stats: list, stop_epoch: int | None = None, stop_mb: int | None = None
              ) -> dict[str, Any]:
    """Per-minibatch statistics (dicts or vectors) → one record: means, ``ratio_min`` /
    ``ratio_max`` as min / max, ``None`` for a statistic no step produced."""
    out: dict[str, Any] = dict.fromkeys(STAT_KEYS)
    out["grad_norm_max"] = None
    if stats:
        if isinstance(stats[0], Tensor):
            cols = torch.stack(stats).unbind(1)
            stacked = dict(zip(STAT_KEYS, cols))
        else:
            stacked = {k: torch.stack([s[k] for s in stats]) for k in stats[0]}
        for k, v in stacked.items():
            if k == "ratio_min":
                out[k] = float(v.min())
            elif k == "ratio_max":
                out[k] = float(v.max())
            else:
                val = float(v.mean())
                out[k] = None if val != val else val  # NaN: the term does not exist
        g = stacked.get("grad_norm")
        if g is not None:  # the largest step (a mean can hide one exploding step)
            out["grad_norm_max"] = float(g.max())
    out.update(n_updates=len(stats), early_stop_epoch=stop_epoch,
               early_stop_minibatch=stop_mb)
    return out


def spec_fields() -> tuple[str, ...]:
    return tuple(f.name for f in fields(UpdateSpec))
