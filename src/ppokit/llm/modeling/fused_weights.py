"""The weights of ppokit's fused forward (:mod:`.fused`), gathered per decoder layer: each
layer's projections concatenated into one product (q, k and v; gate and up), PEFT's LoRA
adapters kept beside a frozen base or merged into it for sampling, and frozen
concatenations kept between calls until a weight changes."""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

__all__ = ["cast", "unwrap", "adapter_parts", "concat_weights", "product", "apply_product",
           "layer_weights"]


def cast(t, dtype):
    return t if t is None or t.dtype == dtype else t.to(dtype)


def unwrap(model):
    """The transformers model inside a PEFT wrapper (the model itself otherwise)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def adapter_parts(m):
    """``(linear, adapters)`` of a projection: a plain ``nn.Linear`` with no adapters, or
    PEFT's LoRA layer as its frozen base ``nn.Linear`` and the ``(A, B, scale)`` of each
    active adapter (none while adapters are disabled). None for anything else (a
    quantised layer, DoRA and other variants, LoRA dropout, merged weights): those keep
    their own forward."""
    if type(m) is torch.nn.Linear:
        return m, ()
    base, lora_a = getattr(m, "base_layer", None), getattr(m, "lora_A", None)
    if type(base) is not torch.nn.Linear or lora_a is None or getattr(m, "merged", True):
        return None
    if getattr(m, "disable_adapters", False):
        return base, ()
    active = [name for name in m.active_adapters if name in lora_a]
    if len(active) > 1:
        return None
    out = []
    for name in active:
        if name in getattr(m, "lora_variant", {}) or type(m.lora_dropout[name]) is not \
                torch.nn.Identity:
            return None
        out.append((lora_a[name].weight, m.lora_B[name].weight, float(m.scaling[name])))
    return base, tuple(out)


# concatenations of frozen weights (LoRA's base, a reference model), kept between calls
_frozen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def concat_weights(key, weights, biases, dtype):
    """``(weight, bias)``: ``weights`` concatenated (and their biases, zeros standing for a
    missing one) in ``dtype``; differentiable. Frozen weights (no gradient) are concatenated
    once and kept, keyed by ``key`` (a module), until one of them changes in place."""
    frozen = not any(t.requires_grad for t in (*weights, *[b for b in biases
                                                           if b is not None]))
    if frozen:
        stamp = (dtype, tuple(t._version for t in weights),
                 tuple(-1 if b is None else b._version for b in biases))
        have = _frozen.get(key)
        if have is not None and have[0] == stamp:
            return have[1]
    w = torch.cat([cast(v, dtype) for v in weights]) if len(weights) > 1 else cast(
        weights[0], dtype)
    b = None
    if any(x is not None for x in biases):
        b = torch.cat([cast(x, dtype) if x is not None else
                       torch.zeros(v.shape[0], dtype=dtype, device=v.device)
                       for x, v in zip(biases, weights)])
    if frozen and (len(weights) > 1 or w is not weights[0]):
        _frozen[key] = (stamp, (w, b))
    return w, b


def product(modules, dtype, merge: bool = False):
    """One product over ``modules`` (their outputs concatenated): ``(weight, bias,
    adapters)``, ``adapters`` None without LoRA, else ``(A, [(B, scale, rank, width)])``
    with the modules' A matrices concatenated (one product for every adapter's input
    projection) and a ``B`` of None for a module without one.

    ``merge`` (no gradient: the sampler): each adapter's ``scale · B A`` is added to a
    copy of its module's weight rows instead, so that a decoding step makes one product
    per projection (the same function; float rounding differs)."""
    parts = [adapter_parts(m) for m in modules]
    lin = [p[0] for p in parts]
    w, b = concat_weights(modules[0], [x.weight for x in lin], [x.bias for x in lin], dtype)
    if not any(p[1] for p in parts):
        return w, b, None
    if merge:
        w, row = w.clone(), 0
        for x, (_, ads) in zip(lin, parts):
            for a_w, b_w, scale in ads:
                w[row:row + x.out_features] += (b_w.float() @ a_w.float() * scale).to(dtype)
            row += x.out_features
        return w, b, None
    a_all, outs = [], []
    for x, (_, ads) in zip(lin, parts):
        if not ads:
            outs.append((None, 0.0, 0, x.out_features))
        for a_w, b_w, scale in ads:
            a_all.append(cast(a_w, dtype))
            outs.append((cast(b_w, dtype), scale, a_w.shape[0], x.out_features))
    return w, b, (torch.cat(a_all) if len(a_all) > 1 else a_all[0], outs)


def apply_product(x, prod):
    """``x`` through one :func:`product` product: the base product plus, for each module
    with an adapter, ``scale · (x Aᵀ) Bᵀ`` in that module's output columns."""
    w, b, lora = prod
    y = F.linear(x, w, b)
    if lora is None:
        return y
    a, outs = lora
    xa = F.linear(x, a)
    cols, i = [], 0
    for B, scale, r, width in outs:
        if B is None:
            cols.append(y.new_zeros(*y.shape[:-1], width))
        else:
            cols.append(F.linear(xa[..., i:i + r], B) * scale)
            i += r
    return y + (torch.cat(cols, -1) if len(cols) > 1 else cols[0])


def layer_weights(model, dtype, merge: bool = False):
    """Per decoder layer, lazily (each layer's concatenations made when it is reached):
    ``(input norm, attention scale, qkv, o, post-attention norm, gate/up, down)``, the
    products as :func:`product` triples."""
    for layer in unwrap(model).model.layers:
        a, mlp = layer.self_attn, layer.mlp
        yield (layer.input_layernorm, a.scaling,
               product([a.q_proj, a.k_proj, a.v_proj], dtype, merge),
               product([a.o_proj], dtype, merge),
               layer.post_attention_layernorm,
               product([mlp.gate_proj, mlp.up_proj], dtype, merge),
               product([mlp.down_proj], dtype, merge))
