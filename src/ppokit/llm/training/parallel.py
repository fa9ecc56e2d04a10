"""Data-parallel token training: what the ranks exchange once per iteration.

Every rank draws the same global list of prompts (the prompt RNG is seeded identically on
all ranks) and takes its own contiguous block of whole prompts, so the
``samples_per_prompt`` completions of a prompt — a group of the group estimators — are all
generated, scored and labelled on one rank. Generation, scoring (reward function or reward
model), and the frozen forward passes (old log-probs, reference log-probs, critic values)
run on the rank's own rows. Then the rollouts and these per-token labels are gathered, so
that every rank holds the whole iteration batch in the order one process would have made
it (rank 0's block first): the labels (batch whitening, REINFORCE++'s batch
normalisation, the KL statistics the adaptive controller reads) are computed from the
global batch, identically everywhere, and the update engine
(:mod:`ppokit.engine.dist`) splits each global minibatch's forward and backward passes by
row owner and sums the gradients. Per iteration a rank sends its ``[B/N, L]`` token ids,
masks and three ``[B/N, L]`` float tensors, and the ``[B/N]`` scores — a few hundred KB for
the built-in task — plus one all-reduce of the gradients per optimiser step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..agents.rollout import mean_stats
from ..labelling.batching import summed_stats
from ..modeling.rollout import TokenRollout

__all__ = ["shard", "gather_rollout", "NoRunDir"]


class NoRunDir:
    """What a rank other than 0 holds instead of the run directory: it writes nothing
    there (rank 0 holds the lock and writes metrics, samples and checkpoints)."""

    def abort(self) -> None:
        pass

    def started(self) -> None:
        pass

    def reacquire(self) -> None:
        pass

    def close(self) -> None:
        pass


def shard(items: list, rank: int, world: int) -> list:
    """Rank ``rank``'s contiguous block of ``items`` (``len(items)`` divisible by
    ``world``)."""
    k = len(items) // world
    return items[rank * k:(rank + 1) * k]


def _pad(t: torch.Tensor, left: int, right: int, value) -> torch.Tensor:
    return F.pad(t, (left, right), value=value) if (left or right) else t


def gather_rollout(dp, roll: TokenRollout, per_token: list[torch.Tensor | None],
                   per_row: list[torch.Tensor], pad_token_id: int
                   ) -> tuple[TokenRollout, list[torch.Tensor | None], list[torch.Tensor]]:
    """Every rank's rollout and labels as one global batch (rank order). Prompts are
    left-padded to the longest prompt of any rank and responses right-padded to the
    longest response, as one process generating the whole batch lays them out; padding
    is never an action and never attended to. ``per_token``: ``[b, L]`` tensors in the
    rollout's layout (``None`` stays ``None``, the same on every rank); ``per_row``:
    ``[b]`` tensors."""
    p = roll.prompt_len
    t = roll.input_ids.shape[1] - p
    sizes = dp.gather_objects((p, t))
    p_max = max(s[0] for s in sizes)
    t_max = max(s[1] for s in sizes)
    left, right = p_max - p, t_max - t

    def g(x, value):
        return dp.all_gather_rows(_pad(x, left, right, value).contiguous())

    ids = g(roll.input_ids, pad_token_id)
    attn = g(roll.attention_mask.long(), 0)
    act = g(roll.action_mask.to(torch.uint8), 0).bool()
    trunc = dp.all_gather_rows(roll.truncated.to(torch.uint8)).bool()
    responses = [r for part in dp.gather_objects(roll.response_ids) for r in part]
    out = TokenRollout(ids, attn, act, p_max, trunc, responses)
    tok = [None if x is None else g(x, 0.0) for x in per_token]
    rows = [dp.all_gather_rows(x.contiguous()) for x in per_row]
    return out, tok, rows


def gather_iteration(dp, got, per_token: list[torch.Tensor | None], comps: list,
                     pad_token_id: int, *, agent: bool):
    """The iteration's batch on every rank: ``got``'s rollout with ``per_token`` (the
    sampler's log-probs last but one, set on the gathered rollout as ``logp``; see
    :func:`gather_rollout`), its scores, prompts, ``comps`` (the completions' texts) and
    per-function scores in rank order; ``got.stats`` becomes the ranks' means (an agent's
    episodes) or sums (the sampler's counts). Returns ``(roll, per_token, scores,
    prompts, comps, per_func)``."""
    roll, tok, (scores,) = gather_rollout(dp, got.roll, per_token, [got.scores],
                                          pad_token_id)
    roll.logp = tok[-2]
    prompts = [p for part in dp.gather_objects(got.prompts) for p in part]
    comps = [c for part in dp.gather_objects(comps) for c in part]
    per_func = {k: dp.all_gather_rows(v.contiguous()) for k, v in sorted(got.per_func.items())}
    parts = dp.gather_objects(got.stats)
    got.stats = mean_stats(parts) if agent else summed_stats(parts)
    return roll, tok, scores, prompts, comps, per_func
