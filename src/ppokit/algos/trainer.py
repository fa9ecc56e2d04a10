"""The one learner loop for environment RL: PPO, A2C, REINFORCE and PPO-KL are presets.

One iteration = collect a rollout (:class:`ppokit.rollout.Collector`) → compute advantages
and value targets once (frozen) → the update engine (:func:`ppokit.engine.run_update`, the
same one the token trainer uses: ``n_epochs`` passes of shuffled minibatches, loss from
``ppokit.core``, global gradient clipping, optimiser step, target-KL early stop) → one line
of metrics → a checkpoint every ``checkpoint_every`` iterations. This module owns only what
is the environment trainer's: collecting, estimating advantages, the forward adapter
(:func:`ppokit.engine.forward.policy_forward`) and the run directory.

The minibatch step that runs by default is the fused one (:mod:`ppokit.engine.fused`)
whenever it supports the update spec and the policy; it falls back to the eager step
(:func:`ppokit.engine.eager_minibatch_step`) otherwise and says so once in the log.

The three choices of the engine (docs/theory.md#one-idea):

* advantage: ``advantage_estimator`` (``gae`` / ``reward_to_go``), ``use_critic``;
* ratio / surrogate: ``policy_loss`` — ``clip`` (PPO-Clip), ``vanilla`` (``−log π · Â``;
  A2C, REINFORCE), ``kl_penalty`` (``ρ Â − β KL(π_old ‖ π)``, the KL estimated without
  bias from the rollout's actions by :func:`ppokit.core.ppo_kl_penalty_loss`, and β
  adapted after each iteration by :class:`ppokit.core.AdaptiveKLController` from the KL
  between the rollout's policy and the policy *after* the iteration's epochs, measured on
  the iteration's samples — the metric ``kl_after_update``, the mean k3 estimate
  ``(ρ − 1) − log ρ`` over every sample, as the PPO paper's rule reads it);
* step control: ``clip_range`` (+ schedule), ``learning_rate`` (+ schedule), ``n_epochs``,
  ``max_grad_norm``, ``target_kl``.

``target_kl`` never makes the update a hard trust region; it only stops it early:
``target_kl_check = "minibatch"`` compares each minibatch's k3 approx-KL, computed before the
step, with ``1.5 · target_kl`` and stops *before* stepping (Stable-Baselines3's rule);
``"epoch"`` compares the mean approx-KL of a finished epoch with ``target_kl``. The metrics
record where it fired (``early_stop_epoch``, ``early_stop_minibatch``).

Schedules use the progress *before* the iteration's rollout,
``1 − global_step / total_timesteps``, so the last iteration still has a positive
learning rate and clip range.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ppokit.core import (
    POLICY_LOSSES,
    approx_kl,
    explained_variance,
)
from ppokit.engine import LabelledBatch
from ppokit.engine.fused import FusedStep, policy_forward
from ppokit.engine.recipe import estimator_options
from ppokit.envs.multiagent import agent_metrics
from ppokit.envs.source import id_factory
from ppokit.errors import UsageError
from ppokit.io.atomic import atomic_write_text
from ppokit.io.lifecycle import Plan, RunLifecycle, asks_to_stop
from ppokit.io.metrics import MetricsWriter, truncate_metrics
from ppokit.io.rundir import RunDir, fail_start
from ppokit.io.signals import GracefulStop
from ppokit.io.tracking import make_tracker
from ppokit.policies import is_recurrent
from ppokit.rollout import Rollout, recurrent_forward

from . import checkpoints
from .assembly import (  # noqa: F401 (update_spec re-exported)
    make_collector,
    make_envs,
    make_learner,
    seed_process,
    update_spec,
)
from .config import TrainConfig
from .runs import BEST_DIR, load_run_checkpoint, load_run_config  # noqa: F401 (re-exported)

_SCALAR_NAME = re.compile(r"[A-Za-z0-9_./-]{1,100}")

__all__ = ["Trainer", "load_run_config", "load_run_checkpoint", "RETURN_WINDOW"]

RETURN_WINDOW = 100  # finished training episodes in the summary's mean return (as SB3)
EVAL_SEED_OFFSET = 3_000_000  # evaluations during training: episode seeds seed + this + k


class Trainer(RunLifecycle):
    """Trains ``config`` into ``run_dir``; ``resume=True`` continues from its checkpoint.

    ``log`` receives one-line human messages (resume notices); the per-iteration
    ``on_iteration(metrics)`` callback drives progress displays. ``env`` builds the
    environments instead of ``config.env_id``: a factory ``() -> gymnasium.Env`` (required
    when ``config.env_source`` is ``factory``, unless an id is named again on resume).
    """

    def __init__(self, config: TrainConfig, run_dir: str | Path, *, resume: bool = False,
                 log: Callable[[str], None] = print, fresh: bool = False,
                 env: str | Callable | None = None):
        self.cfg = c = config
        self.run_dir = Path(run_dir)
        self.log = log
        self.env = None
        if c.env_source == "factory" and resume and isinstance(env, str):
            env = id_factory(env)  # a factory run resumed on an id the user names
        if c.env_source == "factory" and not callable(env):
            raise UsageError("env: this run trains on an environment factory, which a run "
                             "directory cannot record; pass the factory (env=make_env)")
        self.env_maker = env if env is not None else c.env_id
        # the lock first: a second writer fails before any work; a failed start leaves
        # nothing behind (RunDir.abort)
        self.rundir = RunDir(self.run_dir, new=not resume, fresh=fresh)
        try:
            self._setup(c)
            if resume:
                self._resume()
            else:
                atomic_write_text(self.run_dir / "config.json",
                                  json.dumps(c.to_dict(), indent=2) + "\n")
                truncate_metrics(self.run_dir / "metrics.jsonl", 0)
                self.collector.reset(seed=c.seed)
            self.metrics = self._open_metrics(resume)
        except BaseException as exc:
            if self.env is not None:
                self.env.close()
            fail_start(exc, self.rundir, resume)
        if resume:  # (a new run is under way once its first checkpoint is written)
            self.rundir.started()
        self._saved_iteration = self.iteration if resume else None
        self._on_iteration = None

    def _open_metrics(self, resume: bool) -> MetricsWriter:
        c = self.cfg
        tracker = make_tracker(c.track, self.run_dir, project=c.wandb_project,
                               config=c.to_dict(), resume=resume, log=self.log)
        return MetricsWriter(self.run_dir, tensorboard=c.tensorboard, tracker=tracker)

    def _setup(self, c: TrainConfig) -> None:
        """The process seeded, then the environments, the learner (policy, update spec,
        optimiser) and the collector (algos/assembly.py), then the counters."""
        seed_process(c)
        remote = make_envs(self, c)
        make_learner(self, c)
        make_collector(self, c, remote)
        self._fused = None
        self.iteration = 0
        self.global_step = 0
        self.elapsed = 0.0
        self.last_return: float | None = None
        # the last RETURN_WINDOW finished training episodes' raw returns (SB3's window)
        self.recent_returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self.stopped_early = False
        self.stop_reason: str | None = None
        self.best_eval_return: float | None = None  # of the evaluations during training
        self._user_scalars: dict[str, float] = {}
        self._building: dict | None = None
        self.last_verdict: Any = None

    def record(self, name: str, value) -> None:
        """Log a scalar of your own into this iteration's metrics record (metrics.jsonl,
        TensorBoard, W&B): only from a callback, which runs before the record is written."""
        if self._building is None:
            raise UsageError("log: scalars are logged from a callback, while an iteration's "
                             "record is being written")
        if not (isinstance(name, str) and _SCALAR_NAME.fullmatch(name)):
            raise UsageError(f"log: name: expected 1 to 100 letters, digits, '_', '.', '/' or "
                             f"'-', got {name!r}")
        if name in self._building:
            raise UsageError(f"log: {name!r} is one of ppokit's own metrics; choose another "
                             "name (e.g. 'custom/{name}')")
        try:
            ok = not isinstance(value, bool) and math.isfinite(float(value))
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            raise UsageError(f"log: {name}: expected a finite number, got {value!r}")
        self._user_scalars[name] = float(value)

    @property
    def reports_games(self) -> bool:
        """Whether the returns reported are game scores (Atari: whole games, all lives,
        unclipped rewards; :mod:`ppokit.envs.atari`) rather than training episodes'."""
        return bool(getattr(self.collector, "games", False))

    @property
    def mean_recent_return(self) -> float | None:
        """Mean raw return of the last ``RETURN_WINDOW`` (100) finished training episodes
        (Atari: the game scores of the last 100 games, :attr:`reports_games`)."""
        return float(np.mean(self.recent_returns)) if self.recent_returns else None

    def extend(self, more_steps: int) -> None:
        """Train ``more_steps`` beyond the steps done so far: ``total_timesteps`` becomes
        ``global_step + more_steps`` (a linear schedule is stretched to the new total)."""
        total = self.global_step + more_steps
        self.cfg = dataclasses.replace(self.cfg, total_timesteps=max(total,
                                                                     self.cfg.rollout_size))

    # ------------------------------------------------------------------ schedules
    def progress_remaining(self) -> float:
        return max(0.0, 1.0 - self.global_step / self.cfg.total_timesteps)

    def current_lr(self) -> float:
        return self.updater.lr.at(self.progress_remaining())

    def current_clip(self) -> float:
        return self.updater.clip.at(self.progress_remaining())

    @property
    def kl_ctl(self):
        """PPO-KL's adaptive beta (``None`` for the other losses): the updater's."""
        return self.updater.kl

    # ------------------------------------------------------------------ update
    def update_minibatch(self, mb: dict[str, torch.Tensor], clip: float,
                         kl_limit: float | None = None) -> dict[str, torch.Tensor] | None:
        """The eager minibatch step (:meth:`ppokit.engine.updater.Updater.eager_step`) with
        this trainer's spec, policy and optimiser; a subclass may override it (then the
        eager path is used for every minibatch)."""
        params = [p for p in self.policy.parameters() if p.requires_grad]
        step = self.updater.eager_step(self.spec, self._forward(), self.opt, params)
        return step(mb, clip, kl_limit)

    def _forward(self) -> Callable:
        """The forward adapter: the policy on a minibatch of samples, or of sequences for
        a recurrent policy (:func:`ppokit.rollout.recurrent_forward`)."""
        if is_recurrent(self.policy):
            return recurrent_forward(self.policy)
        return policy_forward(self.policy)

    def _minibatch_step(self) -> Callable:
        """The fused step when it supports this spec and policy (and the eager step is not
        customised by a subclass), else :meth:`update_minibatch`. (A policy or optimiser
        replaced after construction — as ``ppokit check`` does — gets the eager step.)"""
        if self.flat is None or type(self).update_minibatch is not Trainer.update_minibatch:
            return self.update_minibatch
        f = self._fused
        if f is None or f.policy is not self.policy or f.opt is not self.opt:
            params = [p for p in self.policy.parameters() if p.requires_grad]
            if not self.flat.owns(params) or getattr(self.opt, "flat", None) is not self.flat:
                return self.update_minibatch
            f = self._fused = FusedStep(self.spec, self.policy, self.flat, self.opt)
        return f.step

    def update(self, rollout: Rollout) -> dict[str, Any]:
        """One update (:meth:`ppokit.engine.updater.Updater.update`) on this rollout at the
        iteration's clip range (labels validated and frozen once).
        A recurrent policy's rows are sequences (:meth:`RecurrentRollout.sequence_batch`):
        as many minibatches per epoch as ``batch_size`` samples would make, each of whole
        sequences."""
        spec = self.spec
        if is_recurrent(self.policy):
            batch = LabelledBatch.build(*rollout.sequence_batch())
            n_seq, n_valid = batch.n_rows, int(batch.mask.sum())
            n_mb = max(1, -(-n_valid // self.cfg.minibatch_size))
            spec = dataclasses.replace(spec, minibatch_size=-(-n_seq // n_mb))
        else:
            batch = LabelledBatch.build(rollout.flat())
        params = [p for p in self.policy.parameters() if p.requires_grad]
        out = self.updater.update(batch, self._forward(), self.opt, params,
                                  generator=self.shuffle_gen, step=self._minibatch_step(),
                                  spec=spec)
        if self.kl_ctl is not None:
            out["kl_after_update"] = self._kl_after_update(batch)
        values, returns = batch.data["values"], batch.data["returns"]
        if batch.mask is not None:
            values, returns = values[batch.mask], returns[batch.mask]
        out["explained_variance"] = (explained_variance(values, returns)
                                     if self.cfg.use_critic else None)
        return out

    def _kl_after_update(self, batch: LabelledBatch) -> float:
        """The mean k3 estimate of ``KL(π_old ‖ π)`` over every sample of the iteration
        (valid elements of a sequence batch), ``π`` the policy after the update's epochs
        and ``π_old`` the rollout's (its frozen log-probabilities): what the adaptive β
        is adapted from."""
        with torch.no_grad():
            logp = self._forward()(batch.rows(None)).logp
        return float(approx_kl(logp, batch.data["logp"], batch.mask))

    # ------------------------------------------------------------------ loop
    def iterate(self, on_record: Callable[[dict], Any] | None = None) -> dict[str, Any]:
        c = self.cfg
        t0 = time.perf_counter()
        knobs = self.updater.begin(self.opt, self.progress_remaining())
        self.policy.train()
        rollout = self.collector.collect(c.n_steps)
        rollout.compute_advantages(c.gamma, c.gae_lambda, c.advantage_estimator,
                                   estimator_options(c))
        self.global_step += c.rollout_size
        upd = self.update(rollout)
        if self.kl_ctl is not None and upd["n_updates"]:  # (no step: the policy did not
            self.updater.adapt(upd["kl_after_update"])  # move, β stays)
        self.iteration += 1
        dt = time.perf_counter() - t0
        self.elapsed += dt
        eps = self.collector.pop_finished()
        ret = float(np.mean([e[0] for e in eps])) if eps else None
        length = float(np.mean([e[1] for e in eps])) if eps else None
        if ret is not None:
            self.last_return = ret
        self.recent_returns.extend(e[0] for e in eps)
        rec = {
            "iteration": self.iteration,
            "global_step": self.global_step,
            "episode_return_mean": ret,
            "episode_length_mean": length,
            "episodes": len(eps),
            "sps": c.rollout_size / dt if dt > 0 else None,
            "time": self.elapsed,
            **{k: upd[k] for k in ("policy_loss", "value_loss", "entropy", "approx_kl",
                                   "approx_kl_k1", "clipfrac", "clip_active_frac",
                                   "ratio_min", "ratio_max", "explained_variance",
                                   "grad_norm")},
            "learning_rate": knobs["learning_rate"],
            "clip_range": (knobs["clip_range"]
                           if POLICY_LOSSES.entry(c.policy_loss)["uses_clip_range"] else None),
            "kl_coef": upd["kl_coef"],  # the β this iteration's update used
            "kl_after_update": upd.get("kl_after_update"),
            "target_kl_check": c.target_kl_check if c.target_kl is not None else None,
            "early_stop_epoch": upd["early_stop_epoch"],
            "early_stop_minibatch": upd["early_stop_minibatch"],
            "n_updates": upd["n_updates"],
        }
        rec.update(agent_metrics(self.env))  # a multi-agent env: each agent's return
        if self.selfplay is not None:  # snapshots, evaluations against fixed players
            rec.update(self.selfplay.after_iteration(self))
        if c.eval_every:
            rec.update(self._evaluate_during_training())
        # callbacks see the record before it is written, so that the scalars they log
        # (record) land in this iteration's line
        self._building = rec
        try:
            self.last_verdict = on_record(rec) if on_record is not None else None
        finally:
            self._building = None
        rec.update(self._user_scalars)
        self._user_scalars = {}
        self.metrics.write(rec)
        if self.checkpoint_due():
            self.checkpoint()
        return rec

    def _evaluate_during_training(self) -> dict[str, Any]:
        """Every ``eval_every`` iterations: ``eval_episodes`` episodes (deterministic
        actions unless ``eval_deterministic`` is false) on
        separate environments (the same seeds each time, so evaluations compare), and the
        policy written to ``best/`` when its mean return is the best so far."""
        c = self.cfg
        out = {"eval_return_mean": None, "eval_return_std": None, "eval_best": None}
        if self.iteration % c.eval_every != 0:
            return out
        from .evaluate import evaluate_policy

        rets = evaluate_policy(self.policy, c, episodes=c.eval_episodes,
                               seed=c.seed + EVAL_SEED_OFFSET, deterministic=c.eval_deterministic,
                               obs_norm=self.obs_norm, env=self.env_maker)
        mean = float(np.mean(rets))
        out["eval_return_mean"], out["eval_return_std"] = mean, float(np.std(rets))
        if self.best_eval_return is None or mean > self.best_eval_return:
            self.best_eval_return = mean
            self.save(self.run_dir / BEST_DIR, keep=1)
        out["eval_best"] = self.best_eval_return
        return out

    def train(self, on_iteration: Callable[[dict], Any] | None = None, *,
              stop: GracefulStop | None = None) -> None:
        """Iterate until ``num_iterations`` (:meth:`RunLifecycle.run_to_end`).
        ``on_iteration(metrics)`` runs after each iteration's update, before its record is
        written (scalars it logs with :meth:`record` join that record); when it returns
        ``False`` or ``"stop"``, training ends there with a checkpoint (``stopped_early`` is
        then True). With ``stop`` (a :class:`GracefulStop`), a signal ends training at the
        next iteration boundary: a checkpoint is written and :class:`ppokit.io.Interrupted`
        raised. The run directory's lock is held until training returns."""
        if self.metrics.fh.closed:  # training again after an earlier train() returned
            self.metrics = self._open_metrics(resume=True)
        self._on_iteration = on_iteration
        try:
            self.run_to_end(stop)
        finally:
            self.metrics.close()

    # ------------------------------------------------------------------ the run's life
    def plan(self) -> Plan:
        return Plan(self.cfg.num_iterations, self.cfg.checkpoint_every)

    def run_iteration(self) -> dict[str, Any]:
        return self.iterate(self._on_iteration)

    def stop_requested(self, rec: dict) -> str | None:
        target = self.cfg.stop_at_return
        got = rec.get("eval_return_mean")
        if target is not None and got is not None and got >= target:
            return f"evaluation return {got:.1f} reached stop_at_return {target:g}"
        if asks_to_stop(self.last_verdict, stops_on=False):
            return "a callback asked to stop"
        return None

    def release(self) -> None:
        self.metrics.close()  # (before a failed start's files are removed)

    def resume_command(self) -> str:
        """The command that continues this run."""
        c = self.cfg
        cmd = f"ppokit train --resume {self.run_dir}"
        if c.env_source == "factory":
            return f"ppokit.load({str(self.run_dir)!r}, env=<the factory>).learn(...)"
        from ppokit.plugins import resume_flags

        return (cmd + (f" --env {c.env_id}" if ":" in c.env_id else "")
                + resume_flags(policy_loss=c.policy_loss,
                               advantage_estimator=c.advantage_estimator))

    def close(self) -> None:
        """Close the environments and release the run directory's lock."""
        if self.env is not None:
            self.env.close()
        self.metrics.close()
        self.rundir.close()

    # ------------------------------------------------------------------ checkpoints
    def save(self, root: str | Path | None = None, keep: int | None = None) -> Path:
        """Write a checkpoint of the whole training state under ``root`` (default: the run
        directory's ``checkpoints/``, once per iteration: :meth:`checkpoint`)."""
        if root is None and keep is None:
            return self.checkpoint()
        return self._write(root, keep)

    def write_checkpoint(self) -> Path:
        return self._write(None, None)

    def _write(self, root: str | Path | None, keep: int | None) -> Path:
        return checkpoints.write(self, root, keep)

    def _resume(self) -> None:
        checkpoints.resume(self)
