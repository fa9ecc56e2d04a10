"""ppokit.llm: the token-level trainer's update, checkpoints and commands (tiny model)."""

import copy
import json
import os
import time

import pytest
import torch

from _nostep import NoStep
from ppokit.cli import main
from ppokit.errors import UsageError
from ppokit.llm.inputs.rewards import load_reward_callable
from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model
from ppokit.llm.modeling.rollout import sequence_logprobs
from ppokit.llm.training.trainer import LLMConfig, TokenTrainer, compute_labels


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _trainer(tmp_path, tok, name="run", **kw):
    model = build_tiny_model(tok, seed=0)
    base = {"prompts_per_iter": 8, "iterations": 2, "checkpoint_every": 1000}
    base.update(kw)
    return TokenTrainer(LLMConfig(**base), str(tmp_path / name), policy=model, tokenizer=tok,
                        log=lambda *a: None)


def _rollout_and_labels(tr):
    prompts = tr.sample_prompts()
    prompts = [p for p in prompts for _ in range(tr.cfg.samples_per_prompt)]
    roll = tr.rollout(prompts)
    scores = tr.score(prompts, tr.decode(roll))
    old, ref, va = tr.frozen_forward(roll)
    lab = compute_labels(tr.cfg, roll, scores, old, ref, tr.kl_ctl.value, va)
    return roll, lab


@pytest.mark.parametrize("critic", ["separate", "shared"])
def test_old_logprobs_equal_a_fresh_forward_at_update_start(tmp_path, tok, critic):
    tr = _trainer(tmp_path, tok, critic=critic, old_logprobs="recompute")
    roll, lab = _rollout_and_labels(tr)
    stats = _first_step_stats(tr, roll, lab)
    assert stats["ratio_min"] == 1.0 and stats["ratio_max"] == 1.0
    assert stats["approx_kl"] == 0.0 and stats["clipfrac"] == 0.0


def test_sampler_logprobs_are_the_old_logprobs_to_rounding(tmp_path, tok):
    """The default: the sampler's own log-probs (no second forward pass) are what the
    update starts from; the first step's ratio is 1 to float rounding."""
    tr = _trainer(tmp_path, tok)
    assert tr.cfg.old_logprobs == "sampler"
    roll, lab = _rollout_and_labels(tr)
    assert roll.logp is not None and torch.equal(lab.old_logp, roll.logp)
    fresh = sequence_logprobs(tr.policy, roll.input_ids, roll.attention_mask)["logp"]
    am = roll.action_mask
    assert (lab.old_logp - fresh)[am].abs().max() < 1e-5
    assert (lab.old_logp[~am] == 0).all()
    stats = _first_step_stats(tr, roll, lab)
    assert abs(stats["ratio_min"] - 1) < 1e-5 and abs(stats["ratio_max"] - 1) < 1e-5
    assert abs(stats["approx_kl"]) < 1e-9 and stats["clipfrac"] == 0.0


@pytest.mark.parametrize("critic", ["separate", "shared"])
def test_bf16_forward_passes_keep_log_probs_and_values_float32(tmp_path, tok, critic):
    """precision=bf16: the models run under bfloat16 autocast, what leaves them is float32;
    the sampler's log-probs and the update's first forward differ by bfloat16 rounding
    only (first ratio within 2% of 1), and the float32 forward is a few thousandths away."""
    tr = _trainer(tmp_path, tok, precision="bf16", critic=critic, use_critic=True)
    assert {p.dtype for p in tr.policy.parameters()} == {torch.float32}
    assert torch.bfloat16 in {p.dtype for p in tr.reference.parameters()}
    roll, lab = _rollout_and_labels(tr)
    am = roll.action_mask
    assert lab.old_logp.dtype == torch.float32 and lab.values.dtype == torch.float32
    with torch.no_grad():
        with tr.autocast():
            low = sequence_logprobs(tr.policy, roll.input_ids, roll.attention_mask)["logp"]
        full = sequence_logprobs(tr.policy, roll.input_ids, roll.attention_mask)["logp"]
    assert low.dtype == torch.float32
    assert (low - lab.old_logp)[am].abs().max() < 0.02
    assert 0 < (low - full)[am].abs().max() < 0.02  # bfloat16 did run, and stayed close
    stats = _first_step_stats(tr, roll, lab)
    assert abs(stats["ratio_min"] - 1) < 0.02 and abs(stats["ratio_max"] - 1) < 0.02
    with pytest.raises(UsageError, match="precision: bf16 is not offered with fsdp"):
        _trainer(tmp_path, tok, name="fsdp", precision="bf16", fsdp=True)


