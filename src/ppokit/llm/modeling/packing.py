"""Sequence packing in the trainer's log-prob passes: a batch's completions of different
lengths computed without their padding.

A rollout's rows are right padded to its longest completion, and the padded forward
computes every padding position as if it were a token — projections, MLPs, the output
head over the whole vocabulary and its log-softmax. With packing, the fused forward
(:mod:`ppokit.llm.modeling.fused`, its ``_Layout`` with ``pack``) lays out each row's real
tokens only, one row after another, for everything but attention; attention scatters them
back to their rows (padding zero and masked), so that every sequence attends to its own
prompt and earlier tokens only, and gathers the outputs again. The output head and the
log-softmax then run on the positions that predict a real token only, and the log-probs
are scattered into the usual ``[B, L]`` token layout (0 where a column's token follows
padding, a position nothing reads).

It changes how, not what: ``tests/test_llm_packing.py`` holds the packed log-probs and the
gradients of a loss on them to the padded pass's on random batches (random lengths,
length 1 and all-equal included) in float32 and under bfloat16 autocast.

Where it applies (the ``packing`` setting): only where the fused forward runs (Llama and
Qwen2 models it covers) and no hidden states are wanted (a critic sharing the policy's
body). transformers' forward keeps its padding: its packed form (position ids restarting
per sequence) keeps sequences apart only with flash-attention kernels, which CPU builds of
torch do not have — ``packing = "on"`` there runs the padded pass, with the same results.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ppokit.settings import setting

from .fused_layers import output_head

__all__ = ["PACKING", "PackingSettings", "packed_head", "packed_logprobs", "wants_packing"]

PACKING = ("auto", "on", "off")
# "auto" packs when at most this share of the positions after the prompt are real tokens
# (docs/performance.md, "Sequence packing": on the 10M bench model packing was faster at
# 72 % real, about even at 95 %)
AUTO_REAL_SHARE = 0.85


@dataclass(frozen=True)
class PackingSettings:
    """How the trainer's forward lays out completions of different lengths
    (docs/performance.md, "Sequence packing")."""

    packing: str = setting("auto", "sequence packing in the update's and the scoring passes' "
                           "forward: on (each completion's real tokens only, attention kept "
                           "within each sequence; where the fused forward runs — Llama and "
                           "Qwen2 — else the padded pass) | off (every row padded to the "
                           "longest) | auto (on when padding is at least 15 % of the "
                           "completions' positions)", choices=PACKING)


def wants_packing(setting_value, attention_mask: torch.Tensor, prompt_len: int | None) -> bool:
    """Whether the ``packing`` setting packs this batch (``"auto"``: by its share of
    padding after the prompt)."""
    if setting_value in (True, "on"):
        return True
    if setting_value in (None, False, "off"):
        return False
    tail = attention_mask[:, prompt_len or 0:]
    return tail.numel() > 0 and float(tail.float().mean()) <= AUTO_REAL_SHARE


def packed_head(model, h, lay, mask, k: int, act):
    """The output head of a packed layout's positions ``k`` .. ``L − 2`` that hold a real
    token → ``(logits [N, V], rows [N], cols [N])``: the prompts' positions (as many
    columns as are read, per row, its padding left out) then the rows' packed tokens."""
    B, T, p = lay.B, lay.T, lay.p
    L = p + T
    dev = h.device
    idx = lay.packed
    rows, cols = idx // T, idx % T + p
    keep = (cols >= k) & (cols <= L - 2)
    tail = h[lay.nr + lay.nh:][keep]
    rows, cols = rows[keep], cols[keep]
    if not lay.U or k >= p:
        return output_head(model, tail, act), rows, cols
    width = p - k
    prompts = h[lay.nr:lay.nr + lay.nh].view(lay.U, lay.hp, -1)[:, k - lay.off:]
    p_rows = torch.arange(B, device=dev).repeat_interleave(width)
    p_cols = k + torch.arange(width, device=dev).repeat(B)
    real = mask[p_rows, p_cols].bool()
    # the head once per distinct prompt, then each row's real columns
    p_logits = output_head(model, prompts, act)[lay.inv].reshape(B * width, -1)[real]
    return (torch.cat([p_logits, output_head(model, tail, act)]),
            torch.cat([p_rows[real], rows]), torch.cat([p_cols[real], cols]))


def packed_logprobs(packed, input_ids, temperature: float, with_entropy: bool,
                    entropy_grad: bool) -> dict:
    """:func:`ppokit.llm.modeling.rollout.sequence_logprobs`'s result from
    :func:`packed_head`'s logits: each position's log-prob of the token after it (and the
    entropy of its distribution), at that token's column of a ``[B, L]`` zero tensor."""
    logits, rows, cols = packed
    logits = logits.float()
    if temperature not in (0, 1):
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    cols = cols + 1
    vals = logp_all.gather(-1, input_ids[rows, cols][:, None]).squeeze(-1)
    shape = input_ids.shape
    res = {"logp": vals.new_zeros(shape).index_put((rows, cols), vals)}
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = -(logp_all.exp() * logp_all).sum(-1)
            res["entropy"] = ent.new_zeros(shape).index_put((rows, cols), ent)
    return res
