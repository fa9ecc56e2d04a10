"""Sequence packing (ppokit/llm/modeling/packing.py) against the padded pass.

On random Llama and Qwen2 models and random batches — prompts of random lengths, left
padded, repeated by groups or not; completions of random lengths, right padded, length 1
and all-equal included — the packed log-probs of every token whose predecessor is real,
and every parameter's gradient of a loss on the action tokens' log-probs, equal the padded
pass's: to float32 rounding (atol 1e-5 on the log-probs, 1e-4 relative on gradients), and
under bfloat16 autocast to bfloat16 rounding (the two lay the tokens out in different
matrix shapes, so the products round differently: 0.05 on log-probs, 5e-2 relative on
gradients)."""

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _tiny_decoders import random_decoder
from ppokit.llm.modeling import packing
from ppokit.llm.modeling.models import build_char_tokenizer
from ppokit.llm.modeling.rollout import encode_prompts, sequence_logprobs

SETTINGS = settings(max_examples=15, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
archs = st.sampled_from([("llama", 2, True, False), ("llama", 4, False, True),
                         ("qwen2", 1, True, True), ("qwen2", 2, True, False)])


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _model(tok, arch, kv_heads, bias, tied, seed):
    return random_decoder(tok, arch, kv_heads, bias, tied, seed, max_positions=96)


def _batch(tok, groups, g, lengths, rng):
    """Prompts (``groups``: their lengths, each repeated ``g`` times, a shared system
    prefix on all) and completions of ``lengths`` (cycled over the rows), right padded."""
    prompts = ["sys:" + "".join(str(rng.randrange(10)) for _ in range(n)) + ">"
               for n in groups]
    ids, mask = encode_prompts(tok, [p for p in prompts for _ in range(g)])
    b = ids.shape[0]
    lens = torch.tensor([lengths[i % len(lengths)] for i in range(b)])
    t = int(lens.max())
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    tail = torch.randint(3, len(tok), (b, t), generator=gen)
    tail_mask = (torch.arange(t)[None, :] < lens[:, None]).long()
    tail = torch.where(tail_mask.bool(), tail, torch.full_like(tail, tok.pad_token_id))
    return torch.cat([ids, tail], 1), torch.cat([mask, tail_mask], 1), ids.shape[1]


def _run(model, ids, mask, p, packing_value, shared):
    model.zero_grad(set_to_none=True)
    out = sequence_logprobs(model, ids, mask, prompt_len=p if shared else None,
                            actions_from=p, with_entropy=True, packing=packing_value,
                            temperature=0.7)
    act = torch.zeros_like(mask, dtype=torch.bool)
    act[:, p:] = mask[:, p:].bool()
    w = torch.linspace(-1, 1, ids.shape[1], device=ids.device)[None]
    loss = (out["logp"] * act * w).sum() + 0.1 * (out["entropy"] * act).sum()
    loss.backward()
    grads = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
    return out["logp"].detach(), out["entropy"].detach(), act, grads


def _compare(tok, arch, groups, g, lengths, shared, seed, bf16, device="cpu"):
    rng = random.Random(seed)
    model = _model(tok, *arch, seed).to(device)
    ids, mask, p = _batch(tok, groups, g, lengths, rng)
    ids, mask = ids.to(device), mask.to(device)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        lp0, ent0, act, g0 = _run(model, ids, mask, p, "off", shared)
        lp1, ent1, _, g1 = _run(model, ids, mask, p, "on", shared)
    atol, rtol = (5e-2, 5e-2) if bf16 else (1e-5, 1e-4)
    torch.testing.assert_close(lp1[act], lp0[act], atol=atol, rtol=0)
    torch.testing.assert_close(ent1[act], ent0[act], atol=atol, rtol=0)
    # a token after padding is never read; packing leaves 0 there
    assert set(g0) == set(g1)
    for name in g0:
        scale = float(g0[name].abs().max()) + 1e-6
        torch.testing.assert_close(g1[name], g0[name], atol=rtol * scale, rtol=0,
                                   msg=lambda m, n=name: f"{n}: {m}")


lengths_st = st.one_of(st.lists(st.integers(1, 12), min_size=1, max_size=6),
                       st.integers(1, 12).map(lambda n: [n]),  # all equal
                       st.just([1]))


@SETTINGS
@given(arch=archs, groups=st.lists(st.integers(0, 6), min_size=1, max_size=3),
       g=st.integers(1, 3), lengths=lengths_st, shared=st.booleans(),
       seed=st.integers(0, 2**16))
def test_packed_float32_equals_padded(tok, arch, groups, g, lengths, shared, seed):
    _compare(tok, arch, groups, g, lengths, shared, seed, bf16=False)


@SETTINGS
@given(arch=archs, groups=st.lists(st.integers(0, 6), min_size=1, max_size=3),
       g=st.integers(1, 3), lengths=lengths_st, shared=st.booleans(),
       seed=st.integers(0, 2**16))
def test_packed_bfloat16_equals_padded(tok, arch, groups, g, lengths, shared, seed):
    _compare(tok, arch, groups, g, lengths, shared, seed, bf16=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(arch=archs, groups=st.lists(st.integers(0, 6), min_size=1, max_size=3),
       g=st.integers(1, 3), lengths=lengths_st, shared=st.booleans(),
       seed=st.integers(0, 2**16), bf16=st.booleans())
def test_on_cuda_packed_equals_padded(tok, arch, groups, g, lengths, shared, seed, bf16):
    _compare(tok, arch, groups, g, lengths, shared, seed, bf16, device="cuda")


def test_packing_really_drops_the_padding(tok, monkeypatch):
    """The packed layout holds the real tokens only (not a padded pass relabelled)."""
    from ppokit.llm.modeling import fused

    seen = []
    real_init = fused._Layout.__init__

    def spy(self, *a, **k):
        real_init(self, *a, **k)
        seen.append(self.tok.shape[0])

    monkeypatch.setattr(fused._Layout, "__init__", spy)
    model = _model(tok, "llama", 2, False, True, 0)
    ids, mask, p = _batch(tok, [3, 4], 2, [1, 9, 2, 5], random.Random(0))
    sequence_logprobs(model, ids, mask, prompt_len=p, packing="off")
    sequence_logprobs(model, ids, mask, prompt_len=p, packing="on")
    padded, packed = seen
    assert padded - packed == int((1 - mask[:, p:]).sum()) > 0


def test_auto_packs_by_the_share_of_padding():
    p = 2
    even = torch.ones(4, 10, dtype=torch.long)
    skewed = even.clone()
    skewed[1:, p + 3:] = 0
    assert not packing.wants_packing("auto", even, p)
    assert packing.wants_packing("auto", skewed, p)
    assert packing.wants_packing("on", even, p)
    assert not packing.wants_packing("off", skewed, p)


def test_uncovered_models_run_the_padded_pass(tok):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2,
                                       n_positions=64)).eval()
    ids, mask, p = _batch(tok, [3], 2, [1, 6], random.Random(1))
    a = sequence_logprobs(model, ids, mask, prompt_len=p, packing="on")["logp"]
    b = sequence_logprobs(model, ids, mask, prompt_len=p, packing="off")["logp"]
    assert torch.equal(a, b)


