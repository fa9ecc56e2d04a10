"""``ppokit llm bench --model NAME``: ppokit and TRL's ``GRPOTrainer`` on the same pretrained
model, side by side.

Both train GRPO on the same model, the same prompts (a chat task of
:mod:`ppokit.llm.inputs.chat_tasks`, rendered by the model's own chat template), the same group
size, completion cap, sampling temperature, update geometry (one pass over each
generation's completions in two minibatches, one optimiser step each: one TRL generation
per timed ppokit iteration, :mod:`ppokit.llm.evaluation.bench_trl`), loss (sequence mean of
token means), KL term to the reference (TRL's k3 on both sides, β 0.02; ppokit's training
default is k2), learning rate, gradient clipping and LoRA adapters (rank 16, α 32, every
linear layer of the decoder), in float32 (on a CPU without native bfloat16 both run far
slower in bfloat16). Each runs in a fresh process, ppokit then TRL with gradient
checkpointing off and then on (TRL's default), for ``rounds`` rounds; the table gives each
figure's median and each round's ratios are printed, with every setting that differs.
What each library then does its own way is its speed: ppokit's fused forward and sampler,
old log-probs from the sampler, the reference as the adapters switched off, the divergence
guard; TRL's generate, its old-log-prob pass and its reference pass.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import tempfile
import time
import warnings

import torch

from ppokit.errors import UsageError

from .bench import (
    median_record,
    peak_rss_mb,
    step_clock,
    timed_iterations,
    train_trl_timed,
    with_trl,
)
from .bench_trl import TRL_RUNS, trl_args, trl_record

__all__ = ["GEOMETRY", "real_config", "bench_ppokit_real", "bench_trl_real", "run_real_bench",
           "matmul_peak_gflops", "token_flops"]

# the shared settings (TRL's names in the comments)
GEOMETRY = {
    "prompts_per_iter": 8,      # generation_batch_size / num_generations
    "samples_per_prompt": 4,    # num_generations
    "max_new_tokens": 32,       # max_completion_length
    "temperature": 0.7,
    "n_epochs": 1,              # num_iterations
    "learning_rate": 1e-4,
    "kl_coef": 0.02,            # beta
    "max_grad_norm": 1.0,
    "lora_r": 16,
    "lora_alpha": 32.0,
    "kl_estimator": "k3",       # TRL's KL term (ppokit's default is k2)
}


def matmul_peak_gflops(n: int = 1536, repeats: int = 5) -> float:
    """This machine's float32 matrix-multiply throughput at torch's current thread count:
    the best of ``repeats`` products of two ``n`` x ``n`` matrices, in GFLOP/s (2 n^3
    operations each). The yardstick of the fraction of peak."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def token_flops(model) -> dict:
    """Multiply-add operations (2 per multiply-accumulate) of one token's forward pass:
    ``body``, through the decoder's linear layers (attention's score and mixing products,
    a few percent at these lengths, are left out), and ``head``, the output layer over the
    whole vocabulary (paid only where a token is sampled or scored)."""
    head = model.get_output_embeddings()
    body = 0
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and mod is not head and "lora_" not in name:
            body += mod.weight.numel()
    return {"body": 2 * body, "head": 2 * head.weight.numel()}


def _fractions(out: dict, flops: dict, n_epochs: int, peak: float) -> None:
    """Each phase's estimated GFLOP/s and fraction of ``peak``, counting only the
    completion tokens (prompts are shorter and their shared prefix is computed once, so
    this is a lower bound): generation and scoring one forward per token, training a
    forward and a backward (about the forward's cost again: the frozen weights get no
    gradient) per token and epoch."""
    per_token = flops["body"] + flops["head"]
    passes = {"generation": 1, "scoring": 1, "training": 2 * n_epochs}
    for phase, k in passes.items():
        gf = out[f"tokens_per_s_{phase}"] * per_token * k / 1e9
        out[f"gflops_{phase}"] = gf
        out[f"peak_fraction_{phase}"] = gf / peak


