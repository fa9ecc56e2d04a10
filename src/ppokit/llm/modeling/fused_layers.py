"""The decoder layers of ppokit's fused forward (:mod:`ppokit.llm.modeling.fused`), shared
by its training forward and its sampler: the rotary tables, the layer loop, and the three
elementwise steps — RMS norm, the q/k/v split with its rotation, the SiLU-gated product —
each run as one compiled pass where :mod:`ppokit.kernels.decoder` applies (the CPU, float32
or bfloat16: the same values, see its docstring), else as the torch formula beside it."""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from ppokit.kernels import decoder as decoder_kernels

from .fused_weights import apply_product, cast, product, unwrap

_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def rope_tables(rot, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``, ``sin`` ``[n, head_dim]`` in float32, each row the values transformers'
    rotary module computes for that position (the same float32 operations)."""
    have = _tables.get(rot)
    if have is not None and have[0].shape[0] >= n and have[0].device == device:
        return have
    n = max(n, int(getattr(rot, "max_seq_len_cached", 0) or 0))
    freqs = torch.arange(n, device=device)[:, None].float() * rot.inv_freq.to(device).float()
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * rot.attention_scaling, emb.sin() * rot.attention_scaling
    _tables[rot] = (cos, sin)
    return cos, sin


def _rms(h: torch.Tensor, norm) -> torch.Tensor:
    var = h.pow(2).mean(-1, keepdim=True)
    return norm.weight * (h * torch.rsqrt(var + norm.variance_epsilon))


def formats(device_type: str, low):
    """``(projection dtype, attention dtype)`` under autocast format ``low`` (None: off):
    attention in float32 on the CPU (as ppokit/llm/modeling/precision.py gives transformers'
    forward there), elsewhere in the autocast format, as autocast would run it."""
    act = torch.float32 if low is None else low
    att = torch.float32 if low is None or device_type == "cpu" else low
    return act, att


def decoder_layers(h, layers, cos, sin, heads: tuple[int, int, int], act, att, attend):
    """The decoder layers on hidden states ``h`` ``[..., D]`` (float32): ``layers`` from
    :func:`layer_weights`, rotary ``cos``/``sin`` broadcastable to ``[..., heads, hd]``,
    ``attend(i, q, k, v, scale)`` the attention of layer ``i`` (q ``[..., H, hd]``, k and v
    ``[..., KV, hd]``, in ``att``) returning ``[..., H·hd]``."""
    for i, (n1, scale, qkv_w, o_w, n2, gu_w, d_w) in enumerate(layers):
        q, k, v = _split_rotate(apply_product(_norm(h, n1, act), qkv_w), cos, sin, heads, att)
        o = attend(i, q, k, v, scale)
        h = h + apply_product(cast(o, act), o_w)
        h = h + apply_product(_gated(apply_product(_norm(h, n2, act), gu_w), act), d_w)
    return h


# Each of the three steps below runs as one compiled pass where ppokit.kernels.decoder
# applies (the CPU, float32 or bfloat16: the same values, see its docstring), else as the
# torch formula beside it.
def _norm(h, norm, act):
    """RMS norm of ``h`` in the projections' format ``act``."""
    out = decoder_kernels.rms_norm(h, norm.weight, norm.variance_epsilon, act)
    return cast(_rms(h, norm), act) if out is None else out


def _split_rotate(qkv, cos, sin, heads, att):
    """The fused product's columns as ``q``, ``k``, ``v`` in ``att``, q and k rotated."""
    H, KV, hd = heads
    if att == torch.float32:
        out = decoder_kernels.rotary_split(qkv, cos, sin, heads)
        if out is not None:
            return out
    q, k, v = qkv.view(*qkv.shape[:-1], H + 2 * KV, hd).split([H, KV, KV], -2)
    return _rotate(q, cos, sin).to(att), _rotate(k, cos, sin).to(att), v.to(att)


def _gated(gate_up, act):
    """``silu(gate) * up`` in ``act``."""
    out = decoder_kernels.gated(gate_up) if gate_up.dtype == act else None
    if out is None:
        gate, up = gate_up.chunk(2, -1)
        out = cast(F.silu(gate) * up, act)
    return out


def output_head(model, h, act, weights=None):
    """The final norm and the output head (``weights``: its :func:`product` pair, made here
    when not given)."""
    model = unwrap(model)
    return apply_product(cast(_rms(h, model.model.norm), act),
                         weights or product([model.lm_head], act))


def _rotate(t, cos, sin):
    half = t.shape[-1] // 2
    return (t * cos) + (torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin)
