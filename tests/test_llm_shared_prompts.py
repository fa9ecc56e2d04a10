"""The token trainer's fast paths against the plain forward pass, on random inputs.

- ``sequence_logprobs(prompt_len=P)`` computes each distinct prompt once and lets the rows
  of its group attend to its keys and values: log-probs, entropies, hidden states and the
  gradient of every parameter equal the plain single forward pass's to float rounding.
- ``generate`` returns the log-prob of each token it drew (the trainer's old log-probs by
  default): equal to a fresh full forward pass over the finished sequences.
- ``generate`` prefills each distinct prompt once and decodes into preallocated key/value
  buffers: greedy decoding of a batch with repeated prompts gives every row the tokens the
  prompt gets alone, through the in-place buffers and past their capacity.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model
from ppokit.llm.modeling.rollout import (
    _cache_keyword,
    _cache_of,
    _decode_cache,
    encode_prompts,
    generate,
    position_ids_from_mask,
    sequence_logprobs,
)

SETTINGS = settings(max_examples=8, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def models(tok):
    return {arch: build_tiny_model(tok, arch=arch, seed=3) for arch in ("llama", "gpt2")}


def _batch(tok, draw_groups, g, t, rng):
    """Left-padded prompts repeated ``g`` times each, then ``t`` right-padded tokens."""
    prompts = ["".join(str(rng.randrange(10)) for _ in range(n)) + ">" for n in draw_groups]
    ids, mask = encode_prompts(tok, [p for p in prompts for _ in range(g)])
    b = ids.shape[0]
    tail = torch.randint(3, len(tok), (b, t), generator=torch.Generator().manual_seed(
        rng.randrange(2**31)))
    lengths = torch.tensor([rng.randint(1, t) for _ in range(b)])
    tail_mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    tail = torch.where(tail_mask.bool(), tail, torch.full_like(tail, tok.pad_token_id))
    return torch.cat([ids, tail], 1), torch.cat([mask, tail_mask], 1), ids.shape[1]


@SETTINGS
@given(arch=st.sampled_from(["llama", "gpt2"]),
       groups=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       g=st.integers(1, 4), t=st.integers(1, 6), temperature=st.sampled_from([1.0, 0.7]),
       seed=st.integers(0, 10**6))
def test_shared_prompt_forward_equals_the_plain_forward(tok, models, arch, groups, g, t,
                                                        temperature, seed):
    import random

    model = models[arch]
    ids, mask, p = _batch(tok, groups, g, t, random.Random(seed))
    out, grads = {}, {}
    for name, plen in (("plain", None), ("shared", p)):
        model.zero_grad()
        res = sequence_logprobs(model, ids, mask, temperature=temperature, with_entropy=True,
                                with_hidden=True, prompt_len=plen)
        act = mask.bool().clone()
        act[:, :p] = False
        loss = (res["logp"] * act).sum() + 0.1 * (res["entropy"] * act).sum()
        loss.backward()
        out[name] = res
        grads[name] = [q.grad.clone() for q in model.parameters()]
    real = mask.bool()
    real[:, 0] = False  # column 0 is never an action
    for key in ("logp", "entropy"):
        diff = (out["plain"][key] - out["shared"][key])[real].abs().max()
        assert diff < 1e-5, (key, float(diff))
    h = (out["plain"]["hidden"] - out["shared"]["hidden"])[mask.bool()].abs().max()
    assert h < 1e-4
    for a, b in zip(grads["plain"], grads["shared"], strict=True):
        scale = a.abs().max().clamp(min=1e-6)
        assert ((a - b).abs().max() / scale) < 1e-4


@SETTINGS
@given(arch=st.sampled_from(["llama", "gpt2"]),
       groups=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       g=st.integers(1, 4), temperature=st.sampled_from([1.0, 0.7, 1.5]),
       seed=st.integers(0, 10**6))
def test_sampler_logprobs_equal_a_fresh_forward(tok, models, arch, groups, g, temperature,
                                                seed):
    import random

    rng = random.Random(seed)
    model = models[arch].eval()
    prompts = ["".join(str(rng.randrange(10)) for _ in range(n)) + ">" for n in groups]
    ids, mask = encode_prompts(tok, [q for q in prompts for _ in range(g)])
    roll = generate(model, ids, mask, max_new_tokens=6, eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id, temperature=temperature,
                    generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        fresh = sequence_logprobs(model, roll.input_ids, roll.attention_mask,
                                  temperature=temperature)["logp"]
    am = roll.action_mask
    assert roll.logp.shape == roll.input_ids.shape
    assert (roll.logp[~am] == 0).all()
    assert (roll.logp[am] - fresh[am]).abs().max() < 1e-5
    assert (roll.logp[am] <= 0).all()


@SETTINGS
@given(arch=st.sampled_from(["llama", "gpt2"]),
       groups=st.lists(st.integers(1, 6), min_size=2, max_size=4), g=st.integers(2, 3),
       seed=st.integers(0, 10**6))
def test_greedy_decoding_of_repeated_prompts_equals_each_prompt_alone(tok, models, arch,
                                                                      groups, g, seed):
    import random

    rng = random.Random(seed)
    model = models[arch].eval()
    prompts = ["".join(str(rng.randrange(10)) for _ in range(n)) + ">" for n in groups]
    ids, mask = encode_prompts(tok, [q for q in prompts for _ in range(g)])
    kw = {"max_new_tokens": 6, "eos_token_id": tok.eos_token_id,
          "pad_token_id": tok.pad_token_id, "temperature": 0.0}
    together = generate(model, ids, mask, **kw)
    for i, q in enumerate(prompts):
        alone = generate(model, *encode_prompts(tok, [q]), **kw)
        for r in range(i * g, (i + 1) * g):
            assert together.response_ids[r] == alone.response_ids[0]


def test_decode_buffers_grow_past_their_capacity(tok, models):
    """Decoding writes into buffers sized at prefill; a step past them falls back to
    growing, with the same logits as the stock cache."""
    model = models["llama"].eval()
    ids, mask = encode_prompts(tok, ["12>", "3456>"])
    pos = position_ids_from_mask(mask)
    caches = {}
    with torch.no_grad():
        for name, cap in (("stock", None), ("small", ids.shape[1] + 1)):
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
            cache = _cache_of(out)
            if cap is not None:
                cache = _decode_cache(cache, None, cap)
                assert type(cache.layers[0]).__name__ == "_FilledInPlace"
            attn, nxt, logits = mask, pos[:, -1:] + 1, []
            for step in range(4):
                attn = torch.cat([attn, torch.ones(2, 1, dtype=torch.long)], 1)
                o = model(input_ids=torch.full((2, 1), 5 + step), attention_mask=attn,
                          position_ids=nxt, use_cache=True, **{_cache_keyword(model): cache})
                cache, nxt = _cache_of(o), nxt + 1
                logits.append(o.logits[:, -1])
            caches[name] = torch.stack(logits)
    assert (caches["stock"] - caches["small"]).abs().max() < 1e-5


def test_a_model_that_keeps_no_cache_gets_the_plain_pass(tok):
    """Gradient checkpointing turns the key/value cache off in training: the shared pass
    falls back to the plain one instead of failing."""
    import random

    model = build_tiny_model(tok, seed=5)
    model.gradient_checkpointing_enable()
    model.train()
    ids, mask, p = _batch(tok, [3, 4], 3, 4, random.Random(1))
    a = sequence_logprobs(model, ids, mask, prompt_len=p)["logp"]
    b = sequence_logprobs(model, ids, mask)["logp"]
    assert torch.equal(a, b)
