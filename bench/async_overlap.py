"""Generation overlapped with training (``max_staleness = 1``) against the synchronous loop
(``max_staleness = 0``), side by side in one process: the same model, batch and seed,
one torch thread per side (the generation worker is a second Python thread of the
trainer's process; ``torch`` runs each thread's operations on that thread).

    python -m bench.async_overlap --model-size 10m --iterations 4 --rounds 2
    python -m bench.async_overlap --model-size 10m --gil

Each round times ``--iterations`` iterations of each side after one warm-up iteration,
the sides alternating round by round (so that a change in the machine's load falls on
both). Three sides: ``sync`` (the default loop: the sampler's log-probs serve as PPO's old ones),
``sync+recompute`` (the old log-probs recomputed and the IS weight applied: the work of an
async iteration without the overlap) and ``async K=1``. Prints the median wall seconds per
iteration of each side and the ratios (above 1: the overlap is faster), and the phases
behind them: generation, scoring (rewards and the frozen passes) and training seconds, and
for the async side the trainer's wait for the worker and the share of the generation
hidden behind training (``overlap_frac``), and the process's CPU seconds per wall second
(``cores busy``: above 1 only where the worker and the trainer ran at the same time, on
two cores — what the interpreter lock and the machine's other work allowed). With two
free cores the best the overlap can
do is an iteration of ``max(generation, the rest)`` instead of their sum."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch

from ppokit.llm.evaluation.bench import MODEL_SIZES, build_bench_model
from ppokit.llm.modeling.models import build_char_tokenizer
from ppokit.llm.training.config import LLMConfig
from ppokit.llm.training.trainer import TokenTrainer

# the sides: the synchronous loop as it runs by default (the sampler's log-probs are PPO's
# old ones), the same with the old log-probs recomputed and the IS weight applied (the work
# an async iteration does, without the overlap), and the overlap
SIDES = {"sync": {}, "sync+recompute": {"old_logprobs": "recompute", "rollout_is": "truncate"},
         "async K=1": {"max_staleness": 1}}


def _side(size: str, extra: dict, args) -> dict:
    """Wall seconds per iteration and the median phase times of one side."""
    tok = build_char_tokenizer()
    cfg = LLMConfig(algo="grpo", prompts_per_iter=args.prompts, samples_per_prompt=args.samples,
                    max_new_tokens=args.tokens, iterations=10**6, checkpoint_every=10**6,
                    time_limit=0, seed=0, samples_logged=0, **extra)
    tmp = tempfile.mkdtemp(prefix="ppokit-async-bench-")
    tr = None
    try:
        tr = TokenTrainer(cfg, tmp, policy=build_bench_model(size, tok), tokenizer=tok,
                          log=lambda *a: None)
        tr.train_iteration()  # warm-up (the worker starts here)
        t0, c0 = time.perf_counter(), time.process_time()
        recs = [tr.train_iteration() for _ in range(args.iterations)]
        wall = (time.perf_counter() - t0) / args.iterations
        cpu = (time.process_time() - c0) / args.iterations
    finally:
        if tr is not None:
            tr.close()
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(r.get(k, 0.0) for r in recs)
           for k in ("time_generation", "time_scoring", "time_training", "time_waiting",
                     "overlap_frac", "staleness_mean", "response_tokens")}
    return {"wall": wall, "cores": cpu / wall, **med}


def in_torch_share(size: str, tokens: int) -> None:
    """How much of one generation and of one training pass (forward and backward) runs
    inside torch's operations, where the interpreter lock is released (torch.profiler: the
    top-level ``aten::`` and autograd-engine events against the wall time); the rest is
    Python, which the worker thread and the trainer take turns at."""
    from torch.profiler import ProfilerActivity, profile

    from ppokit.llm.modeling.rollout import encode_prompts, generate, sequence_logprobs

    tok = build_char_tokenizer()
    model = build_bench_model(size, tok)
    ids, mask = encode_prompts(tok, ["0123456789>"] * 16)

    def gen():
        return generate(model, ids, mask, max_new_tokens=tokens, eos_token_id=-1,
                        pad_token_id=tok.pad_token_id, temperature=1.0,
                        generator=torch.Generator().manual_seed(0))

    roll = gen()

    def train():
        out = sequence_logprobs(model, roll.input_ids, roll.attention_mask,
                                actions_from=roll.prompt_len, with_entropy=True)
        out["logp"].sum().backward()
        model.zero_grad(set_to_none=True)

    for name, fn in (("generation", gen), ("training pass", train)):
        fn()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            fn()
            wall = time.perf_counter() - t
        inside = sum(e.cpu_time_total for e in prof.events() if e.cpu_parent is None and (
            e.name.startswith("aten::") or e.name.startswith("autograd::engine"))) / 1e6
        print(f"{size} {name}: {inside:.3f} of {wall:.3f} s inside torch operations "
              f"({inside / wall:.0%})")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-size", default="10m", choices=MODEL_SIZES)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32, help="max_new_tokens")
    ap.add_argument("--gil", action="store_true", help="only the share of generation and "
                    "training inside torch operations (the interpreter lock released)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.gil:
        in_torch_share(args.model_size, args.tokens)
        return
    sides: dict[str, list] = {k: [] for k in SIDES}
    for rnd in range(args.rounds):
        for name in (list(SIDES) if rnd % 2 == 0 else list(SIDES)[::-1]):
            res = _side(args.model_size, SIDES[name], args)
            sides[name].append(res)
            print(f"round {rnd + 1} {name}: {res['wall']:.3f} s/iteration (generation "
                  f"{res['time_generation']:.3f} s, scoring {res['time_scoring']:.3f} s, "
                  f"training {res['time_training']:.3f} s"
                  + (f", waited {res['time_waiting']:.3f} s, overlap "
                     f"{res['overlap_frac']:.0%}" if "async" in name else "") + ")",
                  flush=True)
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in sides.items()}
    load = os.getloadavg()[0]
    print(f"\n{args.model_size} model, {args.prompts} prompts x {args.samples} completions x "
          f"{args.tokens} new tokens, {args.iterations} iterations x {args.rounds} rounds, "
          f"one torch thread per side, {os.cpu_count()} cores on this machine (load average "
          f"{load:.1f} at the end)")
    for name, m in med.items():
        print(f"{name:>15}: {m['wall']:.3f} s/iteration, {m['cores']:.2f} cores busy; "
              f"generation {m['time_generation']:.3f}"
              f" + scoring {m['time_scoring']:.3f} + training {m['time_training']:.3f}"
              + (f"; the trainer waited {m['time_waiting']:.3f} for the worker, overlap "
                 f"{m['overlap_frac']:.0%}, lag {m['staleness_mean']:.1f}"
                 if "async" in name else ""))
    s, r, a = (med[k]["wall"] for k in SIDES)
    gen = med["sync+recompute"]["time_generation"]
    print(f"sync / async: {s / a:.2f}x; sync+recompute / async: {r / a:.2f}x (the bound on "
          f"two free cores: max(generation, the rest) instead of their sum, "
          f"{r / max(gen, r - gen):.2f}x)")

if __name__ == "__main__":
    main()
