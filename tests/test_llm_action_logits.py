"""Logits only where actions are: ``sequence_logprobs(actions_from=P)`` and
``fused_logits(logits_from=k)`` against the pass over every position.

A rollout's actions are its completion tokens, so the output head (a large share of a
position's cost over a real vocabulary) and the log-softmax need only run on the positions
that predict them. On random Llama, Qwen2 (fused pass) and GPT-2 (transformers' forward)
models and random left-padded, group-repeated prompts with right-padded completions: the
log-probs and entropies of every column from ``actions_from`` on, and every parameter's
gradient of a weighted sum of them, equal the full pass's; the columns before are 0.
"""

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppokit.llm.modeling import fused
from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model
from ppokit.llm.modeling.rollout import encode_prompts, sequence_logprobs

SETTINGS = settings(max_examples=15, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _model(tok, arch, seed):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
            pad_token_id=tok.pad_token_id))
    else:
        model = build_tiny_model(tok, arch=arch, hidden=32, layers=2, heads=4,
                                 intermediate=48, seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
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


def _run(model, ids, mask, p, shared, actions_from, weights):
    model.zero_grad(set_to_none=True)
    out = sequence_logprobs(model, ids, mask, with_entropy=True, temperature=0.7,
                            prompt_len=p if shared else None, actions_from=actions_from)
    ((out["logp"] + 0.3 * out["entropy"]) * weights).sum().backward()
    grads = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
    return out["logp"].detach(), out["entropy"].detach(), grads


@SETTINGS
@given(arch=st.sampled_from(["llama", "qwen2", "gpt2"]),
       groups=st.lists(st.integers(1, 6), min_size=1, max_size=4), g=st.integers(1, 3),
       t=st.integers(1, 6), shared=st.booleans(), seed=st.integers(0, 10**6))
def test_action_columns_and_gradients_equal_the_full_pass(tok, arch, groups, g, t, shared,
                                                          seed):
    model = _model(tok, arch, seed % 53)
    ids, mask, p = _batch(tok, groups, g, t, random.Random(seed))
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(seed))
    w[:, :p] = 0.0  # only the completion's columns are read
    w = w * mask
    full_lp, full_ent, full_g = _run(model, ids, mask, p, shared, None, w)
    lp, ent, grads = _run(model, ids, mask, p, shared, p, w)
    assert torch.allclose(lp[:, p:], full_lp[:, p:], atol=2e-5, rtol=1e-4)
    assert torch.allclose(ent[:, p:], full_ent[:, p:], atol=2e-5, rtol=1e-4)
    assert bool((lp[:, :p] == 0).all()) and bool((ent[:, :p] == 0).all())
    assert full_g.keys() == grads.keys()
    for k in full_g:
        assert torch.allclose(grads[k], full_g[k], atol=5e-5, rtol=1e-3), k


@SETTINGS
@given(arch=st.sampled_from(["llama", "qwen2"]),
       groups=st.lists(st.integers(1, 5), min_size=1, max_size=3), g=st.integers(1, 3),
       t=st.integers(1, 5), shared=st.booleans(), data=st.data())
def test_fused_logits_from_any_position(tok, arch, groups, g, t, shared, data):
    model = _model(tok, arch, 7)
    ids, mask, p = _batch(tok, groups, g, t, random.Random(data.draw(st.integers(0, 999))))
    k = data.draw(st.integers(0, ids.shape[1] - 1))
    with torch.no_grad():
        whole = fused.fused_logits(model, ids, mask, p if shared else None)
        part = fused.fused_logits(model, ids, mask, p if shared else None, logits_from=k)
    assert part.shape == (ids.shape[0], ids.shape[1] - k, len(tok))
    real = mask[:, k:].bool()
    assert torch.allclose(part[real], whole[:, k:][real], atol=2e-5, rtol=1e-4)


def test_entropy_without_gradient_is_the_same_statistic(tok):
    model = _model(tok, "llama", 3)
    ids, mask, p = _batch(tok, [3, 4], 2, 4, random.Random(1))
    a = sequence_logprobs(model, ids, mask, with_entropy=True, actions_from=p)
    b = sequence_logprobs(model, ids, mask, with_entropy=True, actions_from=p,
                          entropy_grad=False)
    assert a["entropy"].requires_grad and not b["entropy"].requires_grad
    assert torch.equal(a["entropy"].detach(), b["entropy"])
    assert b["logp"].requires_grad
