"""``ppokit llm bench``: ``token_gae`` against the position loop, and the token-level
trainer's throughput per phase (generation / scoring / training) on the built-in task."""

from __future__ import annotations

import importlib.util
import shutil
import statistics
import tempfile
import time
from dataclasses import replace

import torch

__all__ = ["bench_token_gae", "bench_trainer", "run_bench"]


def bench_token_gae(batch: int = 64, length: int = 4096, repeats: int = 3) -> dict:
    from ppokit.core import token_gae, token_gae_reference

    g = torch.Generator().manual_seed(0)
    r = torch.randn(batch, length, generator=g)
    v = torch.randn(batch, length, generator=g)
    m = torch.rand(batch, length, generator=g) < 0.8

    def timed(fn):
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = fn(r, v, m, 1.0, 0.95)
            ts.append(time.perf_counter() - t0)
        return min(ts), out

    t_vec, (a1, _) = timed(token_gae)
    t_loop, (a2, _) = timed(token_gae_reference)
    return {"batch": batch, "length": length, "token_gae_s": t_vec, "loop_s": t_loop,
            "speedup": t_loop / t_vec, "max_abs_diff": float((a1 - a2).abs().max())}


def bench_trainer(algo: str = "grpo", iterations: int = 5, **overrides) -> dict:
    from .models import build_char_tokenizer, build_tiny_model
    from .trainer import LLMConfig, TokenTrainer

    tok = build_char_tokenizer()
    model = build_tiny_model(tok)
    cfg = replace(LLMConfig(algo=algo, iterations=iterations, checkpoint_every=10**9),
                  **overrides)
    tmp = tempfile.mkdtemp(prefix="ppokit-bench-")
    try:
        tr = TokenTrainer(cfg, tmp, policy=model, tokenizer=tok, log=lambda *a: None)
        tr.train_iteration()  # warm-up
        recs = [tr.train_iteration() for _ in range(iterations)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = {"algo": algo, "sequences_per_iter": tr.cfg.prompts_per_iter * tr.cfg.samples_per_prompt}
    for phase in ("generation", "scoring", "training"):
        out[f"tokens_per_s_{phase}"] = statistics.median(r[f"tokens_per_s_{phase}"]
                                                         for r in recs)
        out[f"time_{phase}"] = statistics.median(r[f"time_{phase}"] for r in recs)
    tot = sum(r["time_generation"] + r["time_scoring"] + r["time_training"] for r in recs)
    out["tokens_per_s_total"] = sum(r["response_tokens"] for r in recs) / tot
    out["seconds_per_iteration"] = tot / len(recs)
    return out


def run_bench(batch: int = 64, length: int = 4096, iterations: int = 5,
              algo: str = "grpo") -> dict:
    g = bench_token_gae(batch, length)
    print(f"token_gae B={g['batch']} L={g['length']}: vectorised {g['token_gae_s'] * 1e3:.1f} ms, "
          f"position loop {g['loop_s'] * 1e3:.1f} ms  (x{g['speedup']:.1f}; max |diff| "
          f"{g['max_abs_diff']:.2e})")
    t = bench_trainer(algo, iterations)
    print(f"trainer ({t['algo']}, {t['sequences_per_iter']} sequences/iteration, "
          f"torch threads {torch.get_num_threads()}):")
    for phase in ("generation", "scoring", "training"):
        print(f"  {phase:<10} {t[f'tokens_per_s_{phase}']:>10.0f} tokens/s   "
              f"{t[f'time_{phase}'] * 1e3:7.1f} ms/iteration")
    print(f"  total      {t['tokens_per_s_total']:>10.0f} tokens/s   "
          f"{t['seconds_per_iteration'] * 1e3:7.1f} ms/iteration")
    if importlib.util.find_spec("trl") is None:
        print("trl is not installed: the TRL GRPO comparison is skipped")
    else:
        print("trl is installed, but the side-by-side TRL run is not implemented in this "
              "version")
    return {"token_gae": g, "trainer": t}
