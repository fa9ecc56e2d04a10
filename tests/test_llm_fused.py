"""The fused decoder forward (ppokit/llm/modeling/fused.py) against transformers' own forward.

On random Llama and Qwen2 models (grouped-query attention, attention and MLP biases, tied
and separate heads) and random batches (prompts of random lengths, left padded, repeated
by groups; completions of random lengths, right padded):

- float32: the logits of every real position and the gradient of every parameter equal
  transformers' to float rounding, with and without shared prompts and with prompt rows
  padded to a fixed count;
- bfloat16 autocast (the trainer's ``precision = bf16``): within bfloat16 rounding of
  transformers' forward in the same format (float32 attention on the CPU), and no farther
  from the float32 result than it;
- a model the pass does not cover (GPT-2, forward hooks, ``PPOKIT_FUSED_FORWARD=0``)
  returns None and ``sequence_logprobs`` runs transformers' forward instead.
"""

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _tiny_decoders import random_decoder
from ppokit.llm.modeling import fused
from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model
from ppokit.llm.modeling.precision import frozen_linears_to_bf16, use_float32_attention
from ppokit.llm.modeling.rollout import encode_prompts, position_ids_from_mask, sequence_logprobs

SETTINGS = settings(max_examples=12, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _model(tok, arch, kv_heads, bias, tied, seed):
    return random_decoder(tok, arch, kv_heads, bias, tied, seed, max_positions=64)


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


def _reference_logits(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask,
                 position_ids=position_ids_from_mask(mask)).logits


def _logits_and_grads(model, fn, weights):
    model.zero_grad(set_to_none=True)
    logits = fn()
    (logits.float() * weights).sum().backward()
    return logits.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters()
                                     if p.grad is not None}


archs = st.tuples(st.sampled_from(["llama", "qwen2"]), st.sampled_from([1, 2, 4]),
                  st.booleans(), st.booleans())


@SETTINGS
@given(arch=archs, groups=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       g=st.integers(1, 4), t=st.integers(1, 6), shared=st.booleans(),
       pad_to=st.integers(0, 3), seed=st.integers(0, 10**6))
def test_float32_logits_and_gradients_equal_transformers(tok, arch, groups, g, t, shared,
                                                         pad_to, seed):
    name, kv, bias, tied = arch
    model = _model(tok, name, kv, bias, tied, seed % 97)
    ids, mask, p = _batch(tok, groups, g, t, random.Random(seed))
    real = mask.bool()
    w = torch.randn(*ids.shape, len(tok), generator=torch.Generator().manual_seed(seed))
    w = w * real[..., None]  # only real positions count (padding outputs are never read)
    min_prompts = len(groups) + pad_to if shared else 0
    ref, ref_g = _logits_and_grads(model, lambda: _reference_logits(model, ids, mask), w)
    got, got_g = _logits_and_grads(
        model, lambda: fused.fused_logits(model, ids, mask, p if shared else None,
                                          min_prompts=min_prompts), w)
    assert torch.allclose(got[real], ref[real], atol=2e-5, rtol=1e-4)
    assert ref_g.keys() == got_g.keys()
    for k in ref_g:
        assert torch.allclose(got_g[k], ref_g[k], atol=5e-5, rtol=1e-3), k


@SETTINGS
@given(arch=archs, groups=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       g=st.integers(1, 4), t=st.integers(1, 6), frozen=st.booleans(),
       seed=st.integers(0, 10**6))
