"""A fused forward pass for Llama-architecture decoders (Llama and Qwen2), used by the
token trainer wherever it runs the model: the update's minibatch forward, the reference
model's scoring pass (:func:`fused_logits`) and the sampler (:class:`FusedSampler`).

It reads the model's own parameters and computes what transformers' forward computes,
layer by layer (RMS norm, rotary embedding, causal attention over real tokens, SiLU-gated
MLP, tied or separate head), with these differences in *how*, none in *what*:

- **Fused projections.** The query, key and value projections are one matrix product on
  the concatenated weights, and so are the MLP's gate and up projections: one product (and
  one gradient product) instead of three or two, and the normed activations cast to
  bfloat16 once instead of once per projection.
- **One pass for shared prompts.** When rows repeat a prompt (a group's completions), the
  distinct prompts and every row's remaining positions are laid out as one token matrix
  for all the projections and MLPs; only attention sees the two parts apart (the
  completions attend to their prompt's keys and values, gathered per row). transformers'
  API needs two model calls for that
  (:func:`ppokit.llm.modeling.rollout._logits_with_shared_prompts`),
  each with its own casts, and the weight gradients of the two calls summed. The prompt
  rows can be padded to a fixed count (``min_prompts``) so that every minibatch of a
  rollout has one shape.
- **Sampling** casts and concatenates the weights once per call, keeps the keys and values
  in token-major buffers of a fixed capacity, and computes a decoding step's attention (one
  query per row) in C on the CPU where the kernels are built, reading the buffers in place
  (:func:`ppokit.kernels.decoder.decode_attention`), else as two plain products.
- **The elementwise steps in C on the CPU.** RMS norm (with its cast to the projections'
  format), the rotary embedding (with the split of the fused q/k/v product into float32
  heads) and the SiLU-gated product each run as one compiled pass forward and one backward,
  and so does float32 attention over the layout's parts, token-major
  (:mod:`ppokit.kernels.decoder`, the same values as the torch formulas beside them, which
  run where the kernels do not: another device, the extension not built,
  ``PPOKIT_NATIVE=0``).
- **Number formats as ppokit's ``precision = bf16``.** Under bfloat16 autocast the
  projections run in bfloat16 (weights and inputs rounded, products accumulated in
  float32); the residual stream, norms and rotary embedding in float32; attention in
  float32 on the CPU — the formats the trainer's transformers forward has there
  (:mod:`ppokit.llm.modeling.precision`) — and in the autocast format elsewhere. Without autocast
  everything is float32.

It is held to transformers' forward by ``tests/test_llm_fused.py`` (hypothesis): logits and
every parameter's gradient on random Llama and Qwen2 models (grouped-query attention,
biases, tied and separate heads), random left and right padding and shared prompts, in
float32 and under bfloat16 autocast; the sampler's tokens and log-probs against
transformers' cached decoding, and its step-by-step logits against the whole-sequence
pass.

What it does not cover falls back to transformers' forward, with the same results:
other architectures, PEFT adapters, quantised or otherwise replaced layers, sharded
(FSDP) models or any module with forward hooks, gradient checkpointing, sliding-window
attention, rotary scalings that depend on the sequence length, activations other than
SiLU, attention dropout in training, a model held in a low-precision format outside
autocast, and callers that want hidden states (a critic sharing the policy's body).
``PPOKIT_FUSED_FORWARD=0`` turns it off (everything then runs through transformers).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ppokit.kernels import decoder as decoder_kernels

from .fused_layers import decoder_layers, formats, output_head, rope_tables
from .fused_weights import adapter_parts, layer_weights, product, unwrap

__all__ = ["ENV_VAR", "FusedSampler", "fused_logits", "unsupported_reason"]

ENV_VAR = "PPOKIT_FUSED_FORWARD"
_ARCHS = ("LlamaForCausalLM", "Qwen2ForCausalLM")
_STATIC_ROPE = ("default", "linear", "llama3")


def unsupported_reason(model) -> str | None:
    """Why :func:`fused_logits` would not run ``model`` (None: it would)."""
    if os.environ.get(ENV_VAR, "1").strip() == "0":
        return f"{ENV_VAR}=0"
    model = unwrap(model)
    name = type(model).__name__
    if name not in _ARCHS:
        return f"architecture {name}"
    cfg = model.config
    ckpt = ("is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing")
            else "is_gradient_checkpointing")
    if getattr(model, ckpt, False):
        return "gradient checkpointing"
    if getattr(cfg, "hidden_act", None) != "silu":
        return f"activation {getattr(cfg, 'hidden_act', None)!r}"
    if getattr(cfg, "pretraining_tp", 1) not in (1, None):
        return "pretraining_tp"
    if model.training and float(getattr(cfg, "attention_dropout", 0.0) or 0.0) > 0:
        return "attention dropout"
    rot = getattr(model.model, "rotary_emb", None)
    if rot is None or getattr(rot, "rope_type", None) not in _STATIC_ROPE:
        return f"rotary embedding {getattr(rot, 'rope_type', None)!r}"
    hooks = (torch.nn.modules.module._global_forward_hooks,
             torch.nn.modules.module._global_forward_pre_hooks)
    if any(hooks):
        return "global module hooks"
    for m in model.modules():
        if m._forward_hooks or m._forward_pre_hooks:
            return f"forward hooks on {type(m).__name__}"
    for layer in model.model.layers:
        if getattr(layer.self_attn, "sliding_window", None) is not None:
            return "sliding-window attention"
        a, mlp = layer.self_attn, layer.mlp
        # plain layers only: a quantised or otherwise replaced projection keeps its own
        # forward, which reading ``.weight`` here would bypass
        for m in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, mlp.gate_proj, mlp.up_proj,
                  mlp.down_proj):
            if adapter_parts(m) is None:
                return f"projection of type {type(m).__name__}"
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            if not hasattr(norm, "variance_epsilon"):
                return f"norm of type {type(norm).__name__}"
    if type(model.lm_head) is not torch.nn.Linear:
        return f"head of type {type(model.lm_head).__name__}"
    if type(model.model.embed_tokens) is not torch.nn.Embedding:
        return f"embedding of type {type(model.model.embed_tokens).__name__}"
    return None


def fused_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 prompt_len: int | None = None, min_prompts: int = 0,
                 logits_from: int = 0, pack: bool = False):
    """Logits ``[B, L - logits_from, V]`` of positions ``logits_from`` .. ``L - 1`` (as
    transformers' forward with position ids counted over real tokens and
    ``logits_to_keep``), or None when ``model`` is not one this pass covers
    (:func:`unsupported_reason`). ``prompt_len``: the first columns are the left-padded
    prompt; rows that repeat one have it computed once.

    ``min_prompts``: compute at least that many prompt rows (the first distinct prompt
    repeated; nothing reads the extra rows, so they receive no gradient). The update's
    minibatches hold a varying number of a rollout's groups; padding to the rollout's
    count gives every minibatch one token-matrix shape. The CPU's matrix-product library
    (oneDNN) compiles and keeps a kernel per shape: on the 10M-parameter bench model the
    varying shapes held about 35 MB more memory, for about 2 % more arithmetic here.

    ``pack``: the real positions only, without padding — ``(logits [N, V], rows [N], cols
    [N])`` of the positions ``logits_from`` .. ``L − 2`` that hold a real token
    (:func:`ppokit.llm.modeling.packing.packed_head`)."""
    if unsupported_reason(model) is not None:
        return None
    dev = input_ids.device.type
    low = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
    if low is None and unwrap(model).model.embed_tokens.weight.dtype != torch.float32:
        return None  # a model held in a low-precision format: transformers' forward
    with torch.autocast(dev, enabled=False):
        return _forward(model, input_ids, attention_mask.long(), prompt_len, low, min_prompts,
                        logits_from, pack)


ROOT_MIN = 4  # a common prefix shorter than this is computed with each prompt


def _common_prefix(ids: torch.Tensor, mask: torch.Tensor) -> tuple[int, int]:
    """``(c, shortest)`` of left-padded prompt rows ``[U, P]``: the number ``c`` of leading
    real tokens every row shares (at most ``shortest − 1``, so that each row keeps a token
    of its own) and the length of the shortest row."""
    real = mask.bool()
    lens = real.sum(1)
    m = int(lens.min())
    if ids.shape[0] < 2 or m < 2:
        return 0, m
    idx = (ids.shape[1] - lens)[:, None] + torch.arange(m, device=ids.device)[None]
    toks = ids.gather(1, idx)
    same = (toks == toks[:1]).all(0).long().cumprod(0)
    return min(int(same.sum()), m - 1), m


class _Layout:
    """How a batch is laid out as one token matrix: an optional *root* (the ``c`` leading
    tokens every distinct prompt shares — a chat template's system prompt — computed
    once), the distinct prompts (the last ``hp`` columns of each; with a root, its tokens
    there are not keys), and every row's remaining ``T`` positions. Each part attends to
    the keys before it that its row can see: the root to itself (causally), a prompt to
    the root and itself, a row's completion to the root, its prompt and itself.

    ``ids``, ``mask`` ``[B, L]`` with the prompt in the first ``p`` columns; ``first``
    ``[U]`` the row of each distinct prompt (repeats allowed), ``inv`` ``[B]`` each row's
    prompt (``first`` None: no prompt part, ``p`` = 0); ``keep_from``: the first column
    whose output is read — the root is used only when no column it holds is read.

    ``pack``: the rows' remaining part holds only their real tokens (``packed``: their flat
    indices in ``[B, T]``), one after another, for the projections, MLPs and head; its
    attention scatters them back to ``[B, T]`` (padding zero and masked) and gathers the
    outputs, so that each sequence still attends to its own keys only."""

    def __init__(self, ids, mask, pos, p, first, inv, keep_from, root=True, pack=False):
        dev = ids.device
        B, L = ids.shape
        self.B, self.T, self.p, self.inv = B, L - p, p, inv
        self.U = 0 if first is None else first.shape[0]
        c, hp = 0, p
        if self.U >= 2 and root:
            c, shortest = _common_prefix(ids[first, :p], mask[first, :p])
            longest = int(mask[first, :p].sum(1).max())
            if c < ROOT_MIN or keep_from < p - shortest + c:
                c = 0
            else:
                hp = longest - c
        self.c, self.hp, self.off = c, hp, p - hp
        real = mask.bool()
        parts_tok, parts_pos = [], []
        if c:
            r0 = int(first[0])
            start = p - int(real[r0, :p].sum())
            parts_tok.append(ids[r0, start:start + c])
            parts_pos.append(pos[r0, start:start + c])
        hreal = None
        if self.U:
            hreal = real[first, self.off:p]
            hpos = pos[first, self.off:p]
            if c:
                hreal = hreal & (hpos >= c)
            parts_tok.append(ids[first, self.off:p].reshape(-1))
            parts_pos.append(hpos.reshape(-1))
        tail_tok, tail_pos = ids[:, p:].reshape(-1), pos[:, p:].reshape(-1)
        self.packed = real[:, p:].reshape(-1).nonzero().squeeze(1) if pack else None
        if pack:
            tail_tok, tail_pos = tail_tok[self.packed], tail_pos[self.packed]
        parts_tok.append(tail_tok)
        parts_pos.append(tail_pos)
        self.tok, self.pos = torch.cat(parts_tok), torch.cat(parts_pos)
        self.nr, self.nh = c, self.U * hp
        # boolean masks (True: may attend); a padding query sees itself, so that no row
        # of a softmax is empty (its output is never read)
        T = self.T
        causal_t = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
        eye_t = torch.eye(T, dtype=torch.bool, device=dev)
        tail = [causal_t[None] & (real[:, None, p:] | eye_t[None])]
        self.root_mask = self.head_mask = None
        if self.U:
            causal_h = torch.ones(hp, hp, dtype=torch.bool, device=dev).tril()
            eye_h = torch.eye(hp, dtype=torch.bool, device=dev)
            head = [causal_h[None] & (hreal[:, None, :] | eye_h[None])]
            tail.insert(0, hreal[inv][:, None, :].expand(-1, T, -1))
            if c:
                head.insert(0, torch.ones(self.U, hp, c, dtype=torch.bool, device=dev))
                tail.insert(0, torch.ones(B, T, c, dtype=torch.bool, device=dev))
                self.root_mask = torch.ones(c, c, dtype=torch.bool, device=dev).tril()[None,
                                                                                       None]
            self.head_mask = torch.cat(head, 2)[:, None]
        self.tail_mask = torch.cat(tail, 2)[:, None]

    def split(self, t: torch.Tensor):
        """A ``[N, heads, D]`` per-token tensor → ``(root [1, heads, c, D] or None,
        prompts [U, heads, hp, D] or None, rest [B, heads, T, D])``."""
        return tuple(None if x is None else x.transpose(1, 2) for x in self.split_tokens(t))

    def split_tokens(self, t: torch.Tensor):
        """As :meth:`split`, token-major: ``(root [1, c, heads, D] or None, prompts [U, hp,
        heads, D] or None, rest [B, T, heads, D])``."""
        heads, d = t.shape[1], t.shape[2]
        # one split (its gradient one concatenation) rather than three slices (each
        # gradient a zero-filled copy of the whole tensor, then summed)
        r, h, rest = t.split([self.nr, self.nh, t.shape[0] - self.nr - self.nh])
        if self.packed is not None:
            rest = rest.new_zeros(self.B * self.T, heads, d).index_copy(0, self.packed, rest)
        return (r[None] if self.nr else None,
                h.view(self.U, self.hp, heads, d) if self.U else None,
                rest.view(self.B, self.T, heads, d))

    def repack(self, rest: torch.Tensor) -> torch.Tensor:
        """The rows' remaining part's outputs ``[B·T, ...]`` → the layout's tokens."""
        return rest if self.packed is None else rest.index_select(0, self.packed)

    def attend_compiled(self, q, k, v, scale, H: int):
        """:meth:`attend` of the whole layout through the compiled attention
        (:func:`ppokit.kernels.decoder.attention`, token-major: no transposes), or None
        where it does not apply."""
        if not decoder_kernels.usable(q, k, v) or q.dtype != torch.float32:
            return None
        (qr, qh, qt), (kr, kh, kt), (vr, vh, vt) = (self.split_tokens(x) for x in (q, k, v))
        hd = q.shape[-1]
        outs = []
        if qr is not None:
            outs.append(decoder_kernels.attention(qr, kr, vr, self.root_mask[:, 0], scale))
        kh_all, vh_all = kh, vh
        if qh is not None:
            if kr is not None:
                kh_all = torch.cat([kr.expand(self.U, -1, -1, -1), kh], 1)
                vh_all = torch.cat([vr.expand(self.U, -1, -1, -1), vh], 1)
            outs.append(decoder_kernels.attention(qh, kh_all, vh_all, self.head_mask[:, 0],
                                                  scale))
            keys = [kh[self.inv], kt] if kr is None else [
                kr.expand(self.B, -1, -1, -1), kh[self.inv], kt]
            vals = [vh[self.inv], vt] if vr is None else [
                vr.expand(self.B, -1, -1, -1), vh[self.inv], vt]
            kt, vt = torch.cat(keys, 1), torch.cat(vals, 1)
        outs.append(decoder_kernels.attention(qt, kt, vt, self.tail_mask[:, 0], scale))
        if any(o is None for o in outs):
            return None
        outs = [o.reshape(-1, H * hd) for o in outs]
        outs[-1] = self.repack(outs[-1])
        return torch.cat(outs) if len(outs) > 1 else outs[0]

    def attend(self, q, k, v, scale, H: int, KV: int, with_rest: bool = True):
        """Attention of every part (q ``[N, H, D]``, k and v ``[N, KV, D]``) → the outputs
        ``[N', H·D]`` (without the rows' remaining part when not ``with_rest``) and the
        prompts' keys and values ``(root, prompts)`` for the sampler."""
        rep = H // KV
        (qr, qh, qt), (kr, kh, kt), (vr, vh, vt) = self.split(q), self.split(k), self.split(v)
        hd = q.shape[-1]
        outs = []

        def sdpa(q_, k_, v_, m):
            return F.scaled_dot_product_attention(q_, _expand_kv(k_, rep), _expand_kv(v_, rep),
                                                  attn_mask=m, scale=scale)

        if qr is not None:
            outs.append(sdpa(qr, kr, vr, self.root_mask)[0].transpose(0, 1).reshape(-1, H * hd))
        kh_all, vh_all = kh, vh
        if qh is not None:
            if kr is not None:
                kh_all = torch.cat([kr.expand(self.U, -1, -1, -1), kh], 2)
                vh_all = torch.cat([vr.expand(self.U, -1, -1, -1), vh], 2)
            oh = sdpa(qh, kh_all, vh_all, self.head_mask)
            outs.append(oh.transpose(1, 2).reshape(self.nh, H * hd))
        if with_rest:
            if kh is not None:
                keys = [kh[self.inv], kt] if kr is None else [
                    kr.expand(self.B, -1, -1, -1), kh[self.inv], kt]
                vals = [vh[self.inv], vt] if vr is None else [
                    vr.expand(self.B, -1, -1, -1), vh[self.inv], vt]
                kt, vt = torch.cat(keys, 2), torch.cat(vals, 2)
            ot = sdpa(qt, kt, vt, self.tail_mask)
            outs.append(self.repack(ot.transpose(1, 2).reshape(self.B * self.T, H * hd)))
        out = torch.cat(outs) if len(outs) > 1 else outs[0]
        return out, (kr, vr, kh, vh)


