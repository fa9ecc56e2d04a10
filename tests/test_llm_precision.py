"""precision=bf16 in the token trainer: attention computed in float32 inside bfloat16
autocast (ppokit.llm.modeling.precision) against transformers' own sdpa attention, on random
left-padded batches of Llama- and GPT-2-architecture models."""

import copy
import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppokit.llm.modeling.models import (
    build_char_tokenizer,
    build_tiny_model,
    frozen_copy,
    save_policy,
)
from ppokit.llm.modeling.precision import ATTENTION, frozen_linears_to_bf16, use_float32_attention
from ppokit.llm.modeling.rollout import sequence_logprobs

SETTINGS = settings(max_examples=10, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def pairs(tok):
    """Each architecture as built (sdpa) and a copy with ppokit's float32 attention."""
    out = {}
    for arch in ("llama", "gpt2"):
        plain = build_tiny_model(tok, arch=arch, seed=5)
        fast = copy.deepcopy(plain)
        assert use_float32_attention(fast)
        assert fast.config._attn_implementation == ATTENTION
        assert plain.config._attn_implementation == "sdpa"
        out[arch] = (plain, fast)
    return out


def _batch(tok, rows, length, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, len(tok), (rows, length), generator=g)
    pads = torch.randint(0, length - 1, (rows,), generator=g)
    mask = (torch.arange(length)[None, :] >= pads[:, None]).long()  # left padding
    return torch.where(mask.bool(), ids, torch.full_like(ids, tok.pad_token_id)), mask


@SETTINGS
@given(arch=st.sampled_from(["llama", "gpt2"]), rows=st.integers(1, 5),
       length=st.integers(2, 12), seed=st.integers(0, 10**6))
def test_float32_attention_is_sdpa(tok, pairs, arch, rows, length, seed):
    """In float32 the two attentions are the same computation: equal log-probs and
    gradients. Under bfloat16 autocast ppokit's keeps attention in float32, so its
    log-probs are at least as close to the float32 ones as sdpa's own bfloat16 ones
    (within bfloat16 rounding of both)."""
    plain, fast = pairs[arch]
    ids, mask = _batch(tok, rows, length, seed)
    am = mask.bool()
    am[:, 0] = False  # the first position has no log-prob
    lps, grads = [], []
    for model in (plain, fast):
        model.zero_grad()
        lp = sequence_logprobs(model, ids, mask)["logp"]
        lp[am].sum().backward()
        lps.append(lp.detach())
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    torch.testing.assert_close(lps[1], lps[0], rtol=0, atol=1e-5)
    for a, b in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        low_fast = sequence_logprobs(fast, ids, mask)["logp"]
        low_plain = sequence_logprobs(plain, ids, mask)["logp"]
    assert low_fast.dtype == torch.float32
    err_fast = (low_fast - lps[0])[am].abs().max()
    err_plain = (low_plain - lps[0])[am].abs().max()
    assert err_fast < 0.05 and err_plain < 0.05


def test_a_lora_run_in_bf16_starts_with_float32_attention(tok, tmp_path):
    """A LoRA run's reference is the policy with its adapters off, a module without
    parameters of its own: bf16 precision gives the policy float32 attention and passes
    over the reference (a run on a pretrained model, LoRA by default, stopped at its
    start with StopIteration before)."""
    pytest.importorskip("peft")
    from ppokit.llm.modeling.models import AdaptersOff
    from ppokit.llm.training.config import LLMConfig
    from ppokit.llm.training.trainer import TokenTrainer

    assert use_float32_attention(AdaptersOff(build_tiny_model(tok, seed=0))) is False
    cfg = LLMConfig(algo="grpo", lora_r=4, precision="bf16", prompts_per_iter=2,
                    samples_per_prompt=2, iterations=1, sft_steps=2, checkpoint_every=1000)
    tr = TokenTrainer(cfg, str(tmp_path / "run"), policy=build_tiny_model(tok, seed=0),
                      tokenizer=tok, log=lambda *a: None)
    assert isinstance(tr.reference, AdaptersOff)
    assert tr.policy.base_model.model.config._attn_implementation == ATTENTION
    assert math.isfinite(tr.train_iteration()["policy_loss"])
    tr.close()


def test_the_choice_is_not_saved_with_the_model(tok, pairs, tmp_path):
    _, fast = pairs["llama"]
    save_policy(fast, tok, str(tmp_path / "m"))
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert ATTENTION not in json.dumps(cfg)


@SETTINGS
@given(arch=st.sampled_from(["llama", "gpt2"]), rows=st.integers(1, 5),
       length=st.integers(2, 12), seed=st.integers(0, 10**6))
def test_reference_stored_in_bf16_computes_the_same_numbers(tok, arch, rows, length, seed):
    """The frozen reference's linear layers stored in bfloat16: under autocast the same
    log-probs bit for bit (autocast rounds those weights to bfloat16 anyway); the
    embedding (and a head tied to it) stays float32."""
    ref = frozen_copy(build_tiny_model(tok, arch=arch, seed=7))
    stored = copy.deepcopy(ref)
    n = frozen_linears_to_bf16(stored)
    linears = [m for m in stored.modules() if isinstance(m, torch.nn.Linear)]
    emb = stored.get_input_embeddings().weight
    assert emb.dtype == torch.float32
    assert n == sum(m.weight is not emb for m in linears)
    assert n > 0 or arch == "gpt2"  # GPT-2's projections are transformers' Conv1D
    assert all(m.weight.dtype == torch.bfloat16 for m in linears if m.weight is not emb)
    ids, mask = _batch(tok, rows, length, seed)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        a = sequence_logprobs(ref, ids, mask)["logp"]
        b = sequence_logprobs(stored, ids, mask)["logp"]
    assert torch.equal(a, b)
