"""The fused forward with PEFT LoRA adapters (ppokit/llm/modeling/fused.py) against PEFT's
own forward.

LoRA's base weights are frozen, so the fused pass keeps their concatenations between calls
and adds each adapter's ``scale · (x Aᵀ) Bᵀ`` in its module's output columns. On random
Llama and Qwen2 models with random (non-zero) adapters: the logits and the gradient of
every adapter parameter equal PEFT's forward; with the adapters disabled (the trainer's
reference, :class:`ppokit.llm.modeling.models.AdaptersOff`) the logits are the base model's; the
sampler draws the tokens PEFT's model gives; a base weight changed in place is seen (the
kept concatenation is not stale); unsupported adapters (dropout, DoRA) fall back.
"""

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("peft")

from ppokit.llm.modeling import fused  # noqa: E402
from ppokit.llm.modeling.models import AdaptersOff, build_char_tokenizer  # noqa: E402
from ppokit.llm.modeling.rollout import (  # noqa: E402
    encode_prompts,
    generate,
    position_ids_from_mask,
    sequence_logprobs,
)

SETTINGS = settings(max_examples=10, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _lora_model(tok, arch, kv, seed, r=4, targets="all-linear", dropout=0.0, dora=False):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=kv, intermediate_size=48,
                  max_position_embeddings=64, pad_token_id=tok.pad_token_id)
    base = (Qwen2ForCausalLM(Qwen2Config(**common)) if arch == "qwen2"
            else LlamaForCausalLM(LlamaConfig(**common)))
    with torch.no_grad():
        for p in base.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model = get_peft_model(base, LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=dropout,
                                            target_modules=targets, use_dora=dora,
                                            task_type="CAUSAL_LM"))
    with torch.no_grad():  # B starts at zero: give the adapters something to add
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    model.eval()
    return model


def _batch(tok, groups, g, t, rng):
    prompts = ["".join(str(rng.randrange(10)) for _ in range(n)) + ">" for n in groups]
    ids, mask = encode_prompts(tok, [p for p in prompts for _ in range(g)])
    b = ids.shape[0]
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    tail = torch.randint(3, len(tok), (b, t), generator=gen)
    lengths = torch.tensor([rng.randint(1, t) for _ in range(b)])
    tail_mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    tail = torch.where(tail_mask.bool(), tail, torch.full_like(tail, tok.pad_token_id))
    return torch.cat([ids, tail], 1), torch.cat([mask, tail_mask], 1), ids.shape[1]


def _plain(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask,
                 position_ids=position_ids_from_mask(mask)).logits


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@SETTINGS
@given(arch=st.sampled_from(["llama", "qwen2"]), kv=st.sampled_from([1, 2, 4]),
       targets=st.sampled_from(["all-linear", ("q_proj", "v_proj"), ("gate_proj",)]),
       groups=st.lists(st.integers(1, 5), min_size=1, max_size=3), g=st.integers(1, 3),
       t=st.integers(1, 5), shared=st.booleans(), seed=st.integers(0, 10**6))
def test_lora_logits_and_adapter_gradients_equal_peft(tok, arch, kv, targets, groups, g, t,
                                                      shared, seed):
    model = _lora_model(tok, arch, kv, seed % 31, targets=targets if isinstance(
        targets, str) else list(targets))
    assert fused.unsupported_reason(model) is None
    ids, mask, p = _batch(tok, groups, g, t, random.Random(seed))
    real = mask.bool()
    w = torch.randn(*ids.shape, len(tok), generator=torch.Generator().manual_seed(seed))
    w = w * real[..., None]
    model.zero_grad(set_to_none=True)
    ref = _plain(model, ids, mask)
    (ref * w).sum().backward()
    ref_g = _grads(model)
    model.zero_grad(set_to_none=True)
    got = fused.fused_logits(model, ids, mask, p if shared else None)
    (got * w).sum().backward()
    got_g = _grads(model)
    assert torch.allclose(got[real], ref[real].detach(), atol=2e-5, rtol=1e-4)
    assert ref_g.keys() == got_g.keys() and ref_g  # the adapters, and only they
    assert all("lora_" in k for k in got_g)
    for k in ref_g:
        assert torch.allclose(got_g[k], ref_g[k], atol=5e-5, rtol=1e-3), k


