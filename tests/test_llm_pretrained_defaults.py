"""Defaults that follow what is trained, the divergence guard, and LoRA runs.

- A pretrained checkpoint (``--model``, or a model given to ``ppokit.llm.train``) gets LoRA
  adapters, a learning rate it tolerates, GRPO, a chat task and the divergence guard; the
  built-in tiny model keeps its own values. Whatever the user sets wins.
- The guard: an update that moves the policy past ``guard_kl`` (or a gradient past
  ``guard_grad_norm``) is undone — parameters, optimiser state and minibatch order exactly
  as before — and retried at half the learning rate; after ``guard_retries`` halvings the
  run stops with one line, and nothing of the diverged update is kept.
- LoRA runs: the reference is the policy with its adapters off (no copy), checkpoints hold
  the adapters only, and a resumed run continues exactly.
"""

import json
import math
import os

import pytest
import torch

from ppokit.errors import UsageError
from ppokit.llm.modeling.models import AdaptersOff, build_char_tokenizer, build_tiny_model
from ppokit.llm.training.config import LEARNING_RATES, LLMConfig
from ppokit.llm.training.divergence import TrainingDiverged, update_kl
from ppokit.llm.training.trainer import TokenTrainer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_builtin_model_keeps_its_defaults():
    cfg = LLMConfig().resolved()
    assert (cfg.algo, cfg.learning_rate, cfg.lora_r, cfg.task) == ("ppo", 2e-4, 0, "reverse")
    assert cfg.guard_kl == 0.0 and cfg.max_new_tokens == 9


def test_pretrained_checkpoint_gets_its_defaults():
    cfg = LLMConfig(model="some/dir").resolved()
    assert cfg.algo == "grpo" and cfg.lora_r == 16 and cfg.lora_alpha == 32.0
    assert cfg.learning_rate == LEARNING_RATES["lora"] and cfg.task == "numbers"
    assert cfg.guard_kl == 0.5
    full = LLMConfig(model="some/dir", lora_r=0).resolved()
    assert full.learning_rate == LEARNING_RATES["full"] < LEARNING_RATES["lora"]
    # a model object given to the Python API is a pretrained checkpoint too
    assert LLMConfig().resolved(pretrained=True).lora_r == 16


def test_user_values_win_and_resolving_twice_changes_nothing():
    cfg = LLMConfig(model="d", learning_rate=3e-4, lora_r=4, algo="rloo", guard_kl=0.0,
                    max_new_tokens=12).resolved()
    assert (cfg.learning_rate, cfg.lora_r, cfg.algo, cfg.guard_kl, cfg.max_new_tokens) == (
        3e-4, 4, "rloo", 0.0, 12)
    assert cfg.lora_alpha == 8.0
    assert cfg.resolved() == cfg and cfg.resolved(pretrained=False) == cfg


def test_prompts_without_a_task_record_their_generation_cap():
    cfg = LLMConfig(prompts="p.jsonl", reward="m:f").resolved()
    assert cfg.algo == "grpo" and cfg.max_new_tokens == 64


def test_chat_task_needs_a_pretrained_model():
    with pytest.raises(UsageError, match="task: 'numbers' is a task for a pretrained chat"):
        LLMConfig(task="numbers").resolved()
    with pytest.raises(UsageError, match="task: expected one of"):
        LLMConfig(model="d", task="nope").resolved()
    with pytest.raises(UsageError, match="task_options: only a reasoning-gym task"):
        LLMConfig(model="d", task="numbers", task_options="{}").resolved()


def _trainer(tmp_path, tok, name="run", **kw):
    base = {"algo": "grpo", "prompts_per_iter": 4, "samples_per_prompt": 4, "iterations": 3,
            "checkpoint_every": 1000, "sft_steps": 5}
    base.update(kw)
    return TokenTrainer(LLMConfig(**base), str(tmp_path / name),
                        policy=build_tiny_model(tok, seed=0), tokenizer=tok,
                        log=lambda *a: None)


def test_update_kl_is_k3_of_old_against_new():
    old = torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, -3.0]])
    new = torch.tensor([[0.0, -1.5, -1.0], [0.0, -0.5, -9.0]])
    mask = torch.tensor([[False, True, True], [False, True, False]])
    d = [(-1.5) - (-1.0), (-1.0) - (-2.0), 0.0]
    want = sum(math.expm1(x) - x for x in d) / 3
    assert update_kl(new, old, mask) == pytest.approx(want)
    assert update_kl(new, old, torch.zeros_like(mask)) == 0.0


def test_guard_undoes_a_wrecking_update_and_halves_the_rate(tmp_path, tok):
    """A learning rate of 3 wrecks the tiny model in one update; the guard undoes it
    (the parameters it retries from are the ones before) and halves the rate until the
    movement is within guard_kl."""
    logs = []
    tr = _trainer(tmp_path, tok, learning_rate=3.0, guard_kl=0.2, guard_retries=12)
    tr.log = tr.guard.log = logs.append
    before = [p.detach().clone() for p in tr.trained_parameters()]
    seen = []
    orig = tr.update

    def spy(roll, lab):  # the parameters every attempt starts from
        seen.append([p.detach().clone() for p in tr.trained_parameters()])
        return orig(roll, lab)

    tr.update = spy
    rec = tr.train_iteration()
    assert rec["guard_rollbacks"] >= 1 and len(seen) == rec["guard_rollbacks"] + 1
    for attempt in seen:
        assert all(torch.equal(a, b) for a, b in zip(attempt, before))
    assert rec["learning_rate"] == pytest.approx(3.0 * 0.5 ** rec["guard_rollbacks"])
    assert rec["kl_after"] <= 0.2
    assert tr.opt.param_groups[0]["lr"] == rec["learning_rate"]
    assert any("guard: iteration 1" in m and "undone" in m for m in logs)
    tr.close()


