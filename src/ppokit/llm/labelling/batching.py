"""One iteration's batch of scored completions, with DAPO's dynamic sampling.

A group estimator gives every completion of a group whose scores are all equal the
advantage 0: such a group costs its generation and its share of the update and teaches
nothing. Dynamic sampling (``dynamic_sampling``) drops these groups and draws more prompts,
round after round, until the batch holds as many groups with a spread as it should, or
``dynamic_sampling_rounds`` rounds were generated; a batch still short then is filled with
dropped groups (advantage 0 each), so that every iteration's batch has the configured size
and the update its configured minibatches. The groups are taken in the order they were
generated; each group stays whole.

With several ranks each rank fills its own share of the batch from its own block of the
prompts, and the ranks generate the same number of rounds (a round is taken while any rank
is short), so that the prompt stream stays the same on all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..modeling.rollout import TokenRollout, concat_rollouts

__all__ = ["IterationBatch", "collect_batch", "spread_groups", "summed_stats"]


@dataclass
class IterationBatch:
    """This rank's rows (one per completion), their rollout, completions and scores."""

    rows: list
    prompts: list  # the rows' rendered texts
    roll: TokenRollout
    completions: list
    scores: torch.Tensor  # [B]
    per_func: dict  # name -> [B]
    time_scoring: float  # seconds spent scoring, within the collection
    stats: dict = field(default_factory=dict)
    turn_rewards: torch.Tensor | None = None  # [B, L] an agent run's rewards per turn


def spread_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[B / group_size]`` bool: the groups of consecutive rows whose scores are not all
    equal (NaN counts as unequal to everything)."""
    g = scores.reshape(-1, group_size)
    return ~(g == g[:, :1]).all(1)


def collect_batch(draw: Callable[[], list], generate: Callable[[list], TokenRollout],
                  score: Callable[[list, TokenRollout], tuple], *, group_size: int,
                  dynamic: bool, max_rounds: int, any_rank: Callable[[bool], bool],
                  pad_token_id: int, render: Callable[[dict], str] = str,
                  first: TokenRollout | None = None) -> IterationBatch:
    """Draw rows (``draw()``: this rank's rows, each prompt repeated ``group_size``
    times), render each once (``render(row)``), generate (``generate(prompts)``;
    ``first``: the first round's rollout, made elsewhere) and score them
    (``score(rows, roll) -> (completions, [B] scores, {name: [B]})``). Without ``dynamic``:
    one round. With it: rounds of :func:`spread_groups` filtering as the module describes;
    ``any_rank(flag)``: ``flag`` on any rank.

    Statistics (with ``dynamic``): ``dynamic_rounds``, ``dynamic_dropped_groups`` (groups
    of equal scores drawn, over the rounds), ``dynamic_filled_groups`` (dropped groups put
    back to fill a short batch) and ``dynamic_generated`` (completions generated)."""
    t_score = 0.0
    parts: list = []  # (rows, roll, completions, scores, per_func) of each round
    kept: list = []   # (round, group) with a spread, in generation order
    spare: list = []  # (round, group) without
    need = None
    rounds = 0
    while True:
        rows = draw()
        if need is None:
            need = len(rows) // group_size
        texts = {id(r): render(r) for r in rows}  # a group's rows are one object
        prompts = [texts[id(r)] for r in rows]
        roll = first if (first is not None and rounds == 0) else generate(prompts)
        t = time.perf_counter()
        comps, scores, per = score(rows, roll)
        t_score += time.perf_counter() - t
        parts.append((rows, roll, comps, scores, per, prompts))
        if not dynamic:
            return IterationBatch(rows, prompts, roll, comps, scores, per, t_score)
        spread = spread_groups(scores, group_size)
        for g, ok in enumerate(spread.tolist()):
            (kept if ok else spare).append((rounds, g))
        rounds += 1
        if rounds >= max_rounds or not any_rank(len(kept) < need):
            break
    chosen = kept[:need]
    filled = max(0, need - len(chosen))
    chosen += spare[:filled]
    chosen.sort()  # generation order: earlier rounds first, each round's groups in order
    starts, offset = [], 0
    for p in parts:
        starts.append(offset)
        offset += len(p[0])
    idx = torch.tensor([starts[r] + g * group_size + k for r, g in chosen
                        for k in range(group_size)], dtype=torch.long)
    roll = concat_rollouts([p[1] for p in parts], pad_token_id).select(idx).trimmed()
    all_rows = [x for p in parts for x in p[0]]
    all_comps = [c for p in parts for c in p[2]]
    all_prompts = [x for p in parts for x in p[5]]
    scores = torch.cat([p[3] for p in parts])[idx]
    names = parts[0][4].keys()
    per = {k: torch.cat([p[4][k] for p in parts])[idx] for k in names}
    stats = {"dynamic_rounds": rounds, "dynamic_dropped_groups": len(spare),
             "dynamic_filled_groups": filled, "dynamic_generated": offset}
    keep = idx.tolist()
    return IterationBatch([all_rows[i] for i in keep], [all_prompts[i] for i in keep], roll,
                          [all_comps[i] for i in keep], scores, per, t_score, stats)


def summed_stats(parts: list[dict]) -> dict:
    """Every rank's dynamic-sampling counts summed (``dynamic_rounds``: the same on
    every rank)."""
    if not parts or not parts[0]:
        return {}
    return {k: (parts[0][k] if k == "dynamic_rounds" else sum(p[k] for p in parts))
            for k in parts[0]}
