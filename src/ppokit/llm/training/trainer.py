"""The token-level trainer: PPO, GRPO, Dr. GRPO, RLOO and REINFORCE++ as presets of one loop.

One iteration (docs/theory.md#the-ppo-iteration, in this order):

1. **Generate** ``prompts_per_iter × samples_per_prompt`` completions with the current
   policy (plain sampling at ``temperature``; KV cache; left-padded prompts); with
   ``max_staleness = K ≥ 1`` a worker makes them ahead, with weights K updates old
   (:mod:`.overlap`), and the loss weighs them back (decoupled PPO, ``rollout_is``).
2. **Score** (all frozen labels, no gradient): the sequence scores (reward function or
   reward model); old log-probs from a separate forward pass of the policy; reference
   log-probs from the frozen reference; the critic's values (``ppo``).
3. **Advantages**, computed once, by ``advantage_estimator`` (a preset value, not a code
   path of the algorithm): the score goes on the last action token (the EOS when there is
   one) and, with ``kl_mode="reward"``, the per-token KL reward ``−β (log π_old − log
   π_ref)`` on action tokens (k1, never clamped); ``gae`` runs
   :func:`ppokit.core.token_gae` with the critic (value targets ``A + V_old``); the group
   estimators (``grpo`` with or without ``normalize_std``, ``dr_grpo``, ``rloo``, from
   :data:`ppokit.core.GROUP_ADVANTAGES`) normalise scores within each group of samples of
   one prompt and broadcast the sequence advantage to its action tokens; ``reinforce_pp``
   whitens per-token returns over the batch.
4. **Update**: the engine both trainers share (:func:`ppokit.engine.run_update`):
   ``n_epochs`` passes in shuffled minibatches of ``batch_size`` sequences, each
   accumulated over ``grad_accum`` micro-batches whose losses divide by the minibatch's
   *global* token / sequence counts (so accumulation changes nothing but memory),
   PPO-Clip surrogate, optional value clipping, entropy bonus, KL loss term
   (``kl_mode="loss"``, ``kl_estimator`` of the current policy vs the reference: k2 by
   default, whose expected gradient is ``∇KL(π ‖ π_ref)``), one global gradient
   clip over policy and critic, and the target-KL early stop — each meaning exactly what
   it means for environment training (docs/architecture.md, glossary).

Truncation (a response that reached ``max_new_tokens`` without EOS) is an explicit option:
``none`` (the default): the response is scored like any other, so the objective is the
reward itself; ``bootstrap`` (a critic only): the score is not placed; the return after
the last token is the critic's value of the final state; ``penalty``: the score is placed,
minus ``truncation_penalty``; ``mask``: the row is left out of every loss.

Prompts and rewards (ppokit.llm.inputs.data, ppokit.llm.inputs.rewards): a prompt row is
plain text or a conversation rendered with the tokenizer's chat template; each reward
function is called
with TRL's keyword arguments (``prompts``, ``completions``, ``completion_ids`` and every
other column of the rows), and is probed once on a small batch before training starts, so
that a wrong signature or return value stops the run before any update.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import torch

from ppokit.core.registry import clip_unit
from ppokit.engine import LabelledBatch, UpdateSpec
from ppokit.engine.allocator import keep_freed_memory
from ppokit.engine.recipe import spec_of
from ppokit.errors import UsageError
from ppokit.io import (
    GracefulStop,
    RunDir,
)
from ppokit.io.lifecycle import Plan, RunLifecycle, asks_to_stop
from ppokit.io.rundir import fail_start

from ..inputs.reward_setup import (  # noqa: F401 (re-exported)
    check_reward_named_again,
    reward_arguments,
    reward_set,
)
from ..inputs.rewards import per_function_stats
from ..labelling.batching import collect_batch
from ..labelling.labels import Labels, compute_labels, overlong_penalty  # noqa: F401 (re-exported)
from ..modeling.rollout import (
    TokenRollout,
    encode_prompts,
)
from . import adapter, checkpoints, frozen
from .config import (  # noqa: F401 (re-exported)
    ALGOS,
    PRESETS,
    TRUNCATION,
    LLMConfig,
    config_dict,
)
from .divergence import (
    check_scales,
    guarded_update,
    update_kl,
)
from .heldout import evaluate_heldout
from .overlap import Overlap
from .parallel import NoRunDir, gather_iteration, shard
from .progress import Progress
from .runfiles import (  # noqa: F401 (config_from_run re-exported)
    EVAL_PROMPTS,
    TRAIN_PROMPTS,
    config_from_run,
    load_prompts,
    resume_command,
    run_prompt_sets,
    write_prompts,
)
from .setup import setup

__all__ = ["LLMConfig", "ALGOS", "TokenTrainer", "Labels", "compute_labels", "load_prompts"]

# --------------------------------------------------------------------------- trainer


class TokenTrainer(RunLifecycle):
    """Owns the policy, reference, critic, optimiser and run directory."""

    def __init__(self, cfg: LLMConfig, run_dir: str, *, policy=None, tokenizer=None,
                 reference=None, log=print, resume: bool = False, monitors=None,
                 reward_fn=None, fresh: bool = False, train_rows=None, eval_rows=None,
                 callbacks=(), dp=None, env=None):
        self.cfg = cfg = cfg.resolved()
        keep_freed_memory()  # engine/allocator.py: no kernel round trip per activation
        # data parallelism (ppokit.engine.dist.DataParallel; None: one process). Only rank
        # 0 owns the run directory: lock, metrics, samples, checkpoints, exported policy.
        self.dp = dp
        self.rank, self.world = (dp.rank, dp.world) if dp is not None else (0, 1)
        self.is_main = self.rank == 0
        if cfg.prompts_per_iter % self.world:
            raise UsageError(f"prompts_per_iter: {cfg.prompts_per_iter} is not divisible by "
                             f"the {self.world} ranks (each rank takes whole prompts with "
                             "all their samples)")
        # monitors: callables (prompts, completions) -> {name: float}, logged each iteration
        # (e.g. a true task score while training against a learned reward model)
        self.monitors = list(monitors or [])
        # callbacks: called with each iteration's record; one that returns True stops
        # training at that iteration boundary (a checkpoint is written)
        self.callbacks = list(callbacks or [])
        self._warned: set = set()
        self.run_dir = str(run_dir)
        self.log = log
        self.metrics = None
        # the lock first: a second writer fails before any work; a failed start leaves
        # nothing behind (RunDir.abort)
        self.rundir = (RunDir(self.run_dir, new=not resume, kind="llm", fresh=fresh)
                       if self.is_main else NoRunDir())
        try:
            setup(self, cfg, policy, tokenizer, reference, reward_fn, resume, train_rows,
                  eval_rows, env)
        except BaseException as exc:
            fail_start(exc, self.rundir, resume)
        if resume:  # (a new run is under way once its first checkpoint is written)
            self.rundir.started()

    def _all_done(self, flag: bool) -> bool:
        """Every rank's generation finished (sharded models generate in step)."""
        return bool(self.dp.min_(torch.tensor(float(flag))) > 0)

    def _reward_set(self, reward_fn):
        return reward_set(self.cfg, reward_fn, self.task, log=self.log)

    def probe_rewards(self) -> None:
        """Every reward function called once before training (:func:`.frozen.probe_rewards`)."""
        frozen.probe_rewards(self)

    # ------------------------------------------------------------------ phases
    def render(self, prompt) -> str:
        from ..inputs.data import render_prompt

        return render_prompt(self.tok, prompt)

    def prompt_text(self, row: dict) -> str:
        return self.render(row["prompt"])

    def sample_rows(self, n: int | None = None, rng: random.Random | None = None
                    ) -> list[dict]:
        """``n`` (default ``prompts_per_iter``) training rows, drawn with replacement: the
        global list, the same on every rank (with several ranks, :meth:`train_iteration`
        takes this rank's block of it)."""
        n = self.cfg.prompts_per_iter if n is None else n
        rng = rng or self.py_rng
        if self.task is not None:
            return [self.task.row(p) for p in self.task.train_prompts(n, rng)]
        return [self.train_rows[rng.randrange(len(self.train_rows))] for _ in range(n)]

    def sample_prompts(self) -> list[str]:
        """The texts of :meth:`sample_rows` (what the model is given)."""
        return [self.prompt_text(r) for r in self.sample_rows()]

    def decode(self, roll: TokenRollout) -> list[str]:
        return [self.tok.decode(r, skip_special_tokens=True) for r in roll.response_ids]

    def score(self, prompts, completions) -> torch.Tensor:
        """Total scores of plain-text prompts and completions (no other columns)."""
        return self.rewards(list(prompts), list(completions))[0]

    def score_rows(self, rows: list[dict], roll: TokenRollout):
        """``(completions, total [B], {name: [B]})`` of a rollout of ``rows``."""
        comps, kwargs = reward_arguments(rows, self.decode(roll), roll.response_ids)
        total, per = self.rewards(kwargs.pop("prompts"), kwargs.pop("completions"),
                                  kwargs.pop("completion_ids"), kwargs)
        return comps, total, per

    def autocast(self, precision: str | None = None):
        """The context the models' forward passes run in: bfloat16 autocast with
        ``precision = "bf16"`` (matrix products in bfloat16, accumulated in float32; the
        log-softmax, values and losses are float32 either way), else a no-op.
        ``precision``: another format than the configuration's (the sampler's)."""
        device = next(self.policy.parameters()).device.type
        return torch.autocast(device, dtype=torch.bfloat16,
                              enabled=(precision or self.cfg.precision) == "bf16")

    def rollout(self, prompts: list[str], temperature: float | None = None,
                model=None, generator: torch.Generator | None = None) -> TokenRollout:
        """Sample completions of ``prompts`` (in ``sampler_precision``)."""
        ids, mask = encode_prompts(self.tok, prompts)
        with self.autocast(self.cfg.sampler_precision):
            return self._generate(ids, mask, temperature, model, generator)

    def sample_ids(self, ids, mask, generator: torch.Generator | None = None,
                   temperature: float | None = None) -> TokenRollout:
        """Sample completions of encoded, left-padded prompts ``ids`` / ``mask`` (in the
        caller's precision context; an agent run's turns)."""
        return self._generate(ids, mask, temperature, None, generator)

    def _generate(self, ids, mask, temperature, model, generator) -> TokenRollout:
        return self.engine.generate(  # the rollout engine (ppokit.llm.engines)
            ids, mask, max_new_tokens=self.max_new_tokens, eos_token_id=self.tok.eos_token_id,
            pad_token_id=self.tok.pad_token_id, model=model,
            temperature=self.cfg.temperature if temperature is None else temperature,
            generator=self.gen if generator is None else generator)

    def frozen_forward(self, roll: TokenRollout):
        """Old log-probs, reference log-probs, critic values (:mod:`.frozen`)."""
        return frozen.frozen_forward(self, roll)

    def shared_prompt_len(self, roll: TokenRollout) -> int | None:
        """Prompt width for :func:`sequence_logprobs` to compute each group's prompt once;
        None under FSDP, where every rank must make the same forward calls whatever its
        rows (sharing takes two calls, or one when no prompt repeats)."""
        return None if self.fsdp else roll.prompt_len

    @property
    def shared_critic(self) -> bool:
        return self.critic is not None and not self.critic.separate

    def update_spec(self, beta: float) -> UpdateSpec:
        """The engine's spec of this trainer's update (:func:`ppokit.engine.recipe.spec_of`,
        as for environment training): the configuration's recipe with what this trainer
        decides — the critic in use, the KL term (to the reference, when it enters the
        loss) and its current beta, and the length constant of seq-mean-token-sum-norm."""
        cfg = self.cfg
        return spec_of(cfg, norm_length=float(self.max_new_tokens),
                       use_critic=self.critic is not None, kl_coef=beta,
                       kl_anchor="ref" if cfg.kl_mode == "loss" and beta > 0 else "none")

    def labelled_batch(self, roll: TokenRollout, lab: Labels) -> LabelledBatch:
        """The rollout's frozen labels as the engine's batch (:mod:`.adapter`)."""
        return adapter.labelled_batch(self, roll, lab)

    def forward_adapter(self, roll: TokenRollout):
        """The policy (and critic) on a set of the rollout's sequences (:mod:`.adapter`)."""
        return adapter.forward_adapter(self, roll)

    def trained_parameters(self) -> list[torch.Tensor]:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if self.critic is not None:
            seen = {id(p) for p in params}
            params += [p for p in self.critic.parameters()
                       if p.requires_grad and id(p) not in seen]
        return params

    @property
    def kl_ctl(self):
        """The KL coefficient's controller (fixed, or adapted to ``kl_target``)."""
        return self.updater.kl

    def update_minibatch(self, mb: dict, clip_range: float, kl_limit: float | None = None,
                         *, spec: UpdateSpec, forward) -> dict | None:
        """The updater's eager minibatch step (a subclass may override it)."""
        step = self.updater.eager_step(spec, forward, self.opt, self.trained_parameters(),
                                       self.dp)
        return step(mb, clip_range, kl_limit)

    def update(self, roll: TokenRollout, lab: Labels) -> dict:
        """One update (:meth:`ppokit.engine.updater.Updater.update`) on this rollout, with
        the spec of the current KL coefficient; ``kl_coef`` is among its statistics."""
        spec = self.update_spec(self.kl_ctl.value)
        forward = self.forward_adapter(roll)

        def step(mb, clip_range, kl_limit):
            return self.update_minibatch(mb, clip_range, kl_limit, spec=spec, forward=forward)

        return self.updater.update(self.labelled_batch(roll, lab), forward, self.opt,
                                   self.trained_parameters(), generator=self.shuffle_gen,
                                   step=step, spec=spec, dp=self.dp)

    def guarded_update(self, roll: TokenRollout, lab: Labels) -> dict:
        """:meth:`update` under the divergence guard
        (:func:`ppokit.llm.training.divergence.guarded_update`)."""
        return guarded_update(self, roll, lab)

    @torch.no_grad()
    def movement(self, roll: TokenRollout, lab: Labels) -> float:
        """How far the last update moved the policy: :func:`update_kl` of the rollout's
        old log-probs and the updated policy's, on up to ``PROBE_ROWS`` of its sequences
        spread over the batch (every group represented)."""
        rows, _, new = frozen.probe_logprobs(self, roll)
        return update_kl(new, lab.old_logp[rows], lab.loss_mask[rows])

    # ------------------------------------------------------------------ loop
    def train_iteration(self, roll: TokenRollout | None = None) -> dict:
        """One iteration. ``roll``: this rank's rollout of this iteration's prompts,
        generated elsewhere (tests); by default it is sampled here (with dynamic sampling,
        further rounds are sampled here either way)."""
        cfg = self.cfg
        if self.rewards is not None:
            self.rewards.when = f"iteration {self.iteration + 1}"
        t0 = time.perf_counter()
        draw, ahead = self.draw_rows, None
        if roll is None and self.staleness is not None:  # generated ahead (.overlap)
            ahead, served = self.batch_ahead()
            draw, roll = (lambda: ahead.rows), ahead.roll
        else:
            served = self.engine.prepare(self)  # the engine serves the policy's weights
        if self.agent is not None:  # episodes in a text environment (llm/agents/)
            got = self.agent.collect(self)
        else:
            got = collect_batch(draw, self.rollout, self.score_with_length,
                                group_size=cfg.samples_per_prompt,
                                dynamic=cfg.dynamic_sampling,
                                max_rounds=cfg.dynamic_sampling_rounds, any_rank=self.agree,
                                pad_token_id=self.tok.pad_token_id, render=self.prompt_text,
                                first=roll)
        roll, scores, per_func, prompts = got.roll, got.scores, got.per_func, got.prompts
        comps = [c if isinstance(c, str) else c[0]["content"] for c in got.completions]
        t1 = time.perf_counter() - got.time_scoring
        recomputed = not frozen.old_from_sampler(self, roll)
        old, ref, values_after = self.frozen_forward(roll)
        kl_probe = frozen.reference_probe(self, roll, old) if ref is None else {}
        sampler_logp, turn_rewards = roll.logp, got.turn_rewards
        if self.dp is not None:  # the iteration's batch on every rank (training/parallel.py)
            roll, (old, ref, values_after, sampler_logp, turn_rewards), scores, prompts, \
                comps, per_func = gather_iteration(
                    self.dp, got, [old, ref, values_after, sampler_logp, turn_rewards],
                    comps, self.tok.pad_token_id, agent=self.agent is not None)
        beta = self.updater.begin(self.opt)["kl_coef"]  # (no schedule: the rates stay)
        lab = compute_labels(cfg, roll, scores, old, ref, beta, values_after,
                             sampler_logp=sampler_logp if cfg.rollout_is != "none" else None,
                             turn_rewards=turn_rewards)
        lab.stats.update(kl_probe)  # kl_ref on a probe when no KL term needed the batch's
        if self.labels_observer is not None:  # (the horizon bench reads the gradient)
            self.labels_observer(roll, lab)
        mismatch = frozen.mismatch(self, roll, old if recomputed else None)
        t2 = time.perf_counter()
        upd = self.guarded_update(roll, lab)
        t3 = time.perf_counter()
        self.updater.adapt(lab.stats["kl_ref"], len(prompts))  # (a fixed beta stays)
        ntok = float(roll.action_mask.sum())
        self.iteration += 1
        if ahead is not None:  # the worker's next batch, with the weights just made
            self.overlap.after_update()
        # training time: from the end of the last iteration's count (its checkpoint and
        # logging included, the held-out evaluation not: _publish moves the mark past it),
        # or from this iteration's start after a start or resume; what the time limit reads
        since = t0 if self._clock_mark is None else self._clock_mark
        self.elapsed += t3 - since
        self._clock_mark = t3
        if self.dp is not None:  # one clock, rank 0's: the others wait out its evaluation
            clock = torch.tensor([self.elapsed], dtype=torch.float64)
            self.dp.broadcast_([clock])
            self.elapsed = float(clock[0])
        gen_s = served.get("time_generation", t1 - t0)
        rec = {"iteration": self.iteration, **lab.stats, **got.stats, **mismatch, **upd,
               **served,
               "tokens_per_s_generation": ntok / max(gen_s, 1e-9),
               "tokens_per_s_scoring": ntok / max(t2 - t1, 1e-9),
               "tokens_per_s_training": ntok / max(t3 - t2, 1e-9),
               "time_generation": gen_s, "time_scoring": t2 - t1, "time_training": t3 - t2,
               "response_tokens": ntok, "wall_time": self.elapsed,
               **per_function_stats(per_func)}
        if self.dp is not None:
            rec["ranks"] = self.world
        unit = clip_unit(cfg.policy_loss)
        if unit != "token" and "clipfrac" in rec:  # not a share of token ratios
            rec[f"clipfrac_{unit}"] = rec.pop("clipfrac")
        if not self.is_main:
            return {k: (float(v) if isinstance(v, float) else v) for k, v in rec.items()}
        return self._publish(rec, prompts, comps, scores, roll, ahead)

    def _publish(self, rec: dict, prompts, comps, scores, roll, ahead) -> dict:
        """Rank 0: the held-out evaluation when due, the monitors, then the iteration's
        metrics record and its logged samples written."""
        cfg = self.cfg
        if cfg.eval_every and (self.iteration % cfg.eval_every == 0 or self._last_iteration()):
            t = time.perf_counter()
            rec.update(self.evaluate_heldout())
            if self._clock_mark is not None:  # (the clock leaves held-out scoring out)
                self._clock_mark += time.perf_counter() - t
        for mon in self.monitors:
            rec.update({k: float(v) for k, v in mon(prompts, comps).items()})
        rec = {k: (float(v) if isinstance(v, float) else v) for k, v in rec.items()}
        self._check_scales(rec)
        self.metrics.write(rec)
        version = {} if ahead is None else {"policy_version": ahead.version}
        for i in range(min(cfg.samples_logged, len(prompts))):
            self.samples.write({"iteration": self.iteration, "prompt": prompts[i],
                                "completion": comps[i], "score": float(scores[i]),
                                "truncated": bool(roll.truncated[i]), **version})
        return rec

    def _last_iteration(self) -> bool:
        """Whether the loop ends after this iteration (its iteration count or its time
        limit reached): the run's last held-out score is of the policy it ends with."""
        plan = self.plan()  # (the loop's own stopping rule: RunLifecycle._loop)
        return (self.iteration >= plan.total_iterations
                or (plan.time_limit is not None and self.elapsed >= plan.time_limit))

    def draw_rows(self) -> list:
        """This rank's rows of the next batch, each prompt ``samples_per_prompt`` times."""
        rows = self.sample_rows()
        if self.dp is not None:
            rows = shard(rows, self.rank, self.world)
        return [r for r in rows for _ in range(self.cfg.samples_per_prompt)]

    def batch_ahead(self):
        """``(batch, statistics)``: the next batch the generation worker made
        (:mod:`.overlap`; started at the first call, with the policy as it is then)."""
        if self.overlap is None:
            self.overlap = Overlap(self, self.staleness, self.draw_rows)
        return self.overlap.take()

    def end_overlap(self) -> None:
        """Stop the generation worker (its batches in flight are dropped; the prompt and
        sampling streams go back to before them)."""
        overlap, self.overlap = self.overlap, None
        if overlap is not None:
            overlap.close()

    def evaluate_heldout(self) -> dict:
        """``eval/...``: the policy's held-out scores (:func:`.heldout.evaluate_heldout`)."""
        return evaluate_heldout(self)

    def train(self, progress: bool = True, *, stop: GracefulStop | None = None
              ) -> list[dict]:
        """Train to ``iterations`` (or the time limit), checkpointing every
        ``checkpoint_every`` iterations and at the end, then export ``RUN_DIR/policy``
        (:meth:`RunLifecycle.run_to_end`). With ``stop`` (a :class:`GracefulStop`), a
        signal ends training at the next iteration boundary: a checkpoint is written and
        :class:`ppokit.io.Interrupted` raised. The run directory's lock is held until
        training returns."""
        self._recs = []
        self._clock_mark = None  # (the time before this call is not training)
        self._bar = Progress(self.cfg.iterations, self.iteration,
                             enabled=progress and self.is_main, time_limit=self.cfg.time_limit)
        try:
            with self._bar:
                self.run_to_end(stop)
        finally:
            self.end_overlap()
        return self._recs

    # ------------------------------------------------------------------ the run's life
    def plan(self) -> Plan:
        return Plan(self.cfg.iterations, self.cfg.checkpoint_every, self.cfg.time_limit)

    def run_iteration(self) -> dict:
        rec = self.train_iteration()
        self._recs.append(rec)
        self._bar.advance(rec)
        return rec

    def stop_requested(self, rec: dict) -> str | None:
        # callbacks run where the record is written (rank 0); all ranks stop together
        if self.is_main and any([asks_to_stop(cb(rec), stops_on=True)
                                 for cb in self.callbacks]):
            self.log(f"a callback stopped training at iteration {self.iteration}")
            return "a callback asked to stop"
        return None

    def finish(self) -> None:
        self.export_policy(os.path.join(self.run_dir, "policy"))

    def release(self) -> None:
        self.close()

    def resume_command(self) -> str:
        return resume_command(self.run_dir, self.cfg, self.world)

    def agree(self, flag: bool) -> bool:
        """``flag`` on any rank (one all-reduce): decisions that end the loop are taken by
        all ranks together (a signal or a clock may reach them at different moments)."""
        if self.dp is None:
            return bool(flag)
        return bool(self.dp.max_(torch.tensor(float(flag))) > 0)

    def score_with_length(self, rows: list[dict], roll: TokenRollout):
        """:meth:`score_rows` with the soft overlong punishment (:mod:`.frozen`)."""
        return frozen.score_with_length(self, rows, roll)

    def _check_scales(self, rec: dict) -> None:
        check_scales(self.cfg, rec, self._warned, self.log)

    def close(self) -> None:
        """End the generation worker; close the metrics files and the agent's tools;
        release the run dir's lock."""
        self.end_overlap()
        for w in (self.metrics, *(getattr(self, k, None) for k in ("samples", "agent", "engine"))):
            if callable(getattr(w, "close", None)):
                w.close()
        self.rundir.close()

    # ------------------------------------------------------------------ checkpoints
    def export_policy(self, path: str) -> None:
        """Save the policy as a plain local HF directory (LoRA adapters merged in a copy)."""
        checkpoints.export_policy(self, path)

    def save_checkpoint(self) -> Path:
        """Write this iteration's checkpoint (once per iteration; :mod:`.checkpoints`)."""
        return self.checkpoint()

    def write_checkpoint(self) -> Path:
        return checkpoints.save_checkpoint(self)

    def _load_checkpoint(self, ckpt: Path) -> None:
        checkpoints.load_checkpoint(self, ckpt)