def test_bfloat16_autocast_is_transformers_to_bfloat16_rounding(tok, arch, groups, g, t,
                                                                frozen, seed):
    """Under autocast, the fused pass and transformers' (with the trainer's float32
    attention) are each within bfloat16 rounding of the float32 logits, and of each
    other; ``frozen``: the reference model's linear layers stored in bfloat16."""
    name, kv, bias, tied = arch
    model = _model(tok, name, kv, bias, tied, seed % 89)
    use_float32_attention(model)
    ids, mask, p = _batch(tok, groups, g, t, random.Random(seed))
    real = mask.bool()
    with torch.no_grad():
        exact = _reference_logits(model, ids, mask).float()
        if frozen:
            for q in model.parameters():
                q.requires_grad_(False)
            frozen_linears_to_bf16(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hf = _reference_logits(model, ids, mask).float()
            got = fused.fused_logits(model, ids, mask, p).float()
    err_hf = (hf - exact)[real].abs()
    err = (got - exact)[real].abs()
    scale = exact[real].abs().max()
    assert err.max() <= 0.05 * scale
    assert err.mean() <= 2 * err_hf.mean() + 1e-3 * scale
    assert (got - hf)[real].abs().max() <= 0.05 * scale


def test_padded_prompt_rows_change_nothing(tok):
    model = _model(tok, "qwen2", 2, True, True, 1)
    ids, mask, p = _batch(tok, [3, 5], 3, 4, random.Random(0))
    w = torch.randn(*ids.shape, len(tok)) * mask.bool()[..., None]
    a, ga = _logits_and_grads(model, lambda: fused.fused_logits(model, ids, mask, p), w)
    b, gb = _logits_and_grads(
        model, lambda: fused.fused_logits(model, ids, mask, p, min_prompts=6), w)
    real = mask.bool()
    assert torch.allclose(a[real], b[real], atol=1e-6)
    for k in ga:
        assert torch.allclose(ga[k], gb[k], atol=1e-6), k


def test_uncovered_models_fall_back_to_transformers(tok, monkeypatch):
    ids, mask, p = _batch(tok, [2, 4], 2, 3, random.Random(1))
    gpt2 = build_tiny_model(tok, arch="gpt2")
    assert fused.unsupported_reason(gpt2) == "architecture GPT2LMHeadModel"
    assert fused.fused_logits(gpt2, ids, mask, p) is None

    llama = build_tiny_model(tok)
    assert fused.unsupported_reason(llama) is None
    handle = llama.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert fused.unsupported_reason(llama) == "forward hooks on LlamaMLP"
    handle.remove()

    class Quantised(torch.nn.Linear):  # stands for a replaced projection (e.g. 4-bit)
        pass

    other = build_tiny_model(tok)
    old = other.model.layers[1].mlp.up_proj
    other.model.layers[1].mlp.up_proj = Quantised(old.in_features, old.out_features,
                                                  bias=False)
    assert fused.unsupported_reason(other) == "projection of type Quantised"
    monkeypatch.setenv(fused.ENV_VAR, "0")
    assert fused.fused_logits(llama, ids, mask, p) is None
    off = sequence_logprobs(llama, ids, mask, prompt_len=p)["logp"]
    monkeypatch.delenv(fused.ENV_VAR)
    on = sequence_logprobs(llama, ids, mask, prompt_len=p)["logp"]
    act = mask.bool().clone()
    act[:, : p + 1] = False
    assert torch.allclose(on[act], off[act], atol=1e-5)


def test_the_trainer_runs_the_fused_pass(tok, tmp_path, monkeypatch):
    """The built-in model is a Llama: the update's and the reference's forward passes go
    through the fused pass, and an iteration trains."""
    from ppokit.llm.training.trainer import LLMConfig, TokenTrainer

    calls = []
    real = fused._forward

    def spy(*a, **k):
        calls.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(fused, "_forward", spy)
    tr = TokenTrainer(LLMConfig(algo="grpo", iterations=1, prompts_per_iter=4,
                                samples_per_prompt=2), str(tmp_path / "run"),
                      log=lambda *a: None)
    try:
        rec = tr.train_iteration()
    finally:
        tr.close()
    assert any(m is tr.policy for m in calls) and any(m is tr.reference for m in calls)
    assert rec["grad_norm"] > 0


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arch=archs, groups=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       g=st.integers(1, 3), seed=st.integers(0, 10**6))
def test_fused_sampling_equals_transformers_cached_decoding(tok, monkeypatch, arch, groups,
                                                            g, seed):
    """Greedy decoding through the fused sampler gives transformers' tokens, and the
    log-prob of each drawn token to float rounding; sampling with one seed gives the
    same tokens too."""
    from ppokit.llm.modeling.rollout import generate

    name, kv, bias, tied = arch
    model = _model(tok, name, kv, bias, tied, seed % 83)
    rng = random.Random(seed)
    prompts = ["".join(str(rng.randrange(10)) for _ in range(n)) + ">" for n in groups]
    ids, mask = encode_prompts(tok, [q for q in prompts for _ in range(g)])
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
        assert torch.equal(a.action_mask, b.action_mask)
        assert torch.allclose(a.logp, b.logp, atol=1e-5)


