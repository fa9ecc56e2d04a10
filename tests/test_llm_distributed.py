"""Data-parallel token training with real processes (2 ranks, gloo, CPU).

N ranks must compute the update one process computes on the same global batch: each
preset, each aggregation mode, gradient accumulation and the target-KL early stop are
checked by giving one process the whole rollout of an iteration and two ranks their halves
(each with the padding its own generation would have had), then comparing the parameters
after the update and the iteration's record.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp

import _dist_worker
from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model, save_policy
from ppokit.llm.training.trainer import LLMConfig, TokenTrainer

BASE = {"prompts_per_iter": 8, "iterations": 1, "checkpoint_every": 1000, "n_epochs": 2,
        "max_new_tokens": 12, "truncation": "penalty"}
CASES = [
    {"algo": "ppo", "batch_size": 2},
    {"algo": "grpo", "batch_size": 8},
    {"algo": "dr-grpo", "batch_size": 8},
    {"algo": "rloo", "batch_size": 8},
    {"algo": "reinforce++", "batch_size": 2, "ent_coef": 0.01},
    {"algo": "grpo", "agg": "token-mean", "batch_size": 8},
    {"algo": "grpo", "agg": "seq-mean-token-sum", "batch_size": 8},
    {"algo": "rloo", "agg": "seq-mean-token-mean", "batch_size": 8, "ent_coef": 0.01},
    {"algo": "ppo", "agg": "seq-mean-token-sum-norm", "batch_size": 4, "grad_accum": 2},
    {"algo": "grpo", "batch_size": 8, "grad_accum": 2, "score_norm": "batch"},
    {"algo": "ppo", "batch_size": 2, "target_kl": 1e-4, "n_epochs": 4},
    # the models sharded across the two ranks (FSDP2): the same update again
    {"algo": "grpo", "batch_size": 8, "fsdp": True},
    {"algo": "ppo", "batch_size": 4, "grad_accum": 2, "fsdp": True},
]
COMPARED = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "grad_norm",
            "kl_loss", "score_mean", "kl_ref", "advantage_mean", "n_updates",
            "early_stop_epoch", "early_stop_minibatch", "explained_variance")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(fn, work) -> None:
    mp.spawn(fn, args=(2, _free_port(), str(work)), nprocs=2, join=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    tok = build_char_tokenizer()
    save_policy(build_tiny_model(tok, seed=0), tok, str(d / "model"))
    return d


def _one_process(work, i: int, case: dict):
    """One process, the whole batch: the reference result; also writes the rollout the
    ranks split."""
    from ppokit.llm.modeling.models import load_lm

    model, tok = load_lm(str(work / "model"))
    one = {k: v for k, v in case.items() if k != "fsdp"}  # one process: nothing to shard
    tr = TokenTrainer(LLMConfig(**one), str(work / f"one_{i}"), policy=model, tokenizer=tok,
                      log=lambda *a: None)
    state = tr.py_rng.getstate()
    prompts = [p for p in tr.sample_prompts() for _ in range(tr.cfg.samples_per_prompt)]
    tr.py_rng.setstate(state)  # train_iteration draws the same prompts again
    roll = tr.rollout(prompts)
    torch.save(roll, work / f"roll_{i}.pt")

    def params():
        out = {k: v.detach().clone() for k, v in tr.policy.state_dict().items()}
        if tr.critic is not None:
            out.update({f"critic.{k}": v.detach().clone()
                        for k, v in tr.critic.state_dict().items()})
        return out

    start = params()
    rec = tr.train_iteration(roll=roll)
    after = params()
    tr.close()
    return start, after, rec


def test_two_ranks_compute_the_update_of_one_process(model_dir):
    work = model_dir
    cases = [{**BASE, **c} for c in CASES]
    (work / "cases.json").write_text(json.dumps(cases))
    ones = [_one_process(work, i, c) for i, c in enumerate(cases)]
    _spawn(_dist_worker.one_update, work)
    for i, (case, (start, p1, r1)) in enumerate(zip(cases, ones)):
        got = torch.load(work / f"dp_{i}.pt")
        p2, r2 = got["params"], got["rec"]
        assert p1.keys() == p2.keys()
        # what the update changed, compared tightly relative to how much it changed
        for k in p1:
            d1, d2 = p1[k] - start[k], p2[k] - start[k]
            scale = float(d1.abs().max())
            assert torch.allclose(d1, d2, atol=1e-3 * scale + 1e-9, rtol=0), (CASES[i], k)
        assert max(float((p1[k] - start[k]).abs().max()) for k in start) > 0, CASES[i]
        for key in COMPARED:
            a, b = r1.get(key), r2.get(key)
            if a is None or b is None:
                assert a is None and b is None, (case, key, a, b)
            else:
                assert b == pytest.approx(a, rel=1e-4, abs=1e-6), (CASES[i], key, a, b)
        assert r2["n_updates"] >= 1
    # the cases really update and really stop early where they should
    stopped = [r for (_, _, r), c in zip(ones, CASES) if "target_kl" in c]
    assert all(r["early_stop_epoch"] is not None for r in stopped)


def test_group_advantages_stay_within_a_rank():
    """Each rank takes whole prompts, with all their samples: a group never straddles two
    ranks, so the group estimators see exactly the groups one process sees."""
    from ppokit.llm.training.parallel import shard

    prompts = [f"p{i}" for i in range(8)]
    blocks = [shard(prompts, r, 2) for r in range(2)]
    assert blocks == [prompts[:4], prompts[4:]]
    with pytest.raises(Exception, match="prompts_per_iter: 6 is not divisible by the 4"):
        class _DP:
            rank, world = 0, 4
        TokenTrainer(LLMConfig(prompts_per_iter=6), "unused", dp=_DP())


@pytest.mark.parametrize("fsdp, extra", [
    (False, {}), pytest.param(True, {}, marks=pytest.mark.slow),
    # dynamic sampling (each rank fills its share, the ranks take the same rounds) with a
    # bf16 sampler's log-probs gathered and corrected by truncated importance weights
    (False, {"algo": "dapo", "sampler_precision": "bf16", "rollout_is": "truncate"})])
def test_resume_of_a_two_rank_run_is_exact(model_dir, tmp_path, fsdp, extra):
    """Straight vs stopped-and-resumed, both on 2 ranks; with fsdp the checkpoint holds
    full model tensors and each rank's optimiser shard, and the exported policy is a
    plain model directory."""
    work = tmp_path
    (work / "model").symlink_to(model_dir / "model")
    (work / "case.json").write_text(json.dumps({"algo": "grpo", "prompts_per_iter": 4,
                                                "checkpoint_every": 2, "max_new_tokens": 10,
                                                "batch_size": 8, "fsdp": fsdp, **extra}))
    _spawn(_dist_worker.train_and_resume, work)

    def rows(name):
        return [json.loads(x) for x in (work / name / "metrics.jsonl").read_text().split("\n")
                if x]

    ra, rb = rows("straight"), rows("resumed")
    assert [r["iteration"] for r in rb] == [1, 2, 3, 4] and all(r["ranks"] == 2 for r in rb)
    for x, y in zip(ra, rb):
        for key in ("score_mean", "kl_ref", "approx_kl", "policy_loss",
                    "response_length_mean", "mismatch_k3_mean", *(
                        ("dynamic_rounds", "dynamic_dropped_groups", "rollout_is_weight_mean")
                        if extra else ())):
            assert x[key] == pytest.approx(y[key], rel=1e-6, abs=1e-9), key
    if extra:
        assert all(r["mismatch_k3_mean"] > 1e-8 for r in rb)
    pa, pb = torch.load(work / "straight_params.pt"), torch.load(work / "resumed_params.pt")
    for k in pa:
        assert torch.allclose(pa[k], pb[k], atol=1e-6), k
    from ppokit.llm.modeling.models import load_lm

    exported = load_lm(str(work / "resumed" / "policy"))[0].state_dict()
    for k in pa:
        assert torch.allclose(exported[k], pb[k], atol=1e-6), k


def test_every_rank_keeps_rank_0s_training_clock(model_dir, tmp_path):
    """The time limit reads one clock on every rank: rank 0's, which leaves its held-out
    scoring out (the other ranks wait it out; their own clocks would count it)."""
    (tmp_path / "model").symlink_to(model_dir / "model")
    _spawn(_dist_worker.one_clock, tmp_path)
    c0, c1 = (json.loads((tmp_path / f"clock_{r}.json").read_text()) for r in (0, 1))
    assert c0["elapsed"] == c1["elapsed"] == c0["wall_time"]
    # three 1-s scorings, two of them between iterations: none is counted
    assert c0["wall_time"] - c0["own"] < 1.0


def test_a_rank_that_dies_ends_the_job_with_a_message_and_an_intact_checkpoint(tmp_path):
    """torchrun with 2 ranks; rank 1 exits hard at the start of iteration 3 (the
    tests/_dist_die.py hook): the job fails, the surviving rank says why, and the
    checkpoint of iteration 2 verifies and resumes in one process."""
    import os

    from ppokit.io import find_checkpoint

    run = tmp_path / "run"
    here = os.path.dirname(__file__)
    args = ["llm", "train", "--algo", "grpo", "--set", "iterations=4", "--set",
            "checkpoint_every=2", "--set", "prompts_per_iter=4", "--set", "sft_steps=20",
            "--set", "max_new_tokens=10", "--run-dir", str(run), "--no-progress",
            "--no-eval"]
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc_per_node=2", os.path.join(here, "_dist_die.py"), *args],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PPOKIT_TEST_DIE": "1:3", "OMP_NUM_THREADS": "1",
             "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert proc.returncode != 0
    assert "stopped because the job lost a rank" in proc.stderr, proc.stderr[-3000:]
    # torchrun's SIGTERM may reach rank 0 while its exit finalizers run: no traceback then
    assert "Exception ignored" not in proc.stderr, proc.stderr[-3000:]
    ckpt, damaged = find_checkpoint(run / "checkpoints", log=lambda m: None)
    assert ckpt is not None and ckpt.name == "iter_000000002" and not damaged
    from ppokit.cli import main

    assert main(["llm", "train", "--resume", str(run), "--no-progress", "--no-eval"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().split("\n") if x]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]


def test_nproc_launches_torchrun(tmp_path):
    """`ppokit llm train --nproc 2` is torchrun underneath: two ranks, one run directory
    written by rank 0, the held-out evaluation at the end."""
    import os

    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "ppokit", "llm", "train", "--algo", "rloo", "--set",
         "iterations=2", "--set", "prompts_per_iter=4", "--set", "sft_steps=20", "--set",
         "max_new_tokens=10", "--set", "n_eval_prompts=16", "--run-dir", str(run),
         "--no-progress", "--nproc", "2"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "launching: torchrun --standalone --nproc_per_node=2" in proc.stderr
    assert f"run dir: {run} (2 ranks)" in proc.stdout
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().split("\n") if x]
    assert [r["ranks"] for r in rows] == [2, 2]
    assert (run / "eval.json").is_file() and (run / "policy").is_dir()


@pytest.mark.slow  # 11 s of two gloo ranks
def test_ranks_start_from_rank_0s_policy_and_reference(tmp_path):
    """Ranks that built different starting models (another machine's arithmetic, an
    unseeded model) still train one policy against one reference: rank 0's."""
    _spawn(_dist_worker.different_starts, tmp_path)
    (p0, r0), (p1, r1) = torch.load(tmp_path / "sums.pt")
    assert p0 == p1 and r0 == r1 and p0 == r0
