"""``labels-frozen``: run the trainer's own rollout and update machinery for two epochs on a
tiny rollout and watch the labels.

Advantages, value targets and old log-probs are computed once per rollout; every epoch must
see exactly the same values, and none of them may carry a gradient
(docs/theory.md#frozen-labels). The check records what reaches the loss functions
themselves (not only what the minibatch carries), so a label recomputed or re-derived
anywhere in between is caught.

:func:`check_token_labels_frozen` does the same for the token-level trainer.

The update is run with one minibatch per epoch, so even per-minibatch advantage
normalisation must give the same advantages in both epochs (up to float rounding from the
reshuffled summation order, ``ADV_ROUNDING_TOL``; everything else must be bit-identical).
"""

from __future__ import annotations

import copy
import tempfile
from contextlib import contextmanager

import torch

from ppokit.engine.recipe import estimator_options

from .result import CheckResult

__all__ = ["check_labels_frozen", "check_token_labels_frozen", "LABEL_CHECK_CONFIG"]

# a tiny rollout: 2 envs x 16 steps, one minibatch of 32, two epochs
LABEL_CHECK_CONFIG = {"n_envs": 2, "n_steps": 16, "batch_size": 32, "n_epochs": 2,
                      "total_timesteps": 32, "target_kl": None, "tensorboard": False,
                      "checkpoint_every": 1000}


ADV_ROUNDING_TOL = 1e-5


class _Recorder:
    """Collects, per loss call, the labels the loss received, keyed by rollout row."""

    def __init__(self, n: int):
        self.n = n
        self.ids: torch.Tensor | None = None
        self.depth = 0  # nesting of the wrapped minibatch calls
        self.seen = 0
        self.epoch = 0
        self.loss_inputs: list[tuple[int, torch.Tensor, str, torch.Tensor]] = []
        self.mb_inputs: list[tuple[int, torch.Tensor, str, torch.Tensor]] = []

    @contextmanager
    def minibatch(self, mb: dict):
        """Around one wrapped minibatch call; a call made inside another (the same minibatch
        further down the call chain, possibly re-packed) does not start a new one."""
        if self.depth == 0:
            self._start(mb)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def _start(self, mb: dict) -> None:
        self.ids = mb.get("_id", mb.get("row"))
        self.epoch = self.seen // self.n
        self.seen += 0 if self.ids is None else len(self.ids)
        for key in ("logp", "advantages", "returns", "values"):
            if key in mb and self.ids is not None:
                self.mb_inputs.append((self.epoch, self.ids, key, mb[key]))

    def loss_input(self, name: str, t) -> None:
        if self.ids is not None and isinstance(t, torch.Tensor):
            self.loss_inputs.append((self.epoch, self.ids, name, t))


@contextmanager
def _observing(tr, rec: _Recorder):
    """The trainer's updater (:class:`ppokit.engine.updater.Updater`) reports to ``rec``:
    each minibatch before its step, and each label the loss functions receive."""
    upd = tr.updater
    mb_obs, loss_obs = _observer(rec), rec.loss_input
    upd.observers.append(mb_obs)
    upd.loss_observers.append(loss_obs)
    try:
        yield
    finally:
        upd.observers.remove(mb_obs)
        upd.loss_observers.remove(loss_obs)


def _observer(rec: _Recorder):
    """The engine's per-minibatch hook: starts a minibatch in the recorder."""
    return rec._start


def _kernel_observer(rec: _Recorder):
    """The fused step's input hook: it calls no loss function, so what its kernel receives
    is what the loss sees."""
    def observe(mb: dict) -> None:
        for key, label in (("logp", "logp_old"), ("advantages", "advantages"),
                           ("returns", "returns")):
            rec.loss_input(label, mb.get(key))
    return observe


def _by_epoch(records, n: int) -> dict[tuple[str, int], torch.Tensor]:
    """``{(label, epoch): [n, ...] values}`` (NaN where a row was not seen)."""
    out: dict[tuple[str, int], torch.Tensor] = {}
    for epoch, ids, name, t in records:
        key = (name, epoch)
        t = t.detach().double()
        if key not in out:
            out[key] = torch.full((n, *t.shape[1:]), float("nan"), dtype=torch.float64)
        out[key][ids] = t
    return out


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    both = ~torch.isnan(a) & ~torch.isnan(b)
    if not bool(both.any()):
        return float("nan")
    return float((a[both] - b[both]).abs().max())


