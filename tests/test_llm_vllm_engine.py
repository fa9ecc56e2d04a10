"""vLLM as the rollout engine (ppokit.llm.engines.vllm_engine), on a tiny Llama: its
log-probs against the trainer's on the same tokens, the weights pushed after an update,
and the probe that fails when they are not. Runs only where vLLM is installed (`make
vllm`: .venv-vllm/bin/python -m pytest tests/test_llm_vllm_engine.py); vLLM starts its
engine in processes of its own, once for the module."""

import pytest
import torch

pytest.importorskip("vllm")

from ppokit.llm.engines import EngineOutOfSync  # noqa: E402
from ppokit.llm.engines.vllm_engine import VllmEngine  # noqa: E402
from ppokit.llm.engines.weights import PROBE_TOLERANCE  # noqa: E402
from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model  # noqa: E402
from ppokit.llm.modeling.rollout import sequence_logprobs  # noqa: E402
from ppokit.llm.training.trainer import LLMConfig, TokenTrainer  # noqa: E402


def _model(tok):
    # vLLM's CPU attention takes heads of 32 dimensions or more (the built-in's are 16)
    return build_tiny_model(tok, hidden=128, heads=2, layers=2, intermediate=256,
                            max_positions=128, seed=0)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A GRPO trainer on the reverse task, full fine-tuning, sampling with vLLM (float32
    in both, so that the tolerance is tight and an update is far beyond it)."""
    tok = build_char_tokenizer()
    cfg = LLMConfig(rollout_engine="vllm", algo="grpo", prompts_per_iter=4,
                    samples_per_prompt=4, max_new_tokens=12, iterations=3, lora_r=0,
                    learning_rate=3e-3, checkpoint_every=1000, time_limit=0)
    tr = TokenTrainer(cfg, str(tmp_path_factory.mktemp("vllm") / "run"), policy=_model(tok),
                      tokenizer=tok, log=lambda *a: None)
    yield tr
    tr.close()


def test_the_run_samples_with_vllm(run):
    assert isinstance(run.engine, VllmEngine) and not run.engine.trainer_logprobs
    assert run.cfg.old_logprobs == "sampler"  # asked for, yet recomputed (engine's numerics)
    # vLLM's engine process left the trainer's process group (ppokit_vllm_plugin)
    assert run.engine.shares_our_group == []


def test_vllm_logprobs_match_the_trainers_on_the_same_tokens(run):
    """The log-prob vLLM gives each token it drew against the trainer's forward over the
    same sequences, at the run's temperature: float32 on both sides, within the float32
    tolerance of the probe (per token, not only on average)."""
    run.engine.prepare(run)
    prompts = [run.prompt_text(r) for r in run.sample_rows(4)]
    roll = run.rollout([p for p in prompts for _ in range(2)])
    assert roll.action_mask.any(1).all() and roll.logp is not None
    t = run.cfg.temperature
    with torch.no_grad():
        ours = sequence_logprobs(run.policy, roll.input_ids, roll.attention_mask,
                                 temperature=t)["logp"]
    gap = (ours - roll.logp)[roll.action_mask].abs()
    mean_tol, max_tol = PROBE_TOLERANCE["fp32"]
    assert float(gap.mean()) <= mean_tol and float(gap.max()) <= max_tol, gap.max()
    # the tokens themselves: EOS ends a row, nothing is generated after it
    eos = run.tok.eos_token_id
    for b in range(roll.input_ids.shape[0]):
        gen = roll.input_ids[b][roll.action_mask[b]].tolist()
        assert eos not in gen[:-1]
        assert bool(roll.truncated[b]) == (gen[-1] != eos)


def test_training_iterations_push_the_weights_and_pass_the_probe(run):
    before = [p.detach().clone() for p in run.policy.parameters()]
    recs = [run.train_iteration() for _ in range(2)]
    moved = max(float((p.detach() - b).abs().max())
                for p, b in zip(run.policy.parameters(), before))
    assert moved > 0
    for rec in recs:
        assert rec["engine_probe_abs_max"] <= PROBE_TOLERANCE["fp32"][1]
        assert rec["engine_sync_s"] > 0
        assert "mismatch_k3_mean" in rec  # the trainer's own old log-probs, vs the engine's
    # the first push follows the last test's check, with no update between; the second
    # carries the first iteration's update, which the engine took
    assert recs[0]["engine_probe_trainer_moved"] == 0.0
    assert recs[1]["engine_probe_trainer_moved"] > 0
    assert recs[1]["engine_probe_followed"] == pytest.approx(1.0, abs=0.05)
    # the last update is not in the engine until the next iteration's push
    with pytest.raises(EngineOutOfSync):
        run.engine.check(run)
    assert run.engine.prepare(run)["engine_probe_abs_mean"] <= PROBE_TOLERANCE["fp32"][0]


def test_the_probe_fails_when_the_weights_are_not_pushed(run):
    """An update the engine never receives: the probe sees it and training stops with a
    clear error; pushing the weights makes the probe pass again."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in run.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    with pytest.raises(EngineOutOfSync, match="does not serve the updated weights"):
        run.engine.check(run)
    real_push, run.engine.push = run.engine.push, lambda policy: None
    try:
        with pytest.raises(EngineOutOfSync):
            run.train_iteration()
    finally:
        run.engine.push = real_push
    run.engine.push(run.policy)
    stats = run.engine.check(run)
    assert stats["engine_probe_abs_max"] <= PROBE_TOLERANCE["fp32"][1]


