"""Generation overlapped with training (``max_staleness``, ppokit.llm.training.overlap):
the worker without a lead is the synchronous loop exactly; with a lead of K each batch is
sampled by the weights of K updates before, its samples lag at most K, the loss weighs
them by the decoupled PPO weight; stale batches are dropped and counted; a checkpoint
resumes with the prompts the uninterrupted run draws; the worker ends with the trainer,
on an exception and on SIGTERM; bad settings are one line naming the setting."""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _nostep import NoStep
from ppokit.cli import main
from ppokit.engine import Forward, UpdateSpec, eager_minibatch_step
from ppokit.errors import UsageError
from ppokit.io import GracefulStop, Interrupted
from ppokit.io.checkpoint import verify_checkpoint
from ppokit.llm.engines import RolloutEngine
from ppokit.llm.labelling.mismatch import correction
from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model
from ppokit.llm.modeling.rollout import generate, sequence_logprobs
from ppokit.llm.training.config import LLMConfig
from ppokit.llm.training.overlap import THREAD_NAME
from ppokit.llm.training.trainer import TokenTrainer

BASE = {"prompts_per_iter": 4, "samples_per_prompt": 4, "checkpoint_every": 1000,
        "algo": "grpo", "time_limit": 0}


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _trainer(path, tok, *, resume=False, callbacks=(), **kw):
    cfg = LLMConfig(**{**BASE, "iterations": 2, **kw})
    return TokenTrainer(cfg, str(path), policy=build_tiny_model(tok, seed=0), tokenizer=tok,
                        log=lambda *a: None, resume=resume, callbacks=callbacks)


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def _watch(tr) -> list:
    """Each iteration's (version, rollout, labels) as the trainer labels it."""
    seen: list = []
    tr.labels_observer = lambda roll, lab: seen.append((tr.iteration, roll, lab))
    return seen


# ------------------------------------------------------------------ the schedule


def test_the_worker_without_a_lead_is_the_synchronous_loop(tmp_path, tok):
    """Same samples, same losses, same parameters after 2 iterations: the worker (its own
    copy of the weights, the run's streams from another thread) changes nothing."""
    sync = _trainer(tmp_path / "sync", tok)
    assert sync.staleness is None  # max_staleness = 0: generated within the iteration
    worker = _trainer(tmp_path / "worker", tok)
    worker.staleness = 0  # the worker, each batch sampled after the update before it
    seen_s, seen_w = _watch(sync), _watch(worker)
    recs_s, recs_w = sync.train(progress=False), worker.train(progress=False)
    assert len(seen_s) == len(seen_w) == 2
    for (_, rs, ls), (_, rw, lw) in zip(seen_s, seen_w):
        assert torch.equal(rs.input_ids, rw.input_ids)
        assert torch.equal(rs.logp, rw.logp) and torch.equal(ls.advantages, lw.advantages)
    for a, b in zip(recs_s, recs_w):
        for k in ("policy_loss", "score_mean", "kl_ref", "entropy"):
            assert a[k] == b[k], k
        assert b["staleness_max"] == 0 and "staleness_max" not in a
    for (n, p), q in zip(sync.policy.named_parameters(), worker.policy.parameters()):
        assert torch.equal(p, q), n
    sync.close()
    worker.close()