@SETTINGS
@given(arch=st.sampled_from(["llama", "qwen2"]), seed=st.integers(0, 10**6),
       shared=st.booleans())
def test_adapters_off_is_the_base_model(tok, arch, seed, shared):
    model = _lora_model(tok, arch, 2, seed % 29)
    ids, mask, p = _batch(tok, [3, 5], 2, 4, random.Random(seed))
    real = mask.bool()
    with torch.no_grad():
        on = _plain(model.get_base_model(), ids, mask)  # its layers carry the adapters
        with model.disable_adapter():
            off_plain = _plain(model, ids, mask)
        off = sequence_logprobs(AdaptersOff(model), ids, mask,
                                prompt_len=p if shared else None, actions_from=p)["logp"]
        want = sequence_logprobs(model, ids, mask, prompt_len=p if shared else None,
                                 actions_from=p)["logp"]
        with model.disable_adapter():
            want_off = sequence_logprobs(model, ids, mask, actions_from=p)["logp"]
    assert not torch.allclose(on[real], off_plain[real], atol=1e-3)  # adapters matter
    assert torch.allclose(off[:, p:], want_off[:, p:], atol=2e-5, rtol=1e-4)
    assert not torch.allclose(off[:, p:], want[:, p:], atol=1e-3)
    # the context put the adapters back
    assert all(not m.disable_adapters for m in model.modules() if hasattr(m, "lora_A"))


def test_sampler_draws_peft_tokens(tok):
    model = _lora_model(tok, "llama", 2, 5)
    ids, mask = encode_prompts(tok, ["123>", "45678>", "9>"])
    kw = dict(max_new_tokens=6, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
              temperature=1.0)
    a = generate(model, ids, mask, generator=torch.Generator().manual_seed(3), **kw)
    import os

    os.environ[fused.ENV_VAR] = "0"
    try:
        b = generate(model, ids, mask, generator=torch.Generator().manual_seed(3), **kw)
    finally:
        del os.environ[fused.ENV_VAR]
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.allclose(a.logp, b.logp, atol=1e-5)
    ref = AdaptersOff(model)
    c = generate(ref, ids, mask, generator=torch.Generator().manual_seed(3), **kw)
    with model.disable_adapter():
        os.environ[fused.ENV_VAR] = "0"
        try:
            d = generate(model, ids, mask, generator=torch.Generator().manual_seed(3), **kw)
        finally:
            del os.environ[fused.ENV_VAR]
    assert torch.equal(c.input_ids, d.input_ids)


def test_kept_concatenation_follows_an_in_place_change(tok):
    model = _lora_model(tok, "llama", 2, 11)
    ids, mask, p = _batch(tok, [4], 2, 3, random.Random(0))
    with torch.no_grad():
        before = fused.fused_logits(model, ids, mask, p)
        q = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
        q.mul_(1.5)  # frozen, changed in place
        after = fused.fused_logits(model, ids, mask, p)
        want = _plain(model, ids, mask)
    real = mask.bool()
    assert not torch.allclose(before[real], after[real], atol=1e-4)
    assert torch.allclose(after[real], want[real], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kw", [{"dropout": 0.1}, {"dora": True}])
def test_unsupported_adapters_keep_peft_forward(tok, kw):
    model = _lora_model(tok, "llama", 2, 1, **kw)
    assert fused.unsupported_reason(model) is not None
    ids, mask, p = _batch(tok, [3], 2, 2, random.Random(1))
    assert fused.fused_logits(model, ids, mask, p) is None
