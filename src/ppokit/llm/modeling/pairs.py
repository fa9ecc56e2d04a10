"""``(prompt, completion)`` pairs laid out as left-padded token sequences
(:func:`encode_pairs`), and the reward a one-label sequence classifier gives such a
sequence (:func:`reward_forward`): shared by SFT, DPO and the reward model's training
(:mod:`ppokit.llm.training`) and by a reward model scoring completions
(:class:`ppokit.llm.inputs.rewards.RewardModelScorer`)."""

from __future__ import annotations

import torch

from .models import backbone_of
from .positions import position_ids_from_mask
from .rollout import left_pad

__all__ = ["encode_pairs", "reward_forward"]


def encode_pairs(tokenizer, prompts: list[str], completions: list[str], *,
                 add_eos: bool = True, add_bos: bool = True):
    """``(input_ids, attention_mask, completion_mask)``, all ``[B, L]``, left padded.

    ``completion_mask`` (bool, token convention) marks the completion tokens and the EOS
    appended after them; prompt tokens and padding are 0."""
    rows, comp_lens = [], []
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    for p, c in zip(prompts, completions, strict=True):
        pi = tokenizer(p, add_special_tokens=False)["input_ids"]
        if add_bos and bos is not None and (not pi or pi[0] != bos):
            pi = [bos] + pi
        ci = tokenizer(c, add_special_tokens=False)["input_ids"]
        if add_eos:
            ci = ci + [eos]
        rows.append(pi + ci)
        comp_lens.append(len(ci))
    ids, attn = left_pad(rows, tokenizer.pad_token_id)
    width = ids.shape[1]
    cmask = torch.zeros_like(ids, dtype=torch.bool)
    for i, n in enumerate(comp_lens):
        if n:
            cmask[i, width - n:] = True
    return ids, attn, cmask


def reward_forward(model, input_ids, attention_mask) -> torch.Tensor:
    """``[B]`` rewards: the score head at the last (rightmost) position of left-padded rows."""
    pos = position_ids_from_mask(attention_mask)
    head = getattr(model, "score", None) or getattr(model, "classifier", None)
    if head is None:
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos)
        return out.logits[:, -1] if out.logits.ndim == 3 else out.logits[:, 0]
    hidden = backbone_of(model)(input_ids=input_ids, attention_mask=attention_mask,
                                position_ids=pos).last_hidden_state[:, -1]
    return head(hidden).squeeze(-1).float()