def _verdict(name: str, rec: _Recorder, n: int, snapshot: dict, stored_now: dict,
             stored_before: dict, stored_grad: list[str]) -> CheckResult:
    """Compare what the loss saw in epochs 1 and 2, what the minibatches carried, and the
    rollout's own label tensors before and after the update."""
    criterion = f"Δ 0 (advantages ≤ {ADV_ROUNDING_TOL:g}), no gradient"
    if not rec.loss_inputs or rec.epoch < 1:
        return CheckResult(name, None, "-", criterion,
                           "could not observe two epochs of loss inputs in this trainer "
                           "(it does not call ppokit's loss functions, or ran one epoch)")
    loss_in = _by_epoch(rec.loss_inputs, n)
    mb_in = _by_epoch(rec.mb_inputs, n)
    diffs: dict[str, float] = {}
    for label in ("logp_old", "advantages", "returns", "values_old"):
        if (label, 0) in loss_in and (label, 1) in loss_in:
            diffs[label] = _maxdiff(loss_in[(label, 0)], loss_in[(label, 1)])
    # what the loss received equals what the rollout computed (advantages may be
    # normalised on the way, so they are compared across epochs only)
    for label, key in (("logp_old", "logp"), ("returns", "returns")):
        if key in snapshot and any((label, ep) in loss_in for ep in (0, 1)):
            diffs[f"loss {label} vs rollout"] = max(
                _maxdiff(loss_in[(label, ep)], snapshot[key])
                for ep in (0, 1) if (label, ep) in loss_in)
    # (advantages may be whitened over the batch by the engine before minibatching: they
    # are compared across epochs, above)
    for key in ("logp", "returns"):
        for ep in (0, 1):
            if (key, ep) in mb_in and key in snapshot:
                d = _maxdiff(mb_in[(key, ep)], snapshot[key])
                diffs[f"minibatch {key} vs rollout"] = max(
                    diffs.get(f"minibatch {key} vs rollout", 0.0), d)
    for k, t in stored_before.items():
        diffs[f"rollout {k} after update"] = float(
            (stored_now[k].detach().double() - t.double()).abs().max())
    with_grad = sorted({nm for _, _, nm, t in rec.loss_inputs if t.requires_grad}
                       | set(stored_grad))
    # Everything is copied or indexed, so must be bit-identical, except the advantages as the
    # loss receives them: per-minibatch normalisation of a reshuffled minibatch sums in a
    # different order, which moves them by float rounding (~1e-7), never by a real change.
    tol = {"advantages": ADV_ROUNDING_TOL}
    changed = {k: v for k, v in diffs.items() if v == v and not v <= tol.get(k, 0.0)}
    ok = not changed and not with_grad
    across = ", ".join(f"{k} {diffs[k]:.2g}" for k in ("logp_old", "advantages", "returns")
                       if k in diffs)
    rest = max((v for k, v in diffs.items() if " " in k and v == v), default=0.0)
    measured = (f"Δ epoch 1→2: {across}; Δ vs rollout {rest:.2g}; "
                f"with gradient: {', '.join(with_grad) if with_grad else 'none'}")
    detail = ""
    if not ok:
        parts = [f"{k} changed by {v:.3g}" for k, v in changed.items()]
        if with_grad:
            parts.append(f"{', '.join(with_grad)} carry a gradient")
        detail = ("labels are not frozen: " + "; ".join(parts) + ". Old log-probs, advantages "
                  "and value targets must be computed once per rollout, detached, and reused "
                  "unchanged by every epoch.")
    return CheckResult(name, ok, measured, criterion, detail,
                       {"diffs": diffs, "with_grad": with_grad})