def _teacher_forced(model, ids, mask, p):
    """The sampler's next-token logits after the prompt and after each later token of
    ``ids`` (fed one at a time): ``[B, L - p, V]``, positions p-1 … L-2."""
    pos = position_ids_from_mask(mask)
    s = fused.FusedSampler(model, ids.shape[1], ids.device)
    out = [s.prefill(ids[:, :p], mask[:, :p])]
    for j in range(p, ids.shape[1] - 1):
        out.append(s.step(ids[:, j], pos[:, j], mask[:, j].bool()))
    return torch.stack(out, 1)


def test_sampler_steps_equal_the_whole_sequence_pass(tok):
    model = _model(tok, "qwen2", 2, True, False, 5)
    ids, mask, p = _batch(tok, [1, 4, 6], 2, 6, random.Random(5))
    with torch.no_grad():
        step_logits = _teacher_forced(model, ids, mask, p)
        whole = fused.fused_logits(model, ids, mask, p)[:, p - 1:-1]
    seen = mask.bool()[:, p - 1:-1]
    assert torch.allclose(step_logits[seen], whole[seen], atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("arch", [("llama", 2, True, False), ("qwen2", 1, True, True)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_on_cuda_the_fused_pass_equals_transformers(tok, arch, seed):
    """On a GPU: float32 logits and gradients as on the CPU; under bfloat16 autocast
    (attention then in bfloat16, as autocast runs transformers' there) within bfloat16
    rounding of the float32 logits; the sampler's incremental logits, fed the sequences
    token by token, equal the whole-sequence pass's."""
    name, kv, bias, tied = arch
    dev = torch.device("cuda")
    model = _model(tok, name, kv, bias, tied, seed).to(dev)
    ids, mask, p = _batch(tok, [2, 5, 3], 3, 5, random.Random(seed))
    ids, mask = ids.to(dev), mask.to(dev)
    real = mask.bool()
    w = torch.randn(*ids.shape, len(tok), device=dev) * real[..., None]
    ref, ref_g = _logits_and_grads(model, lambda: _reference_logits(model, ids, mask), w)
    got, got_g = _logits_and_grads(
        model, lambda: fused.fused_logits(model, ids, mask, p, min_prompts=4), w)
    assert torch.allclose(got[real], ref[real], atol=1e-4, rtol=1e-3)
    for k in ref_g:
        assert torch.allclose(got_g[k], ref_g[k], atol=2e-4, rtol=1e-2), k
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        hf = _reference_logits(model, ids, mask).float()
        low = fused.fused_logits(model, ids, mask, p).float()
    scale = ref[real].abs().max()
    err_hf, err = (hf - ref)[real].abs(), (low - ref)[real].abs()
    assert err.max() <= 0.05 * scale
    assert err.mean() <= 2 * err_hf.mean() + 1e-3 * scale
    with torch.no_grad():
        step_logits = _teacher_forced(model, ids, mask, p)
        whole = fused.fused_logits(model, ids, mask, p)[:, p - 1:-1]
    seen = real[:, p - 1:-1]
    assert torch.allclose(step_logits[seen], whole[seen], atol=1e-4, rtol=1e-3)