def test_the_trainer_packs_and_trains_as_the_padded_pass(tmp_path, monkeypatch):
    """``packing = "on"``: the update's and the scoring passes' forward are packed, and an
    iteration's losses, entropy and gradient norm are the padded run's to float32 rounding."""
    from ppokit.llm.modeling import fused
    from ppokit.llm.training.trainer import LLMConfig, TokenTrainer

    calls = []
    real = fused._forward

    def spy(*a, **k):
        calls.append(a[-1] if len(a) > 7 else k.get("pack", False))
        return real(*a, **k)

    monkeypatch.setattr(fused, "_forward", spy)
    recs = {}
    for mode in ("off", "on"):
        tr = TokenTrainer(LLMConfig(algo="grpo", iterations=1, prompts_per_iter=4,
                                    samples_per_prompt=2, packing=mode, seed=3,
                                    old_logprobs="recompute"),
                          str(tmp_path / mode), log=lambda *a: None)
        calls.clear()  # (the built-in model's warm start runs its own, padded, passes)
        try:
            recs[mode] = tr.train_iteration()
        finally:
            tr.close()
        assert calls and all(c == (mode == "on") for c in calls)
    for key in ("policy_loss", "kl_loss", "entropy", "approx_kl", "grad_norm"):
        assert recs["on"][key] == pytest.approx(recs["off"][key], rel=1e-4, abs=1e-6), key