def check_labels_frozen(policy=None, *, env: str = "CartPole-v1", trainer_cls=None,
                        base_config: dict | None = None, seed: int = 0) -> CheckResult:
    """Run ``trainer_cls`` (default :class:`ppokit.algos.Trainer`) for one tiny rollout and a
    two-epoch update; ``policy`` (copied) replaces the trainer's own when given."""
    from ppokit.algos import trainer as trainer_mod
    from ppokit.algos.config import config_from_dict, resolve_config
    from ppokit.envs.multiagent import agents_of

    trainer_cls = trainer_cls or trainer_mod.Trainer
    name = "labels-frozen"
    over = {**LABEL_CHECK_CONFIG, "seed": seed}
    base = base_config or {}
    k = agents_of(base.get("env_id", env), base.get("env_kwargs"))
    if k > 1:  # a multi-agent environment: its rows come in copies x agents, and its
        # idle rows are left out, so one minibatch holds whatever the rollout keeps
        over.update(n_envs=k, total_timesteps=16 * k, batch_size=0)
    if base_config is not None:
        cfg = config_from_dict({**base_config, **over})
    else:
        cfg = resolve_config(env_id=env, overrides=over)
    with tempfile.TemporaryDirectory(prefix="ppokit-check-") as tmp:
        tr = trainer_cls(cfg, tmp, log=lambda _msg: None)
        try:
            if policy is not None:
                p = copy.deepcopy(policy)
                tr.policy = p
                tr.collector.policy = p
                tr.opt = torch.optim.Adam(p.parameters(), lr=cfg.learning_rate)
            tr.policy.train()
            rollout = tr.collector.collect(cfg.n_steps)
            rollout.compute_advantages(cfg.gamma, cfg.gae_lambda, cfg.advantage_estimator,
                                       estimator_options(cfg))
            stored = {k: getattr(rollout, k).detach().clone()
                      for k in ("advantages", "returns", "logp", "values")}
            flat0 = rollout.flat()
            n = int(flat0["obs"].shape[0])
            snapshot = {k: flat0[k].detach().double().clone()
                        for k in ("advantages", "returns", "logp", "values")}
            orig_flat = rollout.flat

            def flat_with_ids():
                d = orig_flat()
                d["_id"] = torch.arange(n)
                return d

            rollout.flat = flat_with_ids
            rec = _Recorder(n)
            from ppokit.engine.fused import FusedStep

            tr._minibatch_step()  # builds the fused step when it is used
            fused = getattr(tr, "_fused", None)
            if isinstance(fused, FusedStep):
                fused.input_observer = _kernel_observer(rec)
            tr.updater.begin(tr.opt, tr.progress_remaining())
            with _observing(tr, rec):
                tr.update(rollout)
        finally:
            tr.close()
            metrics = getattr(tr, "metrics", None)
            if metrics is not None:
                metrics.close()

    return _verdict(name, rec, n, snapshot, {k: getattr(rollout, k) for k in stored}, stored,
                    [k for k in stored if getattr(rollout, k).requires_grad])


def check_token_labels_frozen(model, tokenizer, *, trainer_cls=None, seed: int = 0,
                              lora_r: int = 0) -> CheckResult:
    """The same check on ppokit's token-level trainer (PPO with a critic): one iteration of
    the built-in task with ``model`` (copied) as the policy, two epochs, one minibatch;
    ``lora_r`` > 0 trains LoRA adapters of that rank, as ``ppokit llm train`` does a
    pretrained model by default (the labels pass through the same code either way, and
    Adam's state for every weight of a large model costs seconds)."""
    from ppokit.llm.training import trainer as trainer_mod

    trainer_cls = trainer_cls or trainer_mod.TokenTrainer
    cfg = trainer_mod.LLMConfig(algo="ppo", iterations=1, n_epochs=2, batch_size=8,
                                lora_r=lora_r,
                                grad_accum=1, prompts_per_iter=4, samples_per_prompt=2,
                                max_new_tokens=8, checkpoint_every=10**9, time_limit=None,
                                samples_logged=0, seed=seed,
                                # a truncation penalty gives even an untrained model's
                                # scores a spread, so the update moves the policy
                                truncation="penalty")
    n = 8
    seen: dict = {}
    rec = _Recorder(n)
    with tempfile.TemporaryDirectory(prefix="ppokit-check-") as tmp:
        tr = trainer_cls(cfg, tmp, policy=copy.deepcopy(model), tokenizer=tokenizer,
                         log=lambda _msg: None)
        orig_update = tr.update

        def update(roll, lab):
            seen["lab"] = lab
            seen["before"] = {k: getattr(lab, k).detach().clone()
                              for k in ("old_logp", "advantages", "returns")
                              if getattr(lab, k) is not None}
            return orig_update(roll, lab)

        tr.update = update
        try:
            with _observing(tr, rec):
                tr.train_iteration()
        finally:
            tr.close()
    if "lab" not in seen:
        return CheckResult("token-labels-frozen", None, "-", "-",
                           "the trainer's update was not reached")
    lab, before = seen["lab"], seen["before"]
    snapshot = {{"old_logp": "logp"}.get(k, k): t.double() for k, t in before.items()}
    return _verdict("token-labels-frozen", rec, n, snapshot,
                    {k: getattr(lab, k) for k in before}, before,
                    [k for k in before if getattr(lab, k).requires_grad])