def test_guard_stops_with_one_line_and_keeps_nothing(tmp_path, tok):
    tr = _trainer(tmp_path, tok, learning_rate=1e-2, guard_kl=1e-9, guard_retries=2)
    before = [p.detach().clone() for p in tr.trained_parameters()]
    with pytest.raises(TrainingDiverged) as err:
        tr.train_iteration()
    msg = str(err.value)
    assert "\n" not in msg and "iteration 1" in msg and "guard_kl" in msg
    assert "after 2 halving(s)" in msg and "--learning-rate" in msg
    assert all(torch.equal(a, b) for a, b in zip(tr.trained_parameters(), before))
    assert tr.iteration == 0
    tr.close()


def test_guard_off_keeps_the_update(tmp_path, tok):
    tr = _trainer(tmp_path, tok, learning_rate=1e-2, guard_kl=0.0)
    rec = tr.train_iteration()
    assert rec["guard_rollbacks"] == 0 and rec["kl_after"] is None
    tr.close()


def test_guard_catches_a_non_finite_gradient_norm(tmp_path, tok):
    tr = _trainer(tmp_path, tok, guard_kl=0.5, guard_retries=0)
    assert tr.guard.problem({"grad_norm_max": float("inf")}, 0.0) == "grad_norm_max is inf"
    assert tr.guard.problem({"grad_norm_max": 3.0}, 0.01) is None
    tr2 = _trainer(tmp_path, tok, name="g", guard_grad_norm=2.0)
    assert "gradient norm 3 > guard_grad_norm 2" in tr2.guard.problem({"grad_norm_max": 3.0},
                                                                     None)
    tr.close()
    tr2.close()


peft = pytest.importorskip("peft")


def test_lora_reference_is_the_policy_with_adapters_off(tmp_path, tok):
    tr = _trainer(tmp_path, tok, lora_r=4)
    assert isinstance(tr.reference, AdaptersOff) and tr.reference.peft is tr.policy
    assert list(tr.reference.parameters()) == []
    trained = {n for n, p in tr.policy.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    tr.close()


def test_lora_checkpoint_holds_the_adapters_and_resumes_exactly(tmp_path, tok):
    from ppokit.io import find_checkpoint, load_checkpoint

    tr = _trainer(tmp_path, tok, lora_r=4, iterations=4, checkpoint_every=2)
    tr.train(progress=False)
    full = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    ckpt, _ = find_checkpoint(os.path.join(tmp_path, "run", "checkpoints"))
    tensors = load_checkpoint(ckpt)[0]
    assert tensors["policy"] and all("lora_" in k for k in tensors["policy"])
    final = {k: v.clone() for k, v in tr.policy.state_dict().items() if "lora_" in k}
    # the same run stopped after 2 iterations and resumed
    short = _trainer(tmp_path, tok, name="short", lora_r=4, iterations=2, checkpoint_every=2)
    short.train(progress=False)
    short.close()
    resumed = TokenTrainer(LLMConfig(**{**short.cfg.__dict__, "iterations": 4}),
                           str(tmp_path / "short"), resume=True, log=lambda *a: None)
    resumed.train(progress=False)
    again = [json.loads(x) for x in open(tmp_path / "short" / "metrics.jsonl")]
    assert [r["score_mean"] for r in again] == [r["score_mean"] for r in full]
    for k, v in resumed.policy.state_dict().items():
        if "lora_" in k:
            assert torch.equal(v, final[k]), k
    resumed.close()


def test_resume_with_a_new_learning_rate(tmp_path, tok):
    from ppokit.llm.training.runfiles import config_from_run

    tr = _trainer(tmp_path, tok, iterations=1, learning_rate=1e-3)
    tr.train(progress=False)
    tr.close()
    cfg = config_from_run(str(tmp_path / "run"), learning_rate=2.5e-4, iterations=2)
    msgs = []
    again = TokenTrainer(cfg, str(tmp_path / "run"), resume=True, log=msgs.append)
    assert again.opt.param_groups[0]["lr"] == 2.5e-4
    assert any("learning rate 0.00025 from here on" in m for m in msgs)
    again.close()


def test_learning_rate_warning_follows_size_and_mode():
    from ppokit.llm.training.divergence import learning_rate_warning, tolerated_learning_rate

    n = 135_000_000
    assert learning_rate_warning(LEARNING_RATES["full"], n, lora=False) is None
    assert learning_rate_warning(LEARNING_RATES["lora"], n, lora=True) is None
    msg = learning_rate_warning(2e-4, n, lora=False)
    assert msg.startswith("warning: learning_rate 0.0002 is 20x the about 1e-05 that a "
                          "135M-parameter pretrained model tolerates fully fine-tuned")
    assert learning_rate_warning(2e-4, n, lora=True) is None
    # larger models tolerate less; the built-in model is never warned about
    assert tolerated_learning_rate(4 * n, False) == pytest.approx(
        tolerated_learning_rate(n, False) / 2)
    assert learning_rate_warning(10.0, 110_000, lora=False) is None