def _first_step_stats(tr, roll, lab, **spec_changes):
    import dataclasses

    from ppokit.engine import eager_minibatch_step

    spec = dataclasses.replace(tr.update_spec(tr.kl_ctl.value), max_grad_norm=None,
                               **spec_changes)
    batch = tr.labelled_batch(roll, lab)
    params = tr.trained_parameters()
    return eager_minibatch_step(spec, tr.forward_adapter(roll), NoStep(params), params,
                                batch.rows(None), clip_range=spec.clip_range,
                                kl_coef=spec.kl_coef)


def test_reference_kl_is_exactly_zero_when_policy_equals_reference(tmp_path, tok):
    tr = _trainer(tmp_path, tok, kl_coef=0.1, old_logprobs="recompute")
    roll, lab = _rollout_and_labels(tr)
    assert (lab.kl_tokens == 0).all()
    assert lab.stats["kl_ref"] == 0.0 and lab.stats["non_score_reward"] == 0.0
    # with the sampler's log-probs (the default) it is zero to float rounding
    tr = _trainer(tmp_path, tok, name="sampler", kl_coef=0.1)
    roll, lab = _rollout_and_labels(tr)
    assert lab.kl_tokens.abs().max() < 1e-5 and abs(lab.stats["kl_ref"]) < 1e-5


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                 "seq-mean-token-sum-norm"])
def test_gradient_accumulation_matches_the_full_minibatch(tmp_path, tok, agg):
    tr = _trainer(tmp_path, tok, agg=agg, kl_mode="loss", kl_coef=0.1, ent_coef=0.01)
    roll, lab = _rollout_and_labels(tr)
    # move the policy off the old one so ratios, clipping and the KL term are all live
    with torch.no_grad():
        for p in tr.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    def grads(k):
        _first_step_stats(tr, roll, lab, grad_accum=k)
        return [p.grad.clone() for p in tr.trained_parameters()]

    full, acc = grads(1), grads(4)
    for a, b in zip(full, acc):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("estimator", [None, "k2", "k3"])
def test_the_kl_loss_term_is_the_configured_estimator(tmp_path, tok, estimator):
    """kl_mode=loss: the update's KL term is kl_estimator (default k2, whose expected
    gradient is that of KL(pi || pi_ref)) of the policy vs the reference, per token."""
    kw = {} if estimator is None else {"kl_estimator": estimator}
    tr = _trainer(tmp_path, tok, algo="grpo", agg="token-mean", kl_coef=0.1, **kw)
    assert tr.update_spec(0.1).kl_estimator == (estimator or "k2")
    roll, lab = _rollout_and_labels(tr)
    with torch.no_grad():
        for p in tr.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    stats = _first_step_stats(tr, roll, lab)
    batch = tr.labelled_batch(roll, lab)
    with torch.no_grad():
        logp = tr.forward_adapter(roll)(batch.rows(None)).logp
    d = (lab.ref_logp - logp)[roll.action_mask].double()
    per = d.expm1() - d if estimator == "k3" else 0.5 * d * d
    assert float(stats["kl_loss"]) == pytest.approx(float(per.mean()), rel=1e-5)


