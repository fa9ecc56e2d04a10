"""Token rollouts: batched sampling with left padding, and the forward passes that score them.

Layout ``[B, L]`` with ``L = P + T``: P prompt positions (left padded) then T generated
positions (right padded after EOS). Per-position tensors use the *token* convention:
``logp[:, t]`` is the log-probability of token ``t`` given tokens ``< t``, and
``values[:, t]`` the critic's value of the state just before token ``t`` (computed from the
hidden state at ``t − 1``). Column 0 is never an action and holds 0.

``action_mask[b, t] = 1`` exactly for generated tokens up to and including the first EOS;
prompt tokens and padding are never actions. A row whose generation reached
``max_new_tokens`` without EOS is *truncated*.

Sampling is plain: softmax of ``logits / temperature`` (no top-k/top-p); ``temperature = 0``
is greedy (evaluation only). Old log-probs are never taken from the sampling loop: the
trainer recomputes them with :func:`sequence_logprobs`, a separate forward pass.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "TokenRollout",
    "encode_prompts",
    "position_ids_from_mask",
    "generate",
    "sequence_logprobs",
    "shift_to_tokens",
]


@dataclass
class TokenRollout:
    """One batch of sampled sequences (all ``[B, L]`` unless noted)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor  # long 0/1: real tokens (prompt and generated, incl. EOS)
    action_mask: torch.Tensor     # bool: generated tokens up to and including EOS
    prompt_len: int               # P
    truncated: torch.Tensor       # [B] bool: no EOS within max_new_tokens
    response_ids: list            # [B] lists of generated token ids (EOS excluded)

    @property
    def position_ids(self) -> torch.Tensor:
        return position_ids_from_mask(self.attention_mask)

    @property
    def lengths(self) -> torch.Tensor:
        """[B] number of action tokens (EOS included)."""
        return self.action_mask.sum(1)

    def last_action_index(self) -> torch.Tensor:
        """[B] column of each row's last action token (the EOS when there is one)."""
        pos = torch.arange(self.action_mask.shape[1])
        return torch.where(self.action_mask, pos, torch.full_like(pos, -1)).amax(1)

    def select(self, idx: torch.Tensor) -> TokenRollout:
        return TokenRollout(self.input_ids[idx], self.attention_mask[idx], self.action_mask[idx],
                       self.prompt_len, self.truncated[idx],
                       [self.response_ids[i] for i in idx.tolist()])


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, so left padding does not shift them."""
    return (attention_mask.long().cumsum(1) - 1).clamp(min=0)


def encode_prompts(tokenizer, prompts: list[str], add_bos: bool = True):
    """Left-padded ``(input_ids, attention_mask)`` for a list of prompt strings.

    A BOS token is prepended when the tokenizer has one and ``add_bos`` is set (and the
    tokenizer did not already add it)."""
    rows = []
    for p in prompts:
        ids = tokenizer(p, add_special_tokens=False)["input_ids"]
        bos = tokenizer.bos_token_id
        if add_bos and bos is not None and (not ids or ids[0] != bos):
            ids = [bos] + ids
        if not ids:
            raise ValueError(f"prompts: prompt {p!r} encodes to no tokens")
        rows.append(ids)
    return left_pad(rows, tokenizer.pad_token_id)


def left_pad(rows: list[list[int]], pad_id: int):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids, mask


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *,
             max_new_tokens: int, eos_token_id: int, pad_token_id: int,
             temperature: float = 1.0, generator: torch.Generator | None = None,
             all_done=None) -> TokenRollout:
    """Sample completions with a KV cache; stop each row at EOS or ``max_new_tokens``.
    ``all_done(flag) -> bool`` (sharded models, :mod:`ppokit.llm.fsdp`): whether every
    rank's rows have finished; the loop runs until they have, so that every rank makes
    the same number of forward passes (finished rows only receive padding)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected an integer >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature: expected a number >= 0, got {temperature}")
    was_training = model.training
    model.eval()
    bsz = prompt_ids.shape[0]
    attn = prompt_mask.long()
    pos = position_ids_from_mask(attn)
    cache_kw = _cache_keyword(model)
    out = model(input_ids=prompt_ids, attention_mask=attn, position_ids=pos, use_cache=True)
    cache = _cache_of(out)
    logits = out.logits[:, -1, :]
    next_pos = pos[:, -1] + 1
    finished = torch.zeros(bsz, dtype=torch.bool)
    toks, alive_cols = [], []
    for step in range(max_new_tokens):
        logits = logits.float()
        if temperature == 0:
            tok = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        alive = ~finished
        tok = torch.where(alive, tok, torch.full_like(tok, pad_token_id))
        toks.append(tok)
        alive_cols.append(alive)
        finished = finished | (tok == eos_token_id)
        done = bool(finished.all())
        if all_done is not None:
            done = all_done(done)
        if done or step == max_new_tokens - 1:
            break
        attn = torch.cat([attn, alive.long()[:, None]], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None],
                    use_cache=True, **{cache_kw: cache})
        cache = _cache_of(out)
        logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
    if was_training:
        model.train()
    gen = torch.stack(toks, 1)
    gen_mask = torch.stack(alive_cols, 1)
    seq = torch.cat([prompt_ids, gen], 1)
    attention_mask = torch.cat([prompt_mask.long(), gen_mask.long()], 1)
    action_mask = torch.cat([torch.zeros_like(prompt_mask, dtype=torch.bool), gen_mask], 1)
    has_eos = ((gen == eos_token_id) & gen_mask).any(1)
    responses = []
    for b in range(bsz):
        ids = gen[b][gen_mask[b]].tolist()
        if ids and ids[-1] == eos_token_id:
            ids = ids[:-1]
        responses.append(ids)
    return TokenRollout(seq, attention_mask, action_mask, prompt_ids.shape[1], ~has_eos, responses)


def _cache_keyword(model) -> str:
    """transformers 5 names the KV-cache argument ``cache`` (older: ``past_key_values``)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    params = inspect.signature(inner.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(out):
    cache = out.get("cache") if hasattr(out, "get") else None
    return cache if cache is not None else out.past_key_values


def shift_to_tokens(per_position: torch.Tensor) -> torch.Tensor:
    """``[B, L-1]`` quantities about token ``t+1`` → ``[B, L]`` token convention
    (column 0 = 0)."""
    return F.pad(per_position, (1, 0))


def sequence_logprobs(model, input_ids, attention_mask, *, temperature: float = 1.0,
                      with_entropy: bool = False, with_hidden: bool = False):
    """Log-probs ``[B, L]`` of each token under ``model`` (token convention), from one
    forward pass with position ids counted over real tokens. Optionally the entropy
    ``[B, L]`` of the distribution each token was drawn from, and the last hidden states.
    ``temperature`` divides the logits as the sampler did (0 or 1: no scaling)."""
    pos = position_ids_from_mask(attention_mask)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos,
                output_hidden_states=with_hidden)
    logits = out.logits[:, :-1, :].float()
    if temperature not in (0, 1):
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    lp = shift_to_tokens(logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1))
    res = {"logp": lp}
    if with_entropy:
        ent = -(logp_all.exp() * logp_all).sum(-1)
        res["entropy"] = shift_to_tokens(ent)
    if with_hidden:
        res["hidden"] = out.hidden_states[-1]
    return res