def _expand_kv(t: torch.Tensor, rep: int) -> torch.Tensor:
    """``[R, KV, S, D]`` → ``[R, KV·rep, S, D]``, query head h reading key head h // rep."""
    if rep == 1:
        return t
    r, kv, s, d = t.shape
    return t[:, :, None].expand(r, kv, rep, s, d).reshape(r, kv * rep, s, d)


def _forward(model, ids, mask, prompt_len, low, min_prompts=0, logits_from=0, pack=False):
    from .positions import distinct_prompts, position_ids_from_mask

    model = unwrap(model)
    body = model.model
    cfg = model.config
    B, L = ids.shape
    pos = position_ids_from_mask(mask)
    p = prompt_len or 0
    shared = distinct_prompts(ids[:, :p], mask[:, :p]) if 0 < p < L else None
    if shared is None:
        p, first, inv = 0, None, None
    else:
        first, inv = shared
        if first.shape[0] < min_prompts:
            first = torch.cat([first, first[:1].expand(min_prompts - first.shape[0])])
    lay = _Layout(ids, mask, pos, p, first, inv, logits_from, pack=pack)

    H = cfg.num_attention_heads
    KV = getattr(cfg, "num_key_value_heads", None) or H
    hd = body.layers[0].self_attn.head_dim
    cos_t, sin_t = rope_tables(body.rotary_emb, int(lay.pos.max()) + 1, ids.device)
    cos, sin = cos_t[lay.pos][:, None, :], sin_t[lay.pos][:, None, :]
    act, att = formats(ids.device.type, low)

    def attend(_, q, k, v, scale):
        out = lay.attend_compiled(q, k, v, scale, H)
        return lay.attend(q, k, v, scale, H, KV)[0] if out is None else out

    h = decoder_layers(body.embed_tokens(lay.tok), layer_weights(model, act), cos, sin,
                 (H, KV, hd), act, att, attend)
    if pack:
        from .packing import packed_head

        return packed_head(model, h, lay, mask, logits_from, act)
    # the output head only where logits are wanted (positions logits_from .. L-1)
    k, D = logits_from, h.shape[-1]
    tail = output_head(model, h[lay.nr + lay.nh:].view(B, lay.T, D)[:, max(k - p, 0):], act)
    if not lay.U or k >= p:
        return tail
    prompts = h[lay.nr:lay.nr + lay.nh].view(lay.U, lay.hp, D)[:, k - lay.off:]
    return torch.cat([output_head(model, prompts, act)[inv], tail], 1)


