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
is greedy (evaluation only). The sampler also returns the log-probability of every token it
drew (``TokenRollout.logp``, computed from the very logits it sampled from): these are the
behaviour policy's log-probs, and the trainer uses them as PPO's old log-probs instead of a
second forward pass over the batch (``old_logprobs = "sampler"``; ``"recompute"`` runs
:func:`sequence_logprobs` as before). The two agree to float rounding — the cached
incremental forward adds the same terms in a different order — which
``tests/test_llm_shared_prompts.py`` checks on random models, prompts and padding.

For Llama and Qwen2 models both the sampler and the log-prob passes run ppokit's fused
forward (:mod:`ppokit.llm.modeling.fused`, held to transformers' in ``tests/test_llm_fused.py``);
other models run transformers' forward as described here.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .packing import packed_logprobs, wants_packing
from .positions import distinct_prompts, position_ids_from_mask

__all__ = [
    "TokenRollout",
    "encode_prompts",
    "position_ids_from_mask",
    "generate",
    "sequence_logprobs",
    "shift_to_tokens",
    "concat_rollouts",
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
    logp: torch.Tensor | None = None  # float [B, L]: the sampler's log-prob of each action
                                      # token (token convention; 0 elsewhere)

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

    def last_token_index(self) -> torch.Tensor:
        """[B] column of each row's last attended token (after its last action token
        where context follows it: an agent episode cut with the environment's reply in)."""
        pos = torch.arange(self.attention_mask.shape[1])
        return torch.where(self.attention_mask.bool(), pos, torch.full_like(pos, -1)).amax(1)

    def select(self, idx: torch.Tensor) -> TokenRollout:
        return TokenRollout(self.input_ids[idx], self.attention_mask[idx], self.action_mask[idx],
                       self.prompt_len, self.truncated[idx],
                       [self.response_ids[i] for i in idx.tolist()],
                       None if self.logp is None else self.logp[idx])

    def trimmed(self) -> TokenRollout:
        """The same rows without the columns no row attends to (prompt padding left of the
        longest prompt, response padding right of the longest response), as a rollout of
        just these rows would have been laid out."""
        used = self.attention_mask.bool().any(0)
        if bool(used.all()) or not bool(used.any()):
            return self
        cols = torch.nonzero(used).squeeze(1)
        first = min(int(cols[0]), self.prompt_len)
        last = max(int(cols[-1]) + 1, self.prompt_len)
        sl = slice(first, last)
        return TokenRollout(self.input_ids[:, sl], self.attention_mask[:, sl],
                            self.action_mask[:, sl], self.prompt_len - first, self.truncated,
                            self.response_ids, None if self.logp is None else self.logp[:, sl])


def concat_rollouts(rolls: list[TokenRollout], pad_token_id: int) -> TokenRollout:
    """The rows of ``rolls`` as one rollout: prompts left-padded to the longest prompt,
    responses right-padded to the longest response (padding is never attended to and never
    an action); the sampler's log-probs are kept when every part has them."""
    if len(rolls) == 1:
        return rolls[0]
    p = max(r.prompt_len for r in rolls)
    t = max(r.input_ids.shape[1] - r.prompt_len for r in rolls)

    def pad(r: TokenRollout, x: torch.Tensor, value) -> torch.Tensor:
        left, right = p - r.prompt_len, t - (x.shape[1] - r.prompt_len)
        return F.pad(x, (left, right), value=value) if (left or right) else x

    with_logp = all(r.logp is not None for r in rolls)
    return TokenRollout(
        torch.cat([pad(r, r.input_ids, pad_token_id) for r in rolls]),
        torch.cat([pad(r, r.attention_mask, 0) for r in rolls]),
        torch.cat([pad(r, r.action_mask, False) for r in rolls]),
        p, torch.cat([r.truncated for r in rolls]),
        [ids for r in rolls for ids in r.response_ids],
        torch.cat([pad(r, r.logp, 0.0) for r in rolls]) if with_logp else None)


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
    ``all_done(flag) -> bool`` (sharded models, :mod:`ppokit.llm.training.fsdp`): whether every
    rank's rows have finished; the loop runs until they have, so that every rank makes
    the same number of forward passes (finished rows only receive padding)."""
    from .models import AdaptersOff, plain_model

    if isinstance(model, AdaptersOff):
        with plain_model(model) as plain:
            return generate(plain, prompt_ids, prompt_mask, max_new_tokens=max_new_tokens,
                            eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                            temperature=temperature, generator=generator, all_done=all_done)
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
    # the prompt once per distinct prompt (a group's samples share it), its keys and
    # values then gathered per row into buffers that decoding fills in place
    shared = distinct_prompts(prompt_ids, attn)
    first = shared[0] if shared is not None else slice(None)
    rows = shared[1] if shared is not None else None
    from .fused import FusedSampler, unsupported_reason

    sampler = None
    if unsupported_reason(model) is None:  # Llama, Qwen2: the fused pass (fused.py)
        sampler = FusedSampler(model, prompt_ids.shape[1] + max_new_tokens, prompt_ids.device)
        logits = sampler.prefill(prompt_ids[first], attn[first], rows)
    else:
        out = model(input_ids=prompt_ids[first], attention_mask=attn[first],
                    position_ids=pos[first], use_cache=True)
        cache = _decode_cache(_cache_of(out), rows, prompt_ids.shape[1] + max_new_tokens)
        logits = out.logits[:, -1, :] if rows is None else out.logits[rows, -1, :]
    next_pos = pos[:, -1] + 1
    finished = torch.zeros(bsz, dtype=torch.bool)
    toks, alive_cols, logps = [], [], []
    for step in range(max_new_tokens):
        tok, logp_all = _draw(logits.float(), temperature, generator)
        alive = ~finished
        logps.append(torch.where(alive, logp_all.gather(1, tok[:, None]).squeeze(1), 0.0))
        tok = torch.where(alive, tok, torch.full_like(tok, pad_token_id))
        toks.append(tok)
        alive_cols.append(alive)
        finished = finished | (tok == eos_token_id)
        done = bool(finished.all())
        if all_done is not None:
            done = all_done(done)
        if done or step == max_new_tokens - 1:
            break
        if sampler is not None:
            logits = sampler.step(tok, next_pos, alive)
        else:
            attn = torch.cat([attn, alive.long()[:, None]], dim=1)
            out = model(input_ids=tok[:, None], attention_mask=attn,
                        position_ids=next_pos[:, None], use_cache=True, **{cache_kw: cache})
            cache = _cache_of(out)
            logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
    if was_training:
        model.train()
    return _rollout(prompt_ids, prompt_mask, torch.stack(toks, 1), torch.stack(alive_cols, 1),
                    torch.stack(logps, 1), eos_token_id)


def _draw(logits: torch.Tensor, temperature: float, generator: torch.Generator | None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token of each row, log-softmax of the logits it was drawn from)``: the argmax at
    temperature 0, else a draw from the softmax of ``logits / temperature``."""
    if temperature == 0:
        return logits.argmax(-1), torch.log_softmax(logits, dim=-1)
    scaled = logits / temperature
    probs = torch.softmax(scaled, dim=-1)
    tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tok, torch.log_softmax(scaled, dim=-1)


def _rollout(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, gen: torch.Tensor,
             gen_mask: torch.Tensor, gen_logp: torch.Tensor, eos_token_id: int
             ) -> TokenRollout:
    """The prompts and their completions ``gen`` ``[B, N]`` (``gen_mask``: the tokens
    sampled before each row finished) as a :class:`TokenRollout`; a row without EOS is
    truncated, and each row's response is its tokens without the EOS."""
    bsz = prompt_ids.shape[0]
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
    logp = torch.cat([torch.zeros(prompt_ids.shape, dtype=torch.float32), gen_logp], 1)
    return TokenRollout(seq, attention_mask, action_mask, prompt_ids.shape[1], ~has_eos, responses,
                        logp)


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
                      with_entropy: bool = False, with_hidden: bool = False,
                      prompt_len: int | None = None, min_prompts: int = 0,
                      actions_from: int | None = None, entropy_grad: bool = True,
                      packing="off"):
    """Log-probs ``[B, L]`` of each token under ``model`` (token convention), from one
    forward pass with position ids counted over real tokens. Optionally the entropy
    ``[B, L]`` of the distribution each token was drawn from, and the last hidden states.
    ``temperature`` divides the logits as the sampler did (0 or 1: no scaling).

    ``prompt_len``: the first ``prompt_len`` columns are the (left-padded) prompt. Rows
    that share a prompt — the ``samples_per_prompt`` completions of one group — then have
    it computed once (:func:`_logits_with_shared_prompts`); the result is the plain
    forward's to float rounding, gradients included (``tests/test_llm_shared_prompts.py``).
    ``min_prompts``: see :func:`ppokit.llm.modeling.fused.fused_logits`.

    ``actions_from``: only tokens at columns ``>= actions_from`` are wanted (a rollout's
    actions start after its prompt): the output head and the log-softmax then run on the
    positions that predict them only, and the columns before hold 0. Over a vocabulary of
    tens of thousands the head is a large share of a position's cost, and a chat prompt
    is often longer than its completion. ``entropy_grad=False`` computes the entropy
    without a gradient (a statistic to log, when it is not in the loss).

    ``packing`` (``"on"`` | ``"off"`` | ``"auto"``): compute the rows without their padding
    where the fused forward runs (:mod:`ppokit.llm.modeling.packing`); a column whose token
    follows padding then holds 0."""
    from .models import AdaptersOff, plain_model

    if isinstance(model, AdaptersOff):
        with plain_model(model) as plain:
            return sequence_logprobs(plain, input_ids, attention_mask,
                                     temperature=temperature, with_entropy=with_entropy,
                                     with_hidden=with_hidden, prompt_len=prompt_len,
                                     min_prompts=min_prompts, actions_from=actions_from,
                                     entropy_grad=entropy_grad, packing=packing)
    L = input_ids.shape[1]
    k = 0 if not actions_from else min(max(int(actions_from) - 1, 0), L - 1)
    if not with_hidden and wants_packing(packing, attention_mask, prompt_len):
        from .fused import fused_logits

        packed = fused_logits(model, input_ids, attention_mask, prompt_len, min_prompts, k,
                              pack=True)
        if packed is not None:
            return packed_logprobs(packed, input_ids, temperature, with_entropy,
                                   entropy_grad)
    logits, hidden = _logits_with_shared_prompts(model, input_ids, attention_mask,
                                                 prompt_len, with_hidden, min_prompts, k)
    logits = logits[:, :-1, :].float()  # positions k .. L-2 predict tokens k+1 .. L-1
    if temperature not in (0, 1):
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    lp = F.pad(logp_all.gather(-1, input_ids[:, k + 1:, None]).squeeze(-1), (k + 1, 0))
    res = {"logp": lp}
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = -(logp_all.exp() * logp_all).sum(-1)
        res["entropy"] = F.pad(ent, (k + 1, 0))
    if with_hidden:
        res["hidden"] = hidden
    return res


def _logits_with_shared_prompts(model, input_ids, attention_mask, prompt_len, with_hidden,
                                min_prompts=0, logits_from: int = 0):
    """Logits ``[B, L - logits_from, V]`` of positions ``logits_from`` .. ``L - 1`` (and the
    last hidden states of every position, or None).

    Without ``prompt_len``, or when no two rows share a prompt, this is one forward pass.
    Otherwise two: the distinct prompts alone (``U`` rows of ``P`` positions, keeping their
    keys and values), then every row's remaining ``L − P`` positions attending to its
    prompt's keys and values, gathered per row. A group of ``G`` completions of one prompt
    thus costs ``P + G·(L − P)`` positions instead of ``G·L``. Autograd flows through the
    gather, so the prompt positions receive the summed gradient of every row that used
    them, as in the plain pass."""
    if not with_hidden:  # Llama and Qwen2: one fused pass (ppokit/llm/modeling/fused.py)
        from .fused import fused_logits

        logits = fused_logits(model, input_ids, attention_mask, prompt_len, min_prompts,
                              logits_from=logits_from)
        if logits is not None:
            return logits, None
    pos = position_ids_from_mask(attention_mask)
    p = prompt_len or 0
    L = input_ids.shape[1]
    if 0 < p < L:
        shared = distinct_prompts(input_ids[:, :p], attention_mask[:, :p])
        if shared is not None:
            first, inv = shared
            keep = max(p - logits_from, 1)  # the prompt's last position predicts a token
            head = model(input_ids=input_ids[first, :p], attention_mask=attention_mask[first, :p],
                         position_ids=pos[first, :p], use_cache=True,
                         output_hidden_states=with_hidden, **_keep(model, keep))
            cache = _cache_of(head)
            if cache is None:  # the model keeps no cache (e.g. gradient checkpointing)
                return _plain_logits(model, input_ids, attention_mask, pos, with_hidden,
                                     logits_from)
            cache = _select_rows(cache, inv)
            tail = model(input_ids=input_ids[:, p:], attention_mask=attention_mask,
                         position_ids=pos[:, p:], use_cache=True,
                         output_hidden_states=with_hidden, **{_cache_keyword(model): cache})
            head_logits = head.logits[inv, -keep:] if logits_from < p else \
                head.logits[inv, :0]
            tail_logits = tail.logits[:, max(logits_from - p, 0):]
            logits = torch.cat([head_logits, tail_logits], 1)
            hidden = (torch.cat([head.hidden_states[-1][inv], tail.hidden_states[-1]], 1)
                      if with_hidden else None)
            return logits, hidden
    return _plain_logits(model, input_ids, attention_mask, pos, with_hidden, logits_from)


def _plain_logits(model, input_ids, attention_mask, pos, with_hidden, logits_from=0):
    n = input_ids.shape[1] - logits_from
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos,
                output_hidden_states=with_hidden, **_keep(model, n))
    return out.logits[:, -n:], (out.hidden_states[-1] if with_hidden else None)