@pytest.mark.parametrize("algo", ["ppo", "gspo", "cispo", "dapo", "grpo+tis"])
def test_resume_continues_exactly(tmp_path, tok, algo):
    cfg = {"iterations": 4, "checkpoint_every": 2, "algo": algo}
    if algo != "ppo":
        cfg.update(prompts_per_iter=2, samples_per_prompt=4)
    if algo == "grpo+tis":  # a bf16 sampler corrected by truncated importance weights
        cfg.update(algo="grpo", sampler_precision="bf16", rollout_is="truncate")
    clip_key = {"gspo": "clipfrac_sequence", "cispo": "clipfrac_weight"}.get(algo, "clipfrac")
    a = _trainer(tmp_path, tok, "straight", **cfg)
    a.train(progress=False)
    b = _trainer(tmp_path, tok, "resumed", **{**cfg, "iterations": 2})
    b.train(progress=False)
    c = TokenTrainer(LLMConfig(**{"prompts_per_iter": 8, **cfg}), str(tmp_path / "resumed"),
                     resume=True, log=lambda *a: None)
    assert c.iteration == 2
    c.train(progress=False)

    def rows(name):
        with open(tmp_path / name / "metrics.jsonl") as f:
            return [json.loads(x) for x in f]

    ra, rb = rows("straight"), rows("resumed")
    assert [r["iteration"] for r in rb] == [1, 2, 3, 4]
    for x, y in zip(ra, rb):
        for key in ("score_mean", "kl_ref", "approx_kl", "value_loss", "response_length_mean",
                    clip_key, "mismatch_k3_mean", *(
                        ("dynamic_rounds", "dynamic_dropped_groups") if algo == "dapo"
                        else ()), *(("rollout_is_weight_mean",) if "tis" in algo else ())):
            if x[key] is None:
                assert y[key] is None, key
                continue
            assert x[key] == pytest.approx(y[key], rel=1e-6, abs=1e-9), key
    pa = dict(a.policy.named_parameters())
    for name, p in c.policy.named_parameters():
        assert torch.allclose(p, pa[name], atol=1e-6)