class FusedSampler:
    """Incremental decoding with the fused pass (no gradient): the prompts' keys and values
    in float32 buffers of a fixed capacity (the autocast format off the CPU), each step
    one token per row. The weights are cast and concatenated once per sampling call
    instead of at every step. Used by :func:`ppokit.llm.modeling.rollout.generate` for the models
    :func:`unsupported_reason` accepts; ``tests/test_llm_fused.py`` holds its tokens and
    log-probs to transformers' cached decoding."""

    def __init__(self, model, capacity: int, device):
        dev = torch.device(device).type
        low = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
        self.act, self.att = formats(dev, low)
        model = unwrap(model)
        body, cfg = model.model, model.config
        self.model, self.body, self.cap = model, body, capacity
        self.H = cfg.num_attention_heads
        self.KV = getattr(cfg, "num_key_value_heads", None) or self.H
        self.hd = body.layers[0].self_attn.head_dim
        # cast (and LoRA adapters merged) once per sampling call, not at every step
        self.layers = list(layer_weights(model, self.act, merge=True))
        self.head_w = product([unwrap(model).lm_head], self.act)
        self.cos, self.sin = rope_tables(body.rotary_emb, capacity + 1, torch.device(device))
        self.k = self.v = self.keymask = None
        self.n = 0

    def _layer_io(self, h, pos, attend):
        cos, sin = self.cos[pos].unsqueeze(-2), self.sin[pos].unsqueeze(-2)
        return decoder_layers(h, self.layers, cos, sin, (self.H, self.KV, self.hd), self.act,
                        self.att, attend)

    @torch.no_grad()
    def prefill(self, ids, mask, rows=None):
        """The prompts ``[U, P]`` (left padded); ``rows`` ``[B]``: the prompt of each
        sampled row (None: one row per prompt). Returns each row's next-token logits."""
        with torch.autocast(ids.device.type, enabled=False):
            return self._prefill(ids, mask.long(), rows)

    def _prefill(self, ids, mask, rows):
        from .positions import position_ids_from_mask

        U, P = ids.shape
        dev = ids.device
        rows = torch.arange(U, device=dev) if rows is None else rows
        B = rows.shape[0]
        pos = position_ids_from_mask(mask)
        # the prompts as the prompt part of a layout without completions (a shared
        # system prompt computed once); only each prompt's last position is read
        every = torch.arange(U, device=dev)
        lay = _Layout(ids, mask, pos, P, every, every, P - 1)
        cap = max(self.cap, P)
        # zeros, not uninitialised memory: a padding column's key is masked, but its value
        # is still multiplied by a zero weight, and 0 x NaN would be NaN
        # token-major ([layer, row, position, key head, hd]): a step writes one position
        # of every head at once, and the compiled attention reads a row's keys in place
        self.k = torch.zeros(len(self.layers), B, cap, self.KV, self.hd, dtype=self.att,
                             device=dev)
        self.v = torch.zeros_like(self.k)
        self.keymask = torch.zeros(B, cap, dtype=torch.bool, device=dev)
        self.keymask[:, :P] = mask.bool()[rows]
        # a row's root keys go to its prompt's first real columns (left padding differs)
        lens = mask.sum(1)[rows]
        root_cols = (P - lens)[:, None] + torch.arange(lay.c, device=dev)[None]
        brow = torch.arange(B, device=dev)[:, None]
        H = self.H

        def attend(i, q, k, v, scale):
            out, (kr, vr, kh, vh) = lay.attend(q, k, v, scale, H, self.KV, with_rest=False)
            self.k[i, :, lay.off:P] = kh[rows].transpose(1, 2)
            self.v[i, :, lay.off:P] = vh[rows].transpose(1, 2)
            if kr is not None:  # [1, KV, c, hd] into each row's root columns
                kb, vb = self.k[i], self.v[i]
                kb[brow, root_cols] = kr[0].transpose(0, 1)[None].expand(B, -1, -1, -1)
                vb[brow, root_cols] = vr[0].transpose(0, 1)[None].expand(B, -1, -1, -1)
            return out

        h = self._layer_io(self.body.embed_tokens(lay.tok), lay.pos, attend)
        self.n = P
        last = h[lay.nr:lay.nr + lay.nh].view(U, lay.hp, -1)[:, -1]
        return output_head(self.model, last, self.act, self.head_w)[rows]

    @torch.no_grad()
    def step(self, tok, pos, alive):
        """Feed one token per row (``tok``, ``pos`` ``[B]``; ``alive``: rows still
        generating — the others' new keys stay masked); next-token logits ``[B, V]``."""
        with torch.autocast(tok.device.type, enabled=False):
            return self._step(tok, pos, alive)

    def _step(self, tok, pos, alive):
        n = self.n
        if n >= self.k.shape[2]:
            raise ValueError(f"FusedSampler: capacity {self.k.shape[2]} positions reached")
        self.keymask[:, n] = alive
        B = tok.shape[0]
        mask = self.keymask[:, None, None, :n + 1]  # [B, 1, 1, n + 1]
        rep = self.H // self.KV

        def attend(i, q, k, v, scale):  # q [B, H, hd], k and v [B, KV, hd]
            self.k[i, :, n] = k
            self.v[i, :, n] = v
            out = decoder_kernels.decode_attention(q, self.k[i], self.v[i], self.keymask, n + 1,
                                                   scale)
            if out is not None:
                return out
            # one query per row: plain products (the query heads of one key head side by
            # side) are faster here than the flash kernel, which is built for long queries
            scores = torch.matmul(q.view(B, self.KV, rep, self.hd),
                                  self.k[i, :, :n + 1].permute(0, 2, 3, 1)) * scale
            probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            return torch.matmul(probs, self.v[i, :, :n + 1].transpose(1, 2)).reshape(
                B, self.H * self.hd)

        h = self._layer_io(self.body.embed_tokens(tok), pos, attend)
        self.n = n + 1
        return output_head(self.model, h, self.act, self.head_w)