@pytest.mark.parametrize("lora_r", [0, 4])
def test_k1_batches_come_from_the_weights_one_update_back(tmp_path, tok, lora_r):
    """Each batch's behaviour log-probs are those of the policy ``K`` versions before the
    one that trains on it (and not of that one), LoRA adapters or not; the IS weight is 1
    where they agree (the first batch), capped elsewhere; the losses stay finite; the
    version is logged."""
    states = {}
    tr = _trainer(tmp_path / "k1", tok, max_staleness=1, iterations=4, samples_logged=2,
                  lora_r=lora_r, callbacks=[lambda rec: states.__setitem__(
                      rec["iteration"], copy.deepcopy(tr.policy))])
    assert (tr.cfg.rollout_is, tr.cfg.old_logprobs) == ("truncate", "recompute")
    states[0] = copy.deepcopy(tr.policy)
    seen = _watch(tr)
    recs = tr.train(progress=False)
    assert [r["staleness_max"] for r in recs] == [0, 1, 1, 1]
    assert all(r["stale_dropped"] == 0 for r in recs)
    assert all(math.isfinite(r[k]) for r in recs for k in ("policy_loss", "approx_kl", "entropy"))
    for version, roll, lab in seen:
        mask = roll.action_mask
        torch.testing.assert_close(lab.is_weight[mask], torch.exp(
            lab.old_logp - roll.logp)[mask].clamp(max=2.0), rtol=1e-5, atol=1e-6)
        behaviour = max(version - 1, 0)
        for v, agrees in ((behaviour, True), (version, version == behaviour)):
            with torch.no_grad():
                lp = sequence_logprobs(states[v], roll.input_ids, roll.attention_mask,
                                       temperature=tr.cfg.temperature,
                                       actions_from=roll.prompt_len)["logp"]
            gap = float((lp - roll.logp)[mask].abs().max())
            assert (gap < 1e-4) == agrees, (version, v, gap)
        if version == 0:  # behaviour = proximal: the weight is 1
            torch.testing.assert_close(lab.is_weight[mask], torch.ones(int(mask.sum())),
                                       rtol=0, atol=1e-5)
    assert float(seen[-1][2].is_weight[seen[-1][1].action_mask].std()) > 0
    lines = (tmp_path / "k1" / "samples.jsonl").read_text().splitlines()
    assert [json.loads(x)["policy_version"] for x in lines] == [0, 0, 0, 0, 1, 1, 2, 2]
    metrics = [json.loads(x) for x in (tmp_path / "k1" / "metrics.jsonl").read_text()
               .splitlines()]
    for key in ("staleness_mean", "stale_dropped", "overlap_frac", "time_waiting",
                "rollout_is_weight_mean", "rollout_is_weight_max"):
        assert key in metrics[-1], key
    assert 0.0 <= metrics[-1]["overlap_frac"] <= 1.0
    tr.close()


class OwnCopyEngine(RolloutEngine):
    """An engine with weights of its own, as vLLM: ``prepare`` loads the policy it is
    shown (the push), ``generate`` samples that copy only."""

    name, trainer_logprobs = "own-copy", False

    def __init__(self, tok):
        self.model, self.pushes = build_tiny_model(tok, seed=1), 0

    def prepare(self, tr) -> dict:
        self.model.load_state_dict(tr.policy.state_dict())
        self.pushes += 1
        return {"engine_sync_s": 0.0}

    def generate(self, prompt_ids, prompt_mask, **kw):
        return generate(self.model, prompt_ids, prompt_mask, **kw)


def test_an_engine_with_its_own_weights_is_pushed_the_workers_version(tmp_path, tok):
    """Through ``prepare``, from the worker: the engine serves version m − K for batch
    m (not the trainer's live policy)."""
    states = {}
    tr = _trainer(tmp_path / "own", tok, max_staleness=1, iterations=3,
                  callbacks=[lambda rec: states.__setitem__(
                      rec["iteration"], {k: v.clone() for k, v in
                                         tr.policy.state_dict().items()})])
    states[0] = {k: v.clone() for k, v in tr.policy.state_dict().items()}
    tr.engine = OwnCopyEngine(tok)
    seen = _watch(tr)
    recs = tr.train(progress=False)
    # one push per batch generated (the last one, in flight at the end, perhaps too)
    assert tr.engine.pushes >= len(seen) == 3 and all("engine_sync_s" in r for r in recs)
    model = build_tiny_model(tok, seed=0)
    for version, roll, _ in seen:
        model.load_state_dict(states[max(version - 1, 0)])
        with torch.no_grad():
            lp = sequence_logprobs(model, roll.input_ids, roll.attention_mask,
                                   temperature=tr.cfg.temperature,
                                   actions_from=roll.prompt_len)["logp"]
        assert float((lp - roll.logp)[roll.action_mask].abs().max()) < 1e-4
    tr.close()


def test_a_batch_older_than_k_is_dropped_and_counted(tmp_path, tok):
    tr = _trainer(tmp_path / "drop", tok, max_staleness=1, iterations=1)
    tr.train_iteration()
    tr.overlap.pending[0].version -= 3  # as if generated 4 updates back
    rec = tr.train_iteration()
    assert rec["stale_dropped"] == 16 and rec["staleness_max"] <= 1
    rec = tr.train_iteration()
    assert rec["stale_dropped"] == 0
    tr.close()
    assert not _workers()