def test_an_update_below_the_gap_tolerance_is_still_caught_when_not_pushed(run):
    """The follow test: an update so small that the probe's gap stays within the
    tolerance, which the engine never receives, stops training all the same (the engine's
    log-probs did not move while the trainer's did); pushed, the engine follows it."""
    run.engine.prepare(run)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in run.policy.parameters():
            p.add_(1e-4 * torch.randn(p.shape, generator=g))
    real_push, run.engine.push = run.engine.push, lambda policy: None
    try:
        with pytest.raises(EngineOutOfSync, match="kept weights the trainer has since"):
            run.engine.prepare(run)
    finally:
        run.engine.push = real_push
    stats = run.engine.prepare(run)
    assert stats["engine_probe_abs_mean"] <= PROBE_TOLERANCE["fp32"][0]
    assert 0 < stats["engine_probe_trainer_moved"] < PROBE_TOLERANCE["fp32"][0]
    assert stats["engine_probe_followed"] == pytest.approx(1.0, abs=0.05)
    assert stats["engine_probe_along"] == pytest.approx(1.0, abs=0.05)


def test_a_full_push_goes_through_shared_memory_and_is_copied_in(run):
    """The weights are written into the trainer's shared block and the engine loads them
    from it; the engine's weights are its own copy (the block overwritten with zeros
    afterwards changes nothing it serves)."""
    import os

    run.engine.prepare(run)
    block = run.engine.shared.block
    assert block is not None and os.path.exists(f"/dev/shm/{block.name.lstrip('/')}")
    n = sum(p.numel() for p in run.policy.parameters()) * 4  # float32
    assert block.size >= n
    block.buf[:] = bytes(block.size)
    stats = run.engine.check(run)
    assert stats["engine_probe_abs_max"] <= PROBE_TOLERANCE["fp32"][1]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """As ``run``, with LoRA rank 4 on every linear layer, served as vLLM's adapter."""
    tok = build_char_tokenizer()
    cfg = LLMConfig(rollout_engine="vllm", algo="grpo", prompts_per_iter=4,
                    samples_per_prompt=4, max_new_tokens=12, iterations=3, lora_r=4,
                    engine_lora="adapter", learning_rate=3e-2, checkpoint_every=1000,
                    time_limit=0)
    tr = TokenTrainer(cfg, str(tmp_path_factory.mktemp("vllm-lora") / "run"),
                      policy=_model(tok), tokenizer=tok, log=lambda *a: None)
    yield tr
    tr.close()


def test_lora_updates_reach_vllm_as_adapters_alone(lora_run):
    """A LoRA policy's update travels as its adapters only (a new adapter id each time,
    the base never re-sent), and the engine then serves the updated policy: the probe
    within the float32 tolerance after each push, beyond it before."""
    run = lora_run
    assert run.engine.lora_rank == 4
    calls = []
    real = run.engine.llm.collective_rpc

    def spy(method, *a, **k):
        calls.append((method, len(k.get("args", a[0] if a else ())[3])
                      if method.startswith("ppokit_load") else 0))
        return real(method, *a, **k)

    run.engine.llm.collective_rpc = spy
    try:
        recs = [run.train_iteration() for _ in range(2)]
    finally:
        run.engine.llm.collective_rpc = real
    assert [m for m, _ in calls] == ["ppokit_load_lora"] * 2
    n_adapter = sum(1 for n, p in run.policy.named_parameters() if ".lora_" in n)
    assert all(n == n_adapter for _, n in calls)  # adapter tensors only, never the base
    assert run.engine.lora_request.lora_int_id == run.engine.adapter_version >= 2
    for rec in recs:
        assert rec["engine_probe_abs_max"] <= PROBE_TOLERANCE["fp32"][1]
    lora_b = [p for n, p in run.policy.named_parameters() if "lora_B" in n]
    assert max(float(p.detach().abs().max()) for p in lora_b) > 0  # the adapters moved
    with pytest.raises(EngineOutOfSync):  # the last update is not in the engine yet
        run.engine.check(run)
    assert run.engine.prepare(run)["engine_probe_abs_mean"] <= PROBE_TOLERANCE["fp32"][0]