def _keep(model, n: int) -> dict:
    """``logits_to_keep=n`` for a model whose forward takes it (transformers computes the
    output head on the last ``n`` positions only); nothing for one that does not (the
    caller then slices)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    fwd = type(inner).forward
    ok = _TAKES_KEEP.get(fwd)
    if ok is None:
        ok = _TAKES_KEEP[fwd] = "logits_to_keep" in inspect.signature(fwd).parameters
    return {"logits_to_keep": n} if ok else {}


_TAKES_KEEP: dict = {}


def _decode_cache(cache, rows: torch.Tensor | None, capacity: int):
    """The prefill's KV cache made ready for decoding: rows gathered at ``rows`` (shared
    prompts) and, for transformers' ``DynamicCache``, every layer's keys and values copied
    into buffers of ``capacity`` positions that each decoding step writes in place (the
    stock layer concatenates, copying the whole cache at every step). Another cache type
    is used as it is."""
    if rows is not None:
        cache = _select_rows(cache, rows)
    layers = getattr(cache, "layers", None)
    if _FilledInPlace is None or not layers or any(type(x) is not _DynamicLayer
                                                   for x in layers):
        return cache
    for i, layer in enumerate(layers):
        if layer.is_initialized and layer.keys is not None and layer.keys.numel():
            layers[i] = _FilledInPlace(layer.keys, layer.values, capacity)
    return cache


try:
    from transformers.cache_utils import DynamicLayer as _DynamicLayer

    class _FilledInPlace(_DynamicLayer):
        """A decoding cache layer over preallocated ``[B, H, capacity, D]`` buffers."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int):
            super().__init__()
            b, h, n, d = keys.shape
            self._k = keys.new_empty(b, h, max(capacity, n), d)
            self._v = values.new_empty(b, h, max(capacity, n), values.shape[-1])
            self._k[:, :, :n] = keys
            self._v[:, :, :n] = values
            self._n = n
            self._view()
            self.device = keys.device
            self.is_initialized = True

        def _view(self):
            self.keys = self._k[:, :, :self._n]
            self.values = self._v[:, :, :self._n]

        def update(self, key_states, value_states, *args, **kwargs):
            m = key_states.shape[-2]
            if self._n + m > self._k.shape[2]:  # past the capacity: grow as the stock layer
                self._k = torch.cat([self._k[:, :, :self._n], key_states], 2)
                self._v = torch.cat([self._v[:, :, :self._n], value_states], 2)
            else:
                self._k[:, :, self._n:self._n + m] = key_states
                self._v[:, :, self._n:self._n + m] = value_states
            self._n += m
            self._view()
            return self.keys, self.values
except ImportError:  # transformers absent or without per-layer caches
    _DynamicLayer = _FilledInPlace = None


def _select_rows(cache, idx: torch.Tensor):
    """The KV cache with its batch rows taken at ``idx`` (differentiably)."""
    if hasattr(cache, "reorder_cache"):
        cache.reorder_cache(idx)
        return cache
    return tuple(tuple(t.index_select(0, idx) for t in layer) for layer in cache)  # legacy