# ------------------------------------------------------------------ the loss


@st.composite
def decoupled_batches(draw):
    b, length = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    mask = torch.rand(b, length, generator=g) < draw(st.floats(0.2, 1.0))
    mask[0, 0] = True
    prox = -torch.rand(b, length, generator=g) * 3 - 0.05
    drift = draw(st.sampled_from([0.0, 0.05, 0.5, 2.0]))  # behaviour -> proximal
    behav = prox + torch.randn(b, length, generator=g) * drift
    return mask, prox, behav, torch.randn(b, length, generator=g), g


@settings(max_examples=60, deadline=None)
@given(decoupled_batches(), st.sampled_from([1.5, 2.0, 5.0]), st.sampled_from([0.1, 0.2]))
def test_the_decoupled_loss_matches_a_per_token_reference(batch, cap, eps):
    """rollout_is=truncate with the recomputed (proximal) old log-probs is the decoupled
    PPO objective: −mean_t min(π_prox/π_behav, cap) · min(r_t A_t, clip(r_t) A_t), with
    r_t = π_θ/π_prox — the vectorised weight and loss against a loop over the tokens."""
    mask, prox, behav, adv, g = batch
    b, length = mask.shape
    x = torch.randn(b, length, 3, generator=g)
    w0 = torch.randn(3, generator=g) * 0.3
    weight = correction("truncate", "token", prox, behav, mask, 1 / cap, cap).weight
    spec = UpdateSpec(policy_loss="clip", agg="token-mean", max_grad_norm=None,
                      use_critic=False, normalize_advantage=False, clip_range=eps)
    p = w0.clone().requires_grad_()

    def fwd(rows):
        return Forward(-torch.nn.functional.softplus(rows["x"] @ p),
                       torch.zeros(rows["x"].shape[:2]), None)

    mb = {"x": x, "logp": prox, "advantages": adv, "mask": mask, "is_weight": weight}
    eager_minibatch_step(spec, fwd, NoStep([p]), [p], mb)
    q = w0.clone().requires_grad_()
    terms = []
    for i in range(b):
        for t in range(length):
            if not mask[i, t]:
                continue
            new = -torch.nn.functional.softplus(x[i, t] @ q)
            w = min(math.exp(float(prox[i, t]) - float(behav[i, t])), cap)
            r = torch.exp(new - prox[i, t])
            a = float(adv[i, t])
            terms.append(-w * torch.minimum(r * a, r.clamp(1 - eps, 1 + eps) * a))
    torch.stack(terms).mean().backward()
    torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ resume and shutdown


def test_resume_draws_the_prompts_of_the_uninterrupted_run(tmp_path, tok):
    """A run stopped at iteration 2 and resumed to 4: the batches in flight were dropped
    and are generated again with the resumed weights (lag 0, then 1 again); the prompts
    are those the uninterrupted run trained on."""
    whole = _trainer(tmp_path / "whole", tok, max_staleness=1, iterations=4)
    whole.train(progress=False)
    whole.close()
    part = _trainer(tmp_path / "part", tok, max_staleness=1, iterations=2)
    part.train(progress=False)
    part.close()
    assert not _workers()
    resumed = _trainer(tmp_path / "part", tok, max_staleness=1, iterations=4, resume=True)
    assert resumed.iteration == 2
    recs = resumed.train(progress=False)
    resumed.close()
    assert [r["iteration"] for r in recs] == [3, 4]
    assert [r["staleness_max"] for r in recs] == [0, 1]

    def prompts(run):
        rows = [json.loads(x) for x in (tmp_path / run / "samples.jsonl").read_text()
                .splitlines()]
        return [(r["iteration"], r["prompt"]) for r in rows]

    assert prompts("part") == prompts("whole")
    assert len((tmp_path / "part" / "metrics.jsonl").read_text().splitlines()) == 4


def test_the_worker_ends_with_training_and_on_an_exception(tmp_path, tok):
    tr = _trainer(tmp_path / "end", tok, max_staleness=2, iterations=2)
    tr.train(progress=False)
    assert tr.overlap is None and not _workers()  # (before close)
    tr.close()

    def boom(rec):
        if rec["iteration"] == 2:
            raise RuntimeError("a callback failed")

    tr = _trainer(tmp_path / "boom", tok, max_staleness=1, iterations=5, callbacks=[boom])
    with pytest.raises(RuntimeError, match="a callback failed"):
        tr.train(progress=False)
    assert not _workers()


