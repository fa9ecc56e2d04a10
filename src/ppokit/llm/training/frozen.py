"""The frozen labels of an iteration's rollout, computed without gradient: the policy's
old log-probs (the sampler's own unless recomputed), the reference's log-probs, the
critic's values; the scores with the soft overlong punishment; and the rollout-training
mismatch measured on them; the reward functions' probe before training. Functions of the
trainer ``tr`` (:class:`~ppokit.llm.training.trainer.TokenTrainer`)."""

from __future__ import annotations

import random

import torch

from ppokit.core import kl_k1, masked_mean

from ..labelling.labels import overlong_penalty
from ..labelling.mismatch import mismatch_stats
from ..modeling.rollout import TokenRollout, sequence_logprobs
from .divergence import PROBE_ROWS

__all__ = ["frozen_forward", "old_from_sampler", "reference_needed", "reference_probe",
           "probe_logprobs", "score_with_length", "mismatch", "probe_rewards"]


@torch.no_grad()
def frozen_forward(tr, roll: TokenRollout):
    """Old log-probs (policy), reference log-probs, critic values — no gradient.
    The old log-probs are the sampler's own (``roll.logp``) unless ``old_logprobs =
    "recompute"``, the rollout came without them, or a shared critic needs the
    policy's hidden states anyway. The reference's are ``None`` when no KL term reads
    them (:func:`reference_needed`); :func:`reference_probe` then measures ``kl_ref``."""
    with tr.autocast():
        return _frozen_pass(tr, roll)

def _frozen_pass(tr, roll: TokenRollout):
    t = tr.cfg.temperature
    if old_from_sampler(tr, roll):
        old = {"logp": roll.logp}
    else:
        old = sequence_logprobs(tr.policy, roll.input_ids, roll.attention_mask,
                                temperature=t, with_hidden=tr.shared_critic,
                                prompt_len=tr.shared_prompt_len(roll),
                                actions_from=roll.prompt_len, packing=tr.cfg.packing)
    ref = None
    if reference_needed(tr):
        ref = sequence_logprobs(tr.reference, roll.input_ids, roll.attention_mask,
                                temperature=t, prompt_len=tr.shared_prompt_len(roll),
                                actions_from=roll.prompt_len, packing=tr.cfg.packing)["logp"]
    values_after = None
    if tr.critic is not None:
        values_after = tr.critic(roll.input_ids, roll.attention_mask, roll.position_ids,
                                   hidden_states=old.get("hidden"))
    return old["logp"], ref, values_after

def reference_needed(tr) -> bool:
    """Whether the reference's log-probs of the whole batch enter the labels or the loss:
    a KL term (``kl_mode`` reward or loss) whose coefficient is not 0 or is adapted
    (``kl_target``). Otherwise a forward pass of the reference over the whole batch would
    serve only the ``kl_ref`` metric, which :func:`reference_probe` measures on a few
    sequences instead (at β 0 that pass was about a quarter of the trainer's time per
    iteration on SmolLM2: docs/performance.md, "Time to accuracy against TRL")."""
    if tr.cfg.kl_mode == "none":
        return False
    return tr.cfg.kl_target is not None or tr.kl_ctl.value != 0


@torch.no_grad()
def reference_probe(tr, roll: TokenRollout, old: torch.Tensor) -> dict:
    """``kl_ref`` and ``kl_ref_token``, the k1 estimate of KL(policy ‖ reference), measured
    on up to ``PROBE_ROWS`` of the rollout's sequences spread over the batch (every group
    represented), with ``kl_ref_rows`` the number of sequences it read; ``old`` is the
    batch's old log-probs. Under data parallelism this is each rank's own rows (rank 0's
    are logged)."""
    rows, sub, ref = probe_logprobs(tr, roll, tr.reference)
    am = sub.action_mask
    kl_tok = torch.where(am, kl_k1(old[rows].float(), ref.float()), 0.0)
    return {"kl_ref": float(kl_tok.sum(1).mean()),
            "kl_ref_token": float(masked_mean(kl_tok, am)),
            "kl_ref_rows": int(rows.numel())}


def probe_rows(roll: TokenRollout) -> tuple[torch.Tensor, TokenRollout]:
    """``(rows, sub-rollout)``: up to ``PROBE_ROWS`` of the rollout's sequences, spread
    over the batch (every group represented)."""
    n = roll.input_ids.shape[0]
    rows = torch.linspace(0, n - 1, min(n, PROBE_ROWS)).round().long().unique()
    return rows, roll.select(rows)


def old_from_sampler(tr, roll: TokenRollout) -> bool:
    """The old log-probs are the sampler's (no forward pass of the trainer): asked for, and
    the rollout engine's log-probs are the trainer's own computation (ppokit's sampler)."""
    return (tr.cfg.old_logprobs == "sampler" and roll.logp is not None
            and not tr.shared_critic and tr.engine.trainer_logprobs)


def probe_logprobs(tr, roll: TokenRollout, model=None):
    """``(rows, sub-rollout, log-probs)``: the log-probs under ``model`` (the policy by
    default) of up to ``PROBE_ROWS`` of the rollout's sequences, spread over the batch
    (every group represented)."""
    rows, sub = probe_rows(roll)
    model = tr.policy if model is None else model
    with tr.autocast():
        logp = sequence_logprobs(model, sub.input_ids, sub.attention_mask,
                                 temperature=tr.cfg.temperature,
                                 prompt_len=tr.shared_prompt_len(sub),
                                 actions_from=sub.prompt_len, packing=tr.cfg.packing)["logp"]
    return rows, sub, logp

def score_with_length(tr, rows: list[dict], roll: TokenRollout):
    """:meth:`score_rows`, with the soft overlong punishment (``overlong_buffer``)
    added to the scores and reported as the reward ``overlong``."""
    comps, total, per = tr.score_rows(rows, roll)
    if tr.cfg.overlong_buffer > 0:
        pen = overlong_penalty(roll.lengths, tr.max_new_tokens,
                               tr.cfg.overlong_buffer, tr.cfg.overlong_penalty)
        total = total + pen.to(total.dtype)
        per = {**per, "overlong": pen}
    return comps, total, per

@torch.no_grad()
def mismatch(tr, roll: TokenRollout, old: torch.Tensor | None) -> dict:
    """``mismatch_...``: the trainer's old log-probs against the sampler's on the
    rollout's action tokens (:func:`ppokit.llm.labelling.mismatch.mismatch_stats`): over
    the whole
    batch when the trainer recomputed them (``old``), else on up to ``PROBE_ROWS``
    sequences (one forward pass of the trainer over them). Nothing without sampler
    log-probs."""
    if roll.logp is None:
        return {}
    cfg = tr.cfg
    if old is not None:
        trainer, sampler, mask = old, roll.logp, roll.action_mask
    else:
        _, sub, trainer = probe_logprobs(tr, roll)
        sampler, mask = sub.logp, sub.action_mask
    return mismatch_stats(trainer, sampler, mask, cfg.rollout_is_threshold_lower,
                          cfg.rollout_is_threshold)


def probe_rewards(tr) -> None:
    """Call every reward function once on completions of two training prompts (own
    random generator: the run's streams are untouched), so that a wrong signature or
    return value is an error before any training."""
    rows = tr.sample_rows(2, random.Random(tr.cfg.seed + 1))
    gen = torch.Generator().manual_seed(tr.cfg.seed + 1)
    roll = tr.rollout([tr.prompt_text(r) for r in rows], generator=gen)
    tr.rewards.when = "the check before training"
    tr.score_rows(rows, roll)
