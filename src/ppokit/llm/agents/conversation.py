"""A multi-turn episode as token ids: exactly the tokens the policy saw, in order.

An episode is a sequence of segments: the first observation rendered as the prompt, then
alternately the model's sampled tokens (kept as sampled, their end-of-sequence token
included: these are the actions, trained) and the environment's reply rendered as
context (mask 0: never trained, never scored). The next turn is sampled from the
concatenation of every segment so far, so the training forward over the whole episode
sees the very context each token was sampled in.

Rendering. With a chat template (``tokenizer.chat_template``) a reply is the text the
template adds for it: the template rendered over the conversation with the reply and the
generation prompt, less the conversation as far as the assistant's message (and its end
marker, which the sampled tokens already hold, or which this segment supplies when the
turn was cut at ``max_new_tokens``). Without a template (the built-in model) the plain
format: message contents one after the other as they are (the environment's text carries
its own cues), a tool's reply as ``=REPLY:``, the model's turns closed by its
end-of-sequence token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["Renderer", "Episode"]


@dataclass
class Episode:
    """One episode's segments and what happened in it."""

    seed: int
    messages: list[dict]              # the conversation as text (for logs and tools)
    ids: list[int] = field(default_factory=list)
    action: list[bool] = field(default_factory=list)   # per token: a sampled token
    logp: list[float] = field(default_factory=list)    # per token: sampler log-prob (0 else)
    turn_ends: list[int] = field(default_factory=list)  # index of each turn's last token
    rewards: list[float] = field(default_factory=list)  # per turn
    prompt_len: int = 0
    terminated: bool = False
    truncated: bool = False
    done: bool = False
    tool_calls: int = 0
    tool_failures: int = 0  # calls not answered by the tool (any reason)
    tool_errors: int = 0    # ... because the tool raised, returned nothing showable, died
    tool_timeouts: int = 0  # ... because it overran its time limit
    tool_cut: int = 0       # replies cut to fit the context
    obs_truncated: bool = False  # ended because the environment's reply did not fit
    info: dict = field(default_factory=dict)  # what else the environment reported

    def add(self, ids: list[int], action: bool, logp: list[float] | None = None) -> None:
        self.ids += ids
        self.action += [action] * len(ids)
        self.logp += logp if logp is not None else [0.0] * len(ids)

    @property
    def turns(self) -> int:
        return len(self.turn_ends)

    @property
    def score(self) -> float:
        return float(sum(self.rewards))


class Renderer:
    """Token ids of the prompt and of each environment reply (module doc)."""

    def __init__(self, tokenizer, tools: list[dict] | None = None):
        self.tok = tokenizer
        self.tools = tools or None
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        self.eos_text = tokenizer.decode([tokenizer.eos_token_id])

    def _template(self, messages: list[dict], generation: bool) -> str:
        kw = {"tools": self.tools} if self.tools else {}
        return self.tok.apply_chat_template(messages, tokenize=False,
                                            add_generation_prompt=generation, **kw)

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def prompt(self, messages: list[dict]) -> list[int]:
        """The first observation as the first prompt (a BOS first where the tokenizer has
        one and the template does not write it)."""
        if self.chat:
            text = self._template(messages, generation=True)
        else:
            text = "".join(_plain(m) for m in messages)
        ids = self.encode(text)
        bos = self.tok.bos_token_id
        if bos is not None and (not ids or ids[0] != bos) and not self.chat:
            ids = [bos] + ids
        return ids

    def reply(self, before: list[dict], assistant: str, reply: list[dict], ended: bool
              ) -> list[int]:
        """The tokens that follow the model's turn ``assistant`` (after the conversation
        ``before``) when the environment answers with ``reply``: its end marker if the
        turn was cut (``ended`` False: no end-of-sequence token sampled), then the reply
        and the cue for the next turn."""
        close = [] if ended else [self.tok.eos_token_id]
        if not self.chat:
            return close + self.encode("".join(_plain(m) for m in reply))
        turn = before + [{"role": "assistant", "content": assistant}]
        upto = self._template(turn, generation=False)
        full = self._template(turn + reply, generation=True)
        if not full.startswith(upto):  # a template that rewrites earlier turns
            return close + self.encode(self._template(reply, generation=True))
        # the assistant's content and end marker are already in the sampled tokens
        at = upto.rfind(assistant) if assistant else len(upto)
        if at < 0:  # a template that rewrites the content (trims it)
            return close + self.encode(self._template(reply, generation=True))
        cut = at + len(assistant)
        tail = upto[cut:]
        if tail.startswith(self.eos_text):
            cut += len(self.eos_text)
        return close + self.encode(full[cut:])


def _plain(message: dict) -> str:
    return f"={message['content']}:" if message["role"] == "tool" else message["content"]


def pad_left(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)`` of ``rows`` left-padded to the longest."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = 1
    return ids, mask
