"""The trainer's batch and forward pass as the engine (:func:`ppokit.engine.run_update`)
takes them: the frozen labels of a rollout as a :class:`~ppokit.engine.LabelledBatch`, and
the policy (and critic) on a set of its sequences. Functions of the trainer ``tr``
(:class:`~ppokit.llm.training.trainer.TokenTrainer`)."""

from __future__ import annotations

import torch

from ppokit.engine import Forward, LabelledBatch

from ..labelling.labels import Labels
from ..modeling.positions import distinct_prompts
from ..modeling.rollout import TokenRollout, sequence_logprobs, shift_to_tokens

__all__ = ["labelled_batch", "forward_adapter"]


def labelled_batch(tr, roll: TokenRollout, lab: Labels) -> LabelledBatch:
    """The rollout's frozen labels as the engine's batch: one row per sequence, the
    loss mask marking the action tokens that enter the losses; ``row`` indexes the
    rollout (the forward adapter reads the token ids from it)."""
    n = roll.input_ids.shape[0]
    data = {"row": torch.arange(n), "logp": lab.old_logp,
            "advantages": lab.advantages}
    if lab.ref_logp is not None:
        data["ref_logp"] = lab.ref_logp
    if tr.dp is not None:  # contiguous blocks of rows, in rank order
        data["owner"] = torch.arange(tr.world).repeat_interleave(n // tr.world)
    if lab.returns is not None:
        data["returns"] = lab.returns
        data["values"] = lab.values
    if lab.is_weight is not None:
        data["is_weight"] = lab.is_weight
    return LabelledBatch.build(data, lab.loss_mask)


def forward_adapter(tr, roll: TokenRollout):
    """The policy (and critic) on a set of the rollout's sequences: log-probs and
    entropies of the action tokens and the critic's values, each ``[M, L]``."""
    t = tr.cfg.temperature
    # the rollout's number of distinct prompts: each minibatch's shared-prompt pass
    # computes that many prompt rows (or its own row count, if fewer), so that every
    # minibatch has one shape (ppokit/llm/modeling/fused.py, fused_logits: min_prompts)
    p = tr.shared_prompt_len(roll)
    groups = distinct_prompts(roll.input_ids[:, :p], roll.attention_mask[:, :p]) if p else None
    n_prompts = 0 if groups is None else int(groups[0].shape[0])

    def forward(rows: dict) -> Forward:
        with tr.autocast():
            return _forward(rows)

    def _forward(rows: dict) -> Forward:
        sub = roll.select(rows["row"])
        out = sequence_logprobs(tr.policy, sub.input_ids, sub.attention_mask,
                                temperature=t, with_entropy=True,
                                with_hidden=tr.shared_critic,
                                prompt_len=tr.shared_prompt_len(sub),
                                min_prompts=min(n_prompts, len(rows["row"])),
                                actions_from=sub.prompt_len,
                                entropy_grad=tr.cfg.ent_coef > 0, packing=tr.cfg.packing)
        v = None
        if tr.critic is not None:
            v_after = tr.critic(sub.input_ids, sub.attention_mask, sub.position_ids,
                                hidden_states=out.get("hidden"))
            v = shift_to_tokens(v_after[:, :-1])
        return Forward(out["logp"], out["entropy"], v)

    return forward
