"""Multi-turn episodes, played in a batch and laid out as one token rollout.

Every active episode's context (its segments so far: :mod:`.conversation`) is sampled
from in one batch per turn; the model's turn goes to the tools when it calls one (their
replies come back as ``tool`` messages, reward 0) and to the environment otherwise. An
episode ends when the environment says terminated or truncated, after ``max_turns``
model turns, when the next turn would not fit the model's context, or when the
environment's reply does not fit it (all three truncated; :mod:`.bounds`).

The episodes of a batch are then one :class:`~ppokit.llm.modeling.rollout.TokenRollout`:
first prompts left-padded to a common width ``P``, everything after them right-padded;
``action_mask`` marks the model's own tokens (trained), the environment's and tools'
tokens are context only; ``logp`` holds the sampler's log-probs of the model's tokens;
``truncated`` the episodes that were cut (their returns bootstrap from the critic);
and ``turn_rewards`` ``[B, L]`` each turn's reward on the turn's last token.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..modeling.rollout import TokenRollout
from .bounds import first_episode, respond, tool_replies
from .conversation import Episode, Renderer, pad_left
from .env import CheckedTextEnv
from .tools import ToolSet

__all__ = ["play", "to_rollout", "EpisodeBatch", "episode_stats", "mean_stats", "solved"]


def play(envs: list[CheckedTextEnv], seeds: list[int], renderer: Renderer,
         sample: Callable[[torch.Tensor, torch.Tensor], TokenRollout], *, max_turns: int,
         max_new_tokens: int, context: int, tools: ToolSet | None = None) -> list[Episode]:
    """Play one episode in each of ``envs`` (reset with the matching seed), sampling each
    turn of every active episode in one batch: ``sample(ids, mask)`` samples a turn for
    left-padded contexts (its rollout's ``logp`` holds the sampler's log-probs)."""
    tok = renderer.tok
    eps = [first_episode(env, renderer, seed, context=context, reserve=max_new_tokens)
           for env, seed in zip(envs, seeds)]
    for turn in range(max_turns):
        active = [i for i, ep in enumerate(eps) if not ep.done]
        for i in list(active):
            if len(eps[i].ids) + max_new_tokens > context:
                eps[i].done = eps[i].truncated = True
                active.remove(i)
        if not active:
            break
        ids, mask = pad_left([eps[i].ids for i in active], tok.pad_token_id)
        roll = sample(ids, mask)
        width = ids.shape[1]
        texts, turns = {}, {}
        for j, i in enumerate(active):
            ep = eps[i]
            am = roll.action_mask[j, width:]
            toks = roll.input_ids[j, width:][am].tolist()
            logp = roll.logp[j, width:][am].tolist()
            texts[i] = tok.decode(toks, skip_special_tokens=True)
            ep.add(toks, action=True, logp=logp)
            ep.turn_ends.append(len(ep.ids) - 1)
            calls = tools.calls(texts[i]) if tools is not None else []
            if calls:
                turns[i] = (ep, calls)
        replies = (tool_replies(tools, turns, renderer, context=context,
                                reserve=max_new_tokens) if turns else {})
        for j, i in enumerate(active):
            respond(eps[i], envs[i], texts[i], renderer, replies.get(i), context=context,
                    ended=not bool(roll.truncated[j]), last=turn == max_turns - 1)
    return eps


@dataclass
class EpisodeBatch:
    """A batch of episodes as the token trainer's labels read them."""

    roll: TokenRollout
    turn_rewards: torch.Tensor  # [B, L]
    scores: torch.Tensor        # [B] each episode's return (undiscounted)
    episodes: list[Episode]


def to_rollout(eps: list[Episode], pad: int) -> EpisodeBatch:
    """The episodes as one rollout (module doc)."""
    P = max(ep.prompt_len for ep in eps)
    T = max(len(ep.ids) - ep.prompt_len for ep in eps)
    B, L = len(eps), P + T
    ids = torch.full((B, L), pad, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    act = torch.zeros((B, L), dtype=torch.bool)
    logp = torch.zeros((B, L))
    rew = torch.zeros((B, L))
    for b, ep in enumerate(eps):
        start = P - ep.prompt_len  # where the episode's first token goes
        n = len(ep.ids)
        ids[b, start:start + n] = torch.tensor(ep.ids)
        attn[b, start:start + n] = 1
        act[b, start:start + n] = torch.tensor(ep.action)
        logp[b, start:start + n] = torch.tensor(ep.logp)
        for k, r in zip(ep.turn_ends, ep.rewards):
            rew[b, start + k] = r
    truncated = torch.tensor([ep.truncated for ep in eps])
    response = [ep.ids[ep.prompt_len:] for ep in eps]
    roll = TokenRollout(ids, attn, act, P, truncated, response, logp)
    scores = torch.tensor([ep.score for ep in eps], dtype=torch.float32)
    return EpisodeBatch(roll, rew, scores, eps)


def episode_stats(eps: list[Episode]) -> dict:
    """``episode/...``, ``env/...`` and ``tool/...`` metrics of a batch of episodes (the
    ``tool/..._frac`` ones: fractions of the batch's calls, 0 without calls)."""
    n = len(eps)
    calls = sum(ep.tool_calls for ep in eps)
    won = [ep for ep in eps if solved(ep)]
    out = {"episode/turns_mean": statistics.fmean(ep.turns for ep in eps),
           "episode/tokens_mean": statistics.fmean(len(ep.ids) - ep.prompt_len for ep in eps),
           "episode/return_mean": statistics.fmean(ep.score for ep in eps),
           "episode/terminated_frac": sum(ep.terminated for ep in eps) / n,
           "episode/truncated_frac": sum(ep.truncated for ep in eps) / n,
           "episode/solved_frac": len(won) / n,
           "env/obs_truncated_frac": sum(ep.obs_truncated for ep in eps) / n,
           "tool/calls_per_episode": calls / n,
           "tool/failed_per_episode": sum(ep.tool_failures for ep in eps) / n}
    for key, attr in (("error", "tool_errors"), ("timeout", "tool_timeouts"),
                      ("truncated", "tool_cut")):
        out[f"tool/{key}_frac"] = sum(getattr(ep, attr) for ep in eps) / calls if calls else 0.0
    if won:
        out["episode/turns_solved_mean"] = statistics.fmean(ep.turns for ep in won)
    return out


def solved(ep: Episode) -> bool:
    """An episode that reached its end (terminated) with a positive return."""
    return ep.terminated and ep.score > 0


def mean_stats(parts: list[dict]) -> dict:
    """Every rank's :func:`episode_stats` as one (ranks play equally many episodes; a
    mean that one rank lacks, such as the turns of solved episodes, is over the others)."""
    keys = sorted({k for p in parts for k in p})
    return {k: statistics.fmean(p[k] for p in parts if k in p) for k in keys}
