"""``precision = bf16`` for the token trainer: the models' forward passes under bfloat16
autocast, with attention computed in float32.

Under autocast the linear layers (the bulk of the arithmetic) take bfloat16 copies of
their inputs and weights; the log-softmax, the critic's head, the losses, the weights and
the optimiser state stay float32 (:meth:`ppokit.llm.training.trainer.TokenTrainer.autocast`).

Attention is the exception. torch's CPU kernel for ``scaled_dot_product_attention`` in
bfloat16 has a slow backward at short sequence lengths: on the 10M-parameter bench model
(32 sequences of 17 tokens) its backward took 18 ms per layer against 1.6 ms in float32,
a third of the whole training step. On the CPU, models whose attention is transformers'
``sdpa`` therefore get :func:`float32_sdpa` instead: the same function on float32 copies
of the queries, keys and values (autocast off inside), its output cast back to the
bfloat16 the next projection receives anyway. It is registered with transformers'
attention interface as ``ppokit_sdpa_fp32`` (with sdpa's mask builder) and set only on
the models the trainer runs; transformers does not write the choice into a saved model's
``config.json``, so an exported policy loads with ``sdpa`` anywhere.

The reference model never changes, so its linear layers are stored in bfloat16 once
(:func:`frozen_linears_to_bf16`) instead of being cast at every call: the same numbers
(autocast would round those weights to bfloat16 anyway), 2 bytes per weight instead of 4
plus a transient copy. Embeddings, norms, and a head tied to the embedding stay float32, so
the residual stream stays float32 as in the policy.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ATTENTION", "float32_sdpa", "use_float32_attention", "frozen_linears_to_bf16"]

ATTENTION = "ppokit_sdpa_fp32"


def float32_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' ``sdpa`` attention on float32 copies of ``query``, ``key``, ``value``
    (module doc); returns the output in the queries' dtype."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dtype = query.dtype
    with torch.autocast(query.device.type, enabled=False):
        out, weights = sdpa_attention_forward(module, query.float(), key.float(),
                                              value.float(), attention_mask, **kwargs)
    return out.to(dtype), weights


def _register() -> None:
    """Register the attention function, and sdpa's mask builder under its name (the
    masks transformers builds for a model follow its attention's name)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, float32_sdpa)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def _configs(model: nn.Module):
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            yield m, cfg


def use_float32_attention(model: nn.Module) -> bool:
    """Give ``model`` (a transformers model, a peft wrapper or a backbone) float32
    attention where it uses ``sdpa`` on the CPU; whether it did. A module with no
    parameters of its own (a LoRA run's reference, the policy with its adapters off:
    :class:`~ppokit.llm.modeling.models.AdaptersOff`) has nothing to change: its model
    is the policy, changed as the policy."""
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu":
        return False
    changed = False
    for _, cfg in _configs(model):
        if cfg._attn_implementation == "sdpa":
            _register()
            cfg._attn_implementation = ATTENTION
            changed = True
    return changed


def frozen_linears_to_bf16(model: nn.Module) -> int:
    """Store the frozen ``nn.Linear`` layers of ``model`` in bfloat16 (module doc), except
    one sharing its weight with the input embedding; the number converted. Only for a
    model that then runs under bfloat16 autocast."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = emb.weight if emb is not None else None
    n = 0
    for m in model.modules():
        if (isinstance(m, nn.Linear) and m.weight is not tied
                and not any(p.requires_grad for p in m.parameters())):
            m.to(torch.bfloat16)
            n += 1
    return n