def test_a_sigterm_in_process_checkpoints_and_ends_the_worker(tmp_path, tok):
    def term(rec):
        if rec["iteration"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    tr = _trainer(tmp_path / "term", tok, max_staleness=1, iterations=50, callbacks=[term])
    with GracefulStop(log=lambda m: None) as stop, pytest.raises(Interrupted):
        tr.train(progress=False, stop=stop)
    assert not _workers() and tr.iteration == 2
    verify_checkpoint(tmp_path / "term" / "checkpoints" / "iter_000000002")


def test_sigterm_stops_an_async_run_cleanly_and_resume_continues(tmp_path):
    """``ppokit llm train --max-staleness 1`` SIGTERMed mid-run: exit 143, no child process
    left, the last checkpoint intact; ``--resume`` continues from it to the end."""
    psutil = pytest.importorskip("psutil")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    run = tmp_path / "run"
    args = ["--no-progress", "--no-eval", "--max-staleness", "1", "--prompts-per-iter", "2",
            "--samples-per-prompt", "2", "--set", "sft_steps=5", "--checkpoint-every", "2",
            "--time-limit", "0"]
    proc = subprocess.Popen([sys.executable, "-m", "ppokit", "llm", "train", *args,
                             "--iterations", "100000", "--run-dir", str(run)], env=env,
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    metrics, end = run / "metrics.jsonl", time.monotonic() + 180
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < end, proc.stderr.read()[-2000:]
        time.sleep(0.1)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, proc.stderr.read()[-2000:]
    assert not [c for c in children if c.is_running() and c.status() != "zombie"]
    done = len(metrics.read_text().splitlines())
    last = sorted((run / "checkpoints").iterdir())[-1]
    assert last.name == f"iter_{done:09d}"  # the signal's checkpoint, at the last iteration
    verify_checkpoint(last)  # (raises if anything in it is missing or altered)
    rc = main(["llm", "train", "--resume", str(run), "--no-progress", "--no-eval",
               "--iterations", str(done + 2)])
    assert rc == 0
    recs = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["iteration"] for r in recs] == list(range(1, done + 3))
    assert recs[-2]["staleness_max"] == 0 and recs[-1]["staleness_max"] == 1


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize("kw, said", [
    ({"max_staleness": -1}, "max_staleness"),
    ({"max_staleness": 1, "old_logprobs": "sampler"}, "max_staleness: 1 is not offered "
     "with old_logprobs=sampler"),
    ({"max_staleness": 1, "dynamic_sampling": True}, "max_staleness: 1 is not offered "
     "with dynamic_sampling"),
    ({"max_staleness": 2, "env": "ppokit/GuessNumber-v0"}, "max_staleness: 2 is not "
     "offered with env"),
    ({"max_staleness": 1, "fsdp": True}, "max_staleness: 1 is not offered with fsdp"),
    ({"max_staleness": 1000}, "max_staleness"),
])
def test_bad_settings_are_named(kw, said):
    with pytest.raises(UsageError) as e:
        LLMConfig(**{**BASE, **kw}).resolved()
    assert said in str(e.value) and "\n" not in str(e.value)


def test_bad_settings_on_the_command_line(tmp_path, capsys):
    for flag in (["--max-staleness", "-1"], ["--set", "max_staleness=two"],
                 ["--max-staleness", "1", "--old-logprobs", "sampler"]):
        rc = main(["llm", "train", "--no-progress", *flag, "--run-dir", str(tmp_path / "x")])
        err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert rc == 2 and len(err) == 1 and "max_staleness" in err[0], (flag, err)
        assert not (tmp_path / "x").exists()


def test_several_ranks_are_refused(tmp_path, tok):
    class TwoRanks:
        rank, world = 0, 2

    with pytest.raises(UsageError, match="max_staleness: 1 is not offered with several"):
        TokenTrainer(LLMConfig(**{**BASE, "max_staleness": 1}), str(tmp_path / "dp"),
                     policy=build_tiny_model(tok, seed=0), tokenizer=tok,
                     log=lambda *a: None, dp=TwoRanks())