def real_config(model_dir: str, task: str = "numbers", iterations: int = 3,
                prompts_per_iter: int | None = None):
    """ppokit's configuration of the comparison (before resolution): GRPO on ``model_dir``
    with :data:`GEOMETRY` (``prompts_per_iter``: another number of prompts), the
    completions of one iteration in two minibatches."""
    from ..training.config import LLMConfig

    g = dict(GEOMETRY, prompts_per_iter=prompts_per_iter or GEOMETRY["prompts_per_iter"])
    return LLMConfig(algo="grpo", model=model_dir, task=task, iterations=iterations + 1,
                     checkpoint_every=10**9, agg="seq-mean-token-mean",
                     batch_size=g["prompts_per_iter"] * g["samples_per_prompt"] // 2, **g)


def bench_ppokit_real(model_dir: str, task: str = "numbers", iterations: int = 3,
                      prompts_per_iter: int | None = None) -> dict:
    """ppokit's GRPO on ``model_dir`` with :func:`real_config`: seconds and completion
    tokens per iteration by phase (medians after one warm-up iteration)."""
    cfg = real_config(model_dir, task, iterations, prompts_per_iter)
    tr, recs, cpu, rss_start = timed_iterations(cfg, iterations)
    flops = token_flops(tr.policy)
    out = {"sequences_per_iter": tr.cfg.prompts_per_iter * tr.cfg.samples_per_prompt}
    for phase in ("generation", "scoring", "training"):
        out[f"time_{phase}"] = statistics.median(r[f"time_{phase}"] for r in recs)
        out[f"tokens_per_s_{phase}"] = statistics.median(r[f"tokens_per_s_{phase}"]
                                                         for r in recs)
    tot = sum(r["time_generation"] + r["time_scoring"] + r["time_training"] for r in recs)
    out["seconds_per_iteration"] = tot / len(recs)
    out["tokens_per_s_total"] = sum(r["response_tokens"] for r in recs) / tot
    out["completion_tokens_per_iteration"] = statistics.mean(r["response_tokens"]
                                                             for r in recs)
    out["cpu_seconds_per_iteration"] = statistics.median(cpu)
    out["rss_start_mb"] = rss_start
    out["peak_gflops"] = matmul_peak_gflops()
    _fractions(out, flops, tr.cfg.n_epochs, out["peak_gflops"])
    return out


def bench_trl_real(model_dir: str, task: str = "numbers", iterations: int = 3,
                   prompts_per_iter: int | None = None,
                   gradient_checkpointing: bool = False) -> dict:
    """TRL's ``GRPOTrainer`` on ``model_dir`` configured from :func:`real_config` by
    :func:`ppokit.llm.evaluation.bench_trl.trl_args` (``loss_type="grpo"``, ``bf16=False``,
    a PEFT ``LoraConfig`` of the same rank): seconds per generation cycle (one ppokit
    iteration: two optimiser steps) and the share of its sampling and scoring."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from ..inputs.chat_tasks import exact_answer
    from ..inputs.task import make_task

    cfg = real_config(model_dir, task, iterations, prompts_per_iter).resolved()
    t = make_task(task)
    ds = Dataset.from_list([t.row(p) for p in t.train_prompts(4096, random.Random(0))])

    def correct(completions, answer, **_):
        return exact_answer(completions, answer)

    tmp = tempfile.mkdtemp(prefix="ppokit-trl-")
    clock = step_clock()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = trl_args(cfg, f"{tmp}/out", iterations, gradient_checkpointing)
            lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                              target_modules="all-linear", task_type="CAUSAL_LM")
            tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
            trainer = GRPOTrainer(model=model_dir, reward_funcs=correct, args=args,
                                  train_dataset=ds, processing_class=tok, callbacks=[clock],
                                  peft_config=lora)
            ends, cpus, calls, rss_start = train_trl_timed(trainer, clock)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return trl_record(trainer, ends, cpus, calls, rss_start)


def _child(fn_name: str, threads: int, kwargs: dict) -> dict:
    torch.set_num_threads(threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = globals()[fn_name](**kwargs)
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def _own_process(fn_name: str, **kwargs) -> dict:
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(_child, (fn_name, torch.get_num_threads(), kwargs))


def run_real_bench(model: str, task: str = "numbers", iterations: int = 3,
                   rounds: int = 3, prompts_per_iter: int | None = None) -> dict:
    """The side-by-side comparison (module docstring); prints the table and returns the
    medians, each round's ratios and the end-to-end ratios of each TRL run."""
    import importlib.util

    from ..modeling.fetch import resolve_model
    from ..training.guards import check_int

    check_int("--iterations", iterations, 1, 1000)
    check_int("--rounds", rounds, 1, 100)
    if prompts_per_iter is not None:
        check_int("--prompts-per-iter", prompts_per_iter, 1, 4096)
    model_dir = resolve_model(model)
    if not os.path.isdir(model_dir):
        raise UsageError(f"--model: {model!r} is not a model directory or a fetched model")
    have_trl = all(importlib.util.find_spec(m) is not None for m in ("trl", "peft"))
    kw = {"model_dir": model_dir, "task": task, "iterations": iterations,
          "prompts_per_iter": prompts_per_iter}
    ours, theirs = [], {}
    for r in range(rounds):
        ours.append(_own_process("bench_ppokit_real", **kw))
        line = f"round {r + 1}/{rounds}: ppokit {ours[-1]['seconds_per_iteration']:.2f} s/iteration"
        for label, ckpt in TRL_RUNS if have_trl else ():
            rec = _own_process("bench_trl_real", gradient_checkpointing=ckpt, **kw)
            theirs.setdefault(label, []).append(rec)
            line += (f", {label} {rec['seconds_per_iteration']:.2f} "
                     f"({rec['seconds_per_iteration'] / ours[-1]['seconds_per_iteration']:.2f}x)")
        print(line, flush=True)
    t = median_record(ours)
    cfg = real_config(model_dir, task, iterations, prompts_per_iter).resolved()
    print(f"GRPO on {model} ({task} task; {cfg.prompts_per_iter} prompts x "
          f"{cfg.samples_per_prompt} samples, up to {cfg.max_new_tokens} tokens; LoRA r "
          f"{cfg.lora_r}; float32; torch threads {torch.get_num_threads()}; medians of "
          f"{rounds} rounds of {iterations} iterations):")
    print(f"  float32 matrix-multiply peak of this machine: {t['peak_gflops']:.0f} GFLOP/s")
    for phase in ("generation", "scoring", "training"):
        print(f"  ppokit {phase:<10} {t[f'tokens_per_s_{phase}']:>8.1f} tokens/s   "
              f"{t[f'time_{phase}']:7.2f} s/iteration   ~{t[f'gflops_{phase}']:.0f} GFLOP/s, "
              f"{100 * t[f'peak_fraction_{phase}']:.0f}% of peak")
    res = {"ppokit": t, "rounds": rounds}
    if not have_trl:
        print("trl (and peft) are not installed: the TRL comparison is skipped "
              "(pip install 'ppokit[bench]')")
        return res
    with_trl(res, t, ours, theirs, rounds, cfg, iterations)
    return res