def test_run_dir_holds_metrics_samples_and_checkpoint(tmp_path, tok):
    tr = _trainer(tmp_path, tok, algo="grpo", prompts_per_iter=4, samples_per_prompt=2)
    tr.train(progress=False)
    d = tmp_path / "run"
    rec = json.loads((d / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ("score_mean", "non_score_reward", "kl_ref", "approx_kl", "clipfrac",
                "clip_active_frac", "entropy", "response_length_mean", "truncated_frac",
                "tokens_per_s_generation", "tokens_per_s_scoring", "tokens_per_s_training"):
        assert key in rec, key
    assert (d / "samples.jsonl").exists() and (d / "reference").is_dir()
    from ppokit.io import latest_checkpoint

    ck = latest_checkpoint(d / "checkpoints")
    assert ck.name == "iter_000000002" and (ck / "optimizer.safetensors").exists()
    assert (ck / "policy.safetensors").exists() and (ck / "manifest.json").exists()
    assert not [p for p in d.rglob("*") if ".tmp" in p.name or ".trash" in p.name]
    assert not list(d.rglob("*.bin")) and not list(d.rglob("*.pt"))  # no pickle


def test_target_kl_stops_the_update(tmp_path, tok):
    # a truncation penalty gives the untrained model's scores a spread (so a gradient)
    tr = _trainer(tmp_path, tok, target_kl=1e-12, learning_rate=0.05, n_epochs=4,
                  batch_size=4, truncation="penalty")
    roll, lab = _rollout_and_labels(tr)
    out = tr.update(roll, lab)
    # the first step sees ratio 1 (approx_kl 0) and is taken; a later one trips the check
    assert out["early_stop_epoch"] is not None and 1 <= out["n_updates"] < 8


def test_reward_callable_loading():
    fn = load_reward_callable("ppokit.llm.inputs.task:reverse_score")
    assert fn(["12>"], ["21"]) == [1.0]
    with pytest.raises(UsageError, match="module:function"):
        load_reward_callable("nocolon")
    with pytest.raises(UsageError, match="cannot import"):
        load_reward_callable("no_such_module_xyz:f")
    with pytest.raises(UsageError):
        LLMConfig(algo="nope").resolved()


def test_cli_train_eval_end_to_end(tmp_path, capsys):
    rd = str(tmp_path / "cli")
    rc = main(["llm", "train", "--iterations", "2", "--sft-steps", "5", "--prompts-per-iter",
               "8", "--n-eval-prompts", "8", "--run-dir", rd, "--no-progress", "--no-eval"])
    assert rc == 0
    assert main(["llm", "eval", rd, "--n-prompts", "8"]) == 0
    ev = json.loads(open(os.path.join(rd, "eval.json")).read())
    assert 0 <= ev["score_mean"] <= 1 and 0 <= ev["reference_score_mean"] <= 1
    assert main(["llm", "train", "--algo", "bogus", "--run-dir", rd]) == 2
    capsys.readouterr()


def test_cli_loads_a_local_model_dir(tmp_path, tok):
    from ppokit.llm.modeling.models import save_policy

    mdir = str(tmp_path / "m")
    save_policy(build_tiny_model(tok, arch="gpt2"), tok, mdir)
    rd = str(tmp_path / "r")
    assert main(["llm", "train", "--model", mdir, "--algo", "rloo", "--iterations", "1",
                 "--prompts-per-iter", "4", "--samples-per-prompt", "2", "--run-dir", rd,
                 "--no-progress", "--no-eval", "--task", "reverse"]) == 0


def test_chat_task_with_a_tokenizer_without_template_is_one_line(tmp_path, tok, capsys):
    """A pretrained --model defaults to the numbers chat task, which needs a chat
    template: a model without one is told what to give instead."""
    from ppokit.llm.modeling.models import save_policy

    mdir = str(tmp_path / "m")
    save_policy(build_tiny_model(tok), tok, mdir)
    assert main(["llm", "train", "--model", mdir, "--iterations", "1", "--run-dir",
                 str(tmp_path / "r"), "--no-progress", "--no-eval"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "task: 'numbers' asks its questions through" in err[0]
    assert "--task reverse" in err[0] and not os.path.exists(tmp_path / "r" / "metrics.jsonl")


def test_reward_model_and_dpo_commands(tmp_path):
    from ppokit.llm.inputs.rewards import RewardModelScorer

    rm = str(tmp_path / "rm")
    assert main(["llm", "rm", "--out", rm, "--n-pairs", "64", "--epochs", "1"]) == 0
    summary = json.loads(open(os.path.join(rm, "rm_summary.json")).read())
    assert 0 <= summary["eval_accuracy"] <= 1
    scorer = RewardModelScorer(rm)
    s = scorer(["12>", "12>"], ["21", "2"])
    assert len(s) == 2 and all(isinstance(x, float) for x in s)
    dpo = str(tmp_path / "dpo")
    assert main(["llm", "dpo", "--out", dpo, "--n-pairs", "64", "--epochs", "1"]) == 0
    assert os.path.isdir(dpo)


def test_reference_is_a_frozen_copy(tmp_path, tok):
    tr = _trainer(tmp_path, tok)
    before = copy.deepcopy(tr.reference.state_dict())
    tr.train(progress=False)
    for k, v in tr.reference.state_dict().items():
        assert torch.equal(v, before[k])
    assert not any(p.requires_grad for p in tr.reference.parameters())
    ids = torch.tensor([[1, 5, 6]])
    lp = sequence_logprobs(tr.reference, ids, torch.ones_like(ids))["logp"]
    assert torch.isfinite(lp).all()


def test_prompts_file_with_a_reward_callable_and_adaptive_beta(tmp_path, tok):
    pf = tmp_path / "prompts.jsonl"
    pf.write_text("".join(json.dumps({"prompt": f"{i}{i + 1}>"}) + "\n" for i in range(8)))
    tr = _trainer(tmp_path, tok, prompts=str(pf), reward="ppokit.llm.inputs.task:reverse_score",
                  kl_target=0.01, kl_coef=0.1, prompts_per_iter=4, iterations=2)
    recs = tr.train(progress=False)
    # the sampler's log-probs against the reference's forward pass: 0 to rounding
    assert recs[0]["kl_coef"] == 0.1 and abs(recs[0]["kl_ref"]) < 1e-5
    assert recs[1]["kl_coef"] == pytest.approx(0.05)  # KL 0 < target / 1.5: beta halved
    assert "beta" not in recs[0]  # one vocabulary: the KL coefficient is kl_coef
    assert tr.eval_rows == [{"prompt": "78>"}]  # eval_fraction 0.1 of 8 rows: the last one
    assert {"prompt": "78>"} not in tr.train_rows
    with pytest.raises(UsageError, match="reward"):
        _trainer(tmp_path, tok, "r2", prompts=str(pf))


@pytest.mark.parametrize("critic", ["separate", "shared"])
def test_lora_policy_trains_adapters_only_and_exports_a_plain_model(tmp_path, tok, critic):
    pytest.importorskip("peft")
    from ppokit.llm.modeling.models import load_lm

    tr = _trainer(tmp_path, tok, critic, lora_r=4, critic=critic, iterations=2,
                  checkpoint_every=1)
    # the reference is the policy with its adapters off: the starting weights, saved as
    # the run's reference/ directory
    base = load_lm(str(tmp_path / critic / "reference"))[0].state_dict()
    roll, lab = _rollout_and_labels(tr)
    stats = _first_step_stats(tr, roll, lab)
    # adapters start at zero: policy == reference (sampler log-probs: equal to rounding)
    assert abs(stats["approx_kl"]) < 1e-9
    tr.train(progress=False)
    trainable = [n for n, p in tr.policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora" in n for n in trainable)
    model, _ = load_lm(str(tmp_path / critic / "policy"))
    assert not any("lora" in k for k in model.state_dict())
    assert any(not torch.equal(v, base[k]) for k, v in model.state_dict().items() if k in base)
    c = TokenTrainer(LLMConfig(prompts_per_iter=8, lora_r=4, critic=critic, iterations=3,
                               checkpoint_every=1), str(tmp_path / critic), resume=True,
                     log=lambda *a: None)
    assert c.iteration == 2
    for (n1, p1), (n2, p2) in zip(tr.policy.named_parameters(), c.policy.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)


def test_eval_every_logs_the_held_out_score_without_changing_training(tmp_path, tok):
    from ppokit.llm.evaluation.evaluate import score_policy

    plain = _trainer(tmp_path, tok, "plain", algo="grpo", prompts_per_iter=4,
                     samples_per_prompt=2, iterations=3)
    with_eval = _trainer(tmp_path, tok, "eval", algo="grpo", prompts_per_iter=4,
                         samples_per_prompt=2, iterations=3, eval_every=2, n_eval_prompts=16)
    a, b = plain.train(progress=False), with_eval.train(progress=False)
    # every second iteration and the last: the run's final policy is scored too
    assert ["eval/score_mean" in r for r in b] == [False, True, True]
    for x, y in zip(a, b):                      # the run's own random streams are untouched
        for key in ("score_mean", "kl_ref", "approx_kl", "response_length_mean"):
            assert x[key] == y[key], key
    # the logged figure is score_policy's on the held-out rows, with the eval's own seed
    ev = with_eval.evaluate_heldout()
    ref = score_policy(with_eval.policy, tok, with_eval.eval_rows[:16], with_eval.rewards,
                       max_new_tokens=with_eval.max_new_tokens, seed=with_eval.cfg.seed + 7919)
    assert ev["eval/score_mean"] == ref["score_mean"]
    assert ev["eval/reward/reverse_score"] == ref["reward/reverse_score"]
    assert 0 <= ev["eval/truncated_frac"] <= 1
    with pytest.raises(UsageError, match="eval_every"):
        LLMConfig(eval_every=-1).resolved()
    # a run its time limit ends is scored at the iteration it ends with
    timed = _trainer(tmp_path, tok, "timed", algo="grpo", prompts_per_iter=4,
                     samples_per_prompt=2, iterations=50, eval_every=10, n_eval_prompts=8,
                     time_limit=1e-6)
    recs = timed.train(progress=False)
    assert len(recs) == 1 and "eval/score_mean" in recs[0]


def _reference_rows(tr, monkeypatch) -> list[int]:
    """Rows of every log-prob pass of ``tr``'s reference, recorded as the trainer runs."""
    from ppokit.llm.training import frozen

    seen, inner = [], frozen.sequence_logprobs

    def counted(model, input_ids, *args, **kw):
        if model is tr.reference:
            seen.append(int(input_ids.shape[0]))
        return inner(model, input_ids, *args, **kw)

    monkeypatch.setattr(frozen, "sequence_logprobs", counted)
    return seen


@pytest.mark.parametrize("kl_mode", ["reward", "loss"])
def test_at_beta_zero_the_reference_reads_a_probe_and_the_update_is_unchanged(
        tmp_path, tok, monkeypatch, kl_mode):
    """β 0 and fixed: no KL term reads the reference, so it runs on the probe rows only
    (for ``kl_ref``); the update is the one the full pass gives, and ``kl_ref`` is the
    full pass's KL on those rows."""
    from ppokit.llm.training import frozen
    from ppokit.llm.training.divergence import PROBE_ROWS

    kw = {"algo": "grpo", "prompts_per_iter": 4, "samples_per_prompt": 4, "iterations": 2,
          "kl_mode": kl_mode, "kl_coef": 0.0, "learning_rate": 5e-3}
    runs = {}
    for mode in ("probe", "full"):
        tr = _trainer(tmp_path, tok, name=mode, **kw)
        if mode == "full":
            monkeypatch.setattr(frozen, "reference_needed", lambda tr: True)
        labels = []
        tr.labels_observer = lambda roll, lab, into=labels: into.append(lab)
        rows = _reference_rows(tr, monkeypatch)
        recs = [tr.train_iteration() for _ in range(2)]
        runs[mode] = (tr, recs, labels, rows)
    (p_tr, p_recs, p_labs, p_rows), (f_tr, f_recs, f_labs, f_rows) = runs["probe"], runs["full"]
    assert max(p_rows) <= PROBE_ROWS < max(f_rows)
    assert p_labs[-1].ref_logp is None and (p_labs[-1].kl_tokens == 0).all()
    for a, b in zip(p_tr.policy.parameters(), f_tr.policy.parameters()):
        assert torch.equal(a, b)
    probe = torch.linspace(0, 15, PROBE_ROWS).round().long().unique()
    kl_rows = f_labs[-1].kl_tokens[probe].sum(1).mean()
    assert p_recs[-1]["kl_ref_rows"] == len(probe) and "kl_ref_rows" not in f_recs[-1]
    assert p_recs[-1]["kl_ref"] == pytest.approx(float(kl_rows), abs=1e-5)
    assert abs(p_recs[-1]["kl_ref"]) > 1e-4  # the policy has moved: a real measurement
    assert p_recs[-1]["score_mean"] == f_recs[-1]["score_mean"]


def test_a_kl_term_without_the_reference_is_an_error(tmp_path, tok):
    tr = _trainer(tmp_path, tok, kl_mode="reward", kl_coef=0.1)
    roll = tr.rollout(tr.sample_prompts())
    with pytest.raises(ValueError, match="needs the reference's log-probs"):
        compute_labels(tr.cfg, roll, torch.zeros(roll.input_ids.shape[0]), roll.logp, None,
                       0.1)
    from ppokit.llm.training import frozen
    assert frozen.reference_needed(tr)
    assert not frozen.reference_needed(_trainer(tmp_path, tok, name="none", kl_mode="none",
                                                kl_coef=0.1))
    assert frozen.reference_needed(_trainer(tmp_path, tok, name="adaptive", kl_coef=0.1,
                                            kl_target=0.5))


def test_the_training_clock_counts_the_work_between_iterations_not_heldout_scoring(
        tmp_path, tok, monkeypatch):
    """``wall_time`` (what ``time_limit`` and the time-to-accuracy bench read) is the loop's
    wall time less the held-out evaluations: a callback's 0.2 s between iterations is in
    it, the evaluations' 1 s each are not."""
    tr = _trainer(tmp_path, tok, iterations=3, eval_every=1, time_limit=None)

    def slow_eval():
        time.sleep(1.0)
        return {"eval/score_mean": 0.0}

    monkeypatch.setattr(tr, "evaluate_heldout", slow_eval)
    tr.callbacks.append(lambda rec: time.sleep(0.2))
    recs = tr.train(progress=False)
    inside = sum(r["time_generation"] + r["time_scoring"] + r["time_training"] for r in recs)
    between = recs[-1]["wall_time"] - inside
    assert 0.4 <= between < 1.4  # two gaps of a callback; two evaluations would add 2 s
    assert [("eval/score_mean" in r) for r in recs] == [True, True, True]
