"""Prompts that share a prefix (a chat template's system prompt): the fused pass and the
sampler compute the shared tokens once (ppokit/llm/modeling/fused.py, ``_Layout``'s root).

On random Llama and Qwen2 models with prompts that start with a common prefix of random
length and then differ (random lengths, left padded, groups of completions): the logits
of every position that is read and every parameter's gradient equal transformers'
forward; the sampler's greedy and seeded tokens and log-probs equal transformers'
cached decoding; its step-by-step logits equal the whole-sequence pass; a prefix shorter
than ``ROOT_MIN``, or output read from a prefix position, falls back to the layout
without a root (same results).
"""

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppokit.llm.modeling import fused
from ppokit.llm.modeling.models import build_char_tokenizer
from ppokit.llm.modeling.rollout import encode_prompts, generate, position_ids_from_mask

SETTINGS = settings(max_examples=12, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _model(tok, arch, kv, seed):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=kv, intermediate_size=48,
                  max_position_embeddings=96, pad_token_id=tok.pad_token_id)
    model = (Qwen2ForCausalLM(Qwen2Config(**common)) if arch == "qwen2"
             else LlamaForCausalLM(LlamaConfig(**common)))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _prompts(rng, prefix_len, lengths):
    prefix = "".join(rng.choice("abcdefgh:|") for _ in range(prefix_len))
    return [prefix + "".join(str(rng.randrange(10)) for _ in range(n)) + ">" for n in lengths]


def _batch(tok, prompts, g, t, rng):
    ids, mask = encode_prompts(tok, [p for p in prompts for _ in range(g)])
    b = ids.shape[0]
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    tail = torch.randint(3, len(tok), (b, t), generator=gen)
    lengths = torch.tensor([rng.randint(1, t) for _ in range(b)])
    tail_mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    tail = torch.where(tail_mask.bool(), tail, torch.full_like(tail, tok.pad_token_id))
    return torch.cat([ids, tail], 1), torch.cat([mask, tail_mask], 1), ids.shape[1]


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@SETTINGS
@given(arch=st.sampled_from(["llama", "qwen2"]), kv=st.sampled_from([1, 2, 4]),
       prefix_len=st.integers(0, 12), lengths=st.lists(st.integers(0, 5), min_size=2,
                                                          max_size=4),
       g=st.integers(1, 3), t=st.integers(1, 5), min_prompts=st.integers(0, 6),
       seed=st.integers(0, 10**6))
def test_shared_prefix_logits_and_gradients_equal_transformers(tok, arch, kv, prefix_len,
                                                               lengths, g, t, min_prompts,
                                                               seed):
    rng = random.Random(seed)
    model = _model(tok, arch, kv, seed % 41)
    ids, mask, p = _batch(tok, _prompts(rng, prefix_len, lengths), g, t, rng)
    real = mask.bool()
    want_from = p - 1  # the trainer's: the prompt's last position on
    w = torch.randn(*ids.shape, len(tok), generator=torch.Generator().manual_seed(seed))
    w = w * real[..., None]
    w[:, :want_from] = 0
    model.zero_grad(set_to_none=True)
    ref = model(input_ids=ids, attention_mask=mask,
                position_ids=position_ids_from_mask(mask)).logits
    (ref * w).sum().backward()
    ref_g = _grads(model)
    model.zero_grad(set_to_none=True)
    got = fused.fused_logits(model, ids, mask, p, min_prompts=min_prompts,
                             logits_from=want_from)
    (got * w[:, want_from:]).sum().backward()
    got_g = _grads(model)
    r = real[:, want_from:]
    assert torch.allclose(got[r], ref[:, want_from:][r].detach(), atol=2e-5, rtol=1e-4)
    for k in ref_g:
        assert torch.allclose(got_g[k], ref_g[k], atol=5e-5, rtol=1e-3), k


def test_the_root_is_used_and_a_short_prefix_is_not(tok):
    rng = random.Random(0)
    ids, mask = encode_prompts(tok, _prompts(rng, 8, [2, 4, 3]))
    first = torch.arange(3)
    pos = position_ids_from_mask(mask)
    lay = fused._Layout(ids, mask, pos, ids.shape[1], first, first, ids.shape[1] - 1)
    assert lay.c == 9 and lay.hp == 5  # BOS + the 8 shared characters; 4 digits + ">"
    assert lay.tok.numel() == 9 + 3 * 5
    ids2, mask2 = encode_prompts(tok, _prompts(rng, 1, [2, 4, 3]))
    lay2 = fused._Layout(ids2, mask2, position_ids_from_mask(mask2), ids2.shape[1], first,
                         first, ids2.shape[1] - 1)
    assert lay2.c == 0 and lay2.hp == ids2.shape[1]
    # reading a column inside the shared prefix: no root
    lay3 = fused._Layout(ids, mask, pos, ids.shape[1], first, first, 2)
    assert lay3.c == 0


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arch=st.sampled_from(["llama", "qwen2"]), prefix_len=st.integers(3, 10),
       lengths=st.lists(st.integers(0, 5), min_size=2, max_size=3), g=st.integers(1, 3),
       seed=st.integers(0, 10**6))
def test_sampler_with_a_shared_prefix_equals_transformers(tok, monkeypatch, arch, prefix_len,
                                                          lengths, g, seed):
    rng = random.Random(seed)
    model = _model(tok, arch, 2, seed % 37)
    ids, mask = encode_prompts(tok, [q for q in _prompts(rng, prefix_len, lengths)
                                     for _ in range(g)])
    outs = {}
    for env in ("1", "0"):
        monkeypatch.setenv(fused.ENV_VAR, env)
        for temp in (0.0, 1.0):
            outs[env, temp] = generate(model, ids, mask, max_new_tokens=6,
                                       eos_token_id=tok.eos_token_id,
                                       pad_token_id=tok.pad_token_id, temperature=temp,
                                       generator=torch.Generator().manual_seed(seed))
    for temp in (0.0, 1.0):
        a, b = outs["1", temp], outs["0", temp]
        assert torch.equal(a.input_ids, b.input_ids)
        assert torch.allclose(a.logp, b.logp, atol=1e-5)


def test_sampler_steps_with_a_root_equal_the_whole_sequence_pass(tok):
    rng = random.Random(3)
    model = _model(tok, "llama", 2, 3)
    ids, mask, p = _batch(tok, _prompts(rng, 7, [0, 3, 5]), 2, 6, rng)
    pos = position_ids_from_mask(mask)
    with torch.no_grad():
        s = fused.FusedSampler(model, ids.shape[1], ids.device)
        from ppokit.llm.modeling.positions import distinct_prompts

        first, rows = distinct_prompts(ids[:, :p], mask[:, :p])
        out = [s.prefill(ids[first, :p], mask[first, :p], rows)]
        for j in range(p, ids.shape[1] - 1):
            out.append(s.step(ids[:, j], pos[:, j], mask[:, j].bool()))
        step_logits = torch.stack(out, 1)
        whole = fused.fused_logits(model, ids, mask, p)[:, p - 1:-1]
    seen = mask.bool()[:, p - 1:-1]
    assert torch.allclose(step_logits[seen], whole[seen], atol=1e-5, rtol=1e-4)
