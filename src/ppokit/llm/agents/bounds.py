"""Every episode fits the model's context: the first prompt, the environment's replies
and the tools' replies are measured before they join the episode.

A text is first measured in characters, before any tokenising: more than
:data:`CHARS_PER_TOKEN` characters for each token of room cannot fit (no tokenizer of a
language model averages that many), so it is refused or cut without being tokenised —
a multi-megabyte observation or tool reply costs no more than its own string. What
passes is tokenised and measured again in tokens. Then:

* **the first prompt** (``reset()``'s observation through the chat template) must leave
  ``max_new_tokens`` for the model's first turn; one that does not is an error naming the
  environment, its length and the context (the run stops before any model work on it);
* **an environment's reply** (``step()``'s observation) that does not fit in the context
  left is not added: the episode ends there, truncated (its return bootstraps from the
  critic after the model's last token), counted in ``env/obs_truncated_frac``. A reply
  that fits but leaves no room for another turn is added and the episode is truncated
  after it (the critic's value is then read after the reply: docs/agents.md);
* **a tool's reply** is cut to fit: the turn's calls share half the room left (the
  context less the episode so far and the next turn's ``max_new_tokens``); a reply cut
  ends with ``…[cut: N chars]``, which the model reads, and counts in
  ``tool/truncated_frac``.
"""

from __future__ import annotations

from typing import Any

from ppokit.errors import UserCodeError

from .conversation import Episode, Renderer
from .env import CheckedTextEnv
from .tools import ToolReply, ToolSet

__all__ = ["CHARS_PER_TOKEN", "first_episode", "respond", "tool_replies", "fit_tokens"]

CHARS_PER_TOKEN = 16  # characters a token of room admits before any tokenising


def _chars(messages: list[dict]) -> int:
    return sum(len(m["content"]) for m in messages)


def first_episode(env: CheckedTextEnv, renderer: Renderer, seed: int, *, context: int,
                  reserve: int) -> Episode:
    """The episode of ``env`` reset with ``seed``: its first prompt, which must leave
    ``reserve`` tokens of ``context`` for the model's turn (else a one-line error)."""
    msgs, _ = env.reset(seed=seed)
    room = context - reserve
    where = f"env {env.label}: reset(seed={seed})"
    chars = _chars(msgs)
    if chars > room * CHARS_PER_TOKEN:
        raise UserCodeError(f"{where}: the observation is {chars:,} characters, more than "
                            f"the model's context of {context:,} tokens can hold "
                            f"({room:,} tokens once the model's turn of {reserve:,} is "
                            f"kept free)")
    ep = Episode(seed=seed, messages=list(msgs))
    ep.add(renderer.prompt(msgs), action=False)
    ep.prompt_len = len(ep.ids)
    if ep.prompt_len > room:
        raise UserCodeError(f"{where}: the first prompt is {ep.prompt_len:,} tokens; the "
                            f"model's context is {context:,} tokens and its turn needs "
                            f"{reserve:,} of them")
    return ep


def fit_tokens(renderer: Renderer, reply: ToolReply, budget: int) -> str:
    """``reply`` as the model reads it, cut (the marker included) to at most ``budget``
    tokens where the tokenizer allows (the marker alone may be longer): the characters
    kept scaled by the tokens over, a few tokenisings at most."""
    text = reply.shown()
    n = len(renderer.encode(text))
    if n <= budget:
        return text
    marker = len(renderer.encode(reply.shown(0)))
    keep = len(reply.body)
    for _ in range(8):
        keep = min(keep - 1, keep * max(budget - marker, 0) // max(n - marker, 1))
        if keep <= 0:
            break
        text = reply.shown(keep)
        n = len(renderer.encode(text))
        if n <= budget:
            return text
    return reply.shown(0)


def tool_replies(tools: ToolSet, turns: dict[Any, tuple[Episode, list]],
                 renderer: Renderer, *, context: int, reserve: int) -> dict[Any, list[dict]]:
    """The ``tool`` messages answering each episode's ``calls`` (``turns``: key ->
    ``(episode, calls)``), all answered together (the worker pool overlaps them), each
    reply cut to its share of its episode's room (module doc); the tool counts updated."""
    jobs, budgets = [], []
    for ep, calls in turns.values():
        budget = max(0, context - len(ep.ids) - reserve) // (2 * len(calls))
        jobs += calls
        budgets += [budget] * len(calls)
    replies = iter(zip(tools.answer(jobs, [b * CHARS_PER_TOKEN for b in budgets]), budgets))
    out = {}
    for key, (ep, calls) in turns.items():
        out[key] = []
        for reply, budget in (next(replies) for _ in calls):
            text = fit_tokens(renderer, reply, budget)
            ep.tool_calls += 1
            ep.tool_failures += not reply.ok
            ep.tool_errors += reply.status == "error"
            ep.tool_timeouts += reply.status == "timeout"
            ep.tool_cut += text != reply.shown() or reply.cut
            out[key].append({"role": "tool", "content": text})
    return out


def _add_reply(ep: Episode, renderer: Renderer, text: str, reply: list[dict], ended: bool,
               context: int) -> bool:
    """Add the reply's tokens to ``ep`` if they fit in ``context`` (measured in
    characters first); whether they did."""
    left = context - len(ep.ids)
    if _chars(reply) > left * CHARS_PER_TOKEN:
        return False
    seg = renderer.reply(ep.messages, text, reply, ended=ended)
    if len(seg) > left:
        return False
    ep.messages += [{"role": "assistant", "content": text}, *reply]
    ep.add(seg, action=False)
    return True


def respond(ep: Episode, env: CheckedTextEnv, text: str, renderer: Renderer,
            reply: list[dict] | None, *, context: int, ended: bool = True,
            last: bool = False) -> None:
    """Answer the model's turn ``text`` (already in ``ep``): with the tools' ``reply``
    when it called tools (:func:`tool_replies`), else with the environment's step; the
    reply is added unless the episode ends (the environment says so, it was the
    ``last`` turn, or the reply does not fit: module doc)."""
    from_tools = reply is not None
    if from_tools:
        ep.rewards.append(0.0)
    else:
        reply, reward, term, trunc, _ = env.step(text)
        ep.rewards.append(reward)
        if term or trunc:
            ep.done, ep.terminated, ep.truncated = True, term, trunc and not term
            return
    if last:
        ep.done = ep.truncated = True
    elif not _add_reply(ep, renderer, text, reply, ended, context):
        ep.done = ep.truncated = True
        ep.obs_truncated = not from_tools
