"""Rank processes for tests/test_llm_distributed.py (spawned, gloo on CPU)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

TIMING = ("tokens_per_s_generation", "tokens_per_s_scoring", "tokens_per_s_training",
          "time_generation", "time_scoring", "time_training", "wall_time", "ranks")


def _join(rank: int, world: int, port: int):
    from ppokit.engine.dist import init_from_env

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    return init_from_env(timeout_s=120)


def local_rows(roll, rank: int, world: int):
    """Rank ``rank``'s block of a global rollout, with the padding columns no row of the
    block uses removed: the layout that rank's own generation would have produced."""
    from ppokit.llm.modeling.rollout import TokenRollout

    n = roll.input_ids.shape[0] // world
    sub = roll.select(torch.arange(rank * n, (rank + 1) * n))
    used = sub.attention_mask.bool().any(0)
    p = sub.prompt_len
    first = int(torch.nonzero(used[:p]).min())  # the longest prompt of the block
    resp = torch.nonzero(used[p:])
    last = p + (int(resp.max()) + 1 if len(resp) else 1)
    cols = slice(first, last)
    return TokenRollout(sub.input_ids[:, cols], sub.attention_mask[:, cols],
                        sub.action_mask[:, cols], p - first, sub.truncated, sub.response_ids,
                        None if sub.logp is None else sub.logp[:, cols])


def one_update(rank: int, world: int, port: int, work: str) -> None:
    """Every case of ``work/cases.json``: a trainer on this rank's rows of the global
    rollout ``work/roll_{i}.pt``; rank 0 saves the parameters and the record."""
    from ppokit.llm.modeling.models import load_lm
    from ppokit.llm.training.fsdp import full_state_dict
    from ppokit.llm.training.trainer import LLMConfig, TokenTrainer

    dp = _join(rank, world, port)
    work = Path(work)
    cases = json.loads((work / "cases.json").read_text())
    for i, case in enumerate(cases):
        roll = torch.load(work / f"roll_{i}.pt", weights_only=False)
        model, tok = load_lm(str(work / "model"))
        tr = TokenTrainer(LLMConfig(**case), str(work / f"dp_{i}"), policy=model,
                          tokenizer=tok, log=lambda *a: None, dp=dp)
        rec = tr.train_iteration(roll=local_rows(roll, rank, world))
        params = full_state_dict(tr.policy)  # gathered from the shards with fsdp
        if tr.critic is not None:
            params.update({f"critic.{k}": v for k, v in full_state_dict(tr.critic).items()})
        if rank == 0:
            torch.save({"params": params,
                        "rec": {k: v for k, v in rec.items() if k not in TIMING}},
                       work / f"dp_{i}.pt")
        tr.close()
    dp.barrier()


def train_and_resume(rank: int, world: int, port: int, work: str) -> None:
    """A straight 2-rank run of 4 iterations, and one stopped after 2 and resumed."""
    from ppokit.llm.modeling.models import load_lm
    from ppokit.llm.training.fsdp import full_state_dict
    from ppokit.llm.training.trainer import LLMConfig, TokenTrainer

    dp = _join(rank, world, port)
    work = Path(work)
    base = json.loads((work / "case.json").read_text())

    def trainer(name, resume=False, **kw):
        model, tok = load_lm(str(work / "model"))
        return TokenTrainer(LLMConfig(**{**base, **kw}), str(work / name),
                            policy=None if resume else model,
                            tokenizer=None if resume else tok, resume=resume,
                            log=lambda *a: None, dp=dp)

    for name, kw in (("straight", {"iterations": 4}), ("resumed", {"iterations": 2})):
        tr = trainer(name, **kw)
        tr.train(progress=False)
        tr.close()
    tr = trainer("resumed", resume=True, iterations=4)
    assert tr.iteration == 2
    tr.train(progress=False)
    params = full_state_dict(tr.policy)
    if rank == 0:
        torch.save(params, work / "resumed_params.pt")
    tr.close()
    tr = trainer("straight", resume=True, iterations=4)  # reads the final checkpoint
    params = full_state_dict(tr.policy)
    if rank == 0:
        torch.save(params, work / "straight_params.pt")
    tr.close()
    dp.barrier()


def different_starts(rank: int, world: int, port: int, work: str) -> None:
    """Each rank hands the trainer a different starting model: after set-up every rank's
    policy and reference are rank 0's."""
    from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model
    from ppokit.llm.training.trainer import LLMConfig, TokenTrainer

    dp = _join(rank, world, port)
    tok = build_char_tokenizer()
    tr = TokenTrainer(LLMConfig(algo="grpo", prompts_per_iter=4, iterations=1),
                      str(Path(work) / "run"), policy=build_tiny_model(tok, seed=rank),
                      tokenizer=tok, log=lambda *a: None, dp=dp)
    sums = [float(sum(p.double().sum() for p in m.parameters()))
            for m in (tr.policy, tr.reference)]
    got = dp.gather_objects(sums)
    if rank == 0:
        torch.save(got, Path(work) / "sums.pt")
    tr.close()
    dp.barrier()


def one_clock(rank: int, world: int, port: int, work: str) -> None:
    """Three iterations on 2 ranks, rank 0 scoring the held-out set after each (made to
    take 1 s): every rank ends with rank 0's clock, which leaves the scoring out."""
    import time

    from ppokit.llm.modeling.models import load_lm
    from ppokit.llm.training.trainer import LLMConfig, TokenTrainer

    dp = _join(rank, world, port)
    work = Path(work)
    model, tok = load_lm(str(work / "model"))
    tr = TokenTrainer(LLMConfig(algo="grpo", prompts_per_iter=4, iterations=3,
                                max_new_tokens=8, batch_size=8, eval_every=1,
                                time_limit=None, checkpoint_every=1000),
                      str(work / "run"), policy=model, tokenizer=tok, log=lambda *a: None,
                      dp=dp)

    def slow_eval():
        time.sleep(1.0)
        return {"eval/score_mean": 0.0}

    tr.evaluate_heldout = slow_eval
    recs = tr.train(progress=False)
    out = {"elapsed": tr.elapsed}
    if rank == 0:
        out["own"] = sum(r["time_generation"] + r["time_scoring"] + r["time_training"]
                         for r in recs)
        out["wall_time"] = recs[-1]["wall_time"]
    (work / f"clock_{rank}.json").write_text(json.dumps(out))
    tr.close()
    dp.barrier()
