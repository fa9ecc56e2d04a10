"""``ppokit llm bench``: ``token_gae`` against the position loop, and the token-level
trainer's throughput per phase (generation / scoring / training) on the built-in task, side
by side with TRL's GRPO trainer when it is installed. ``--model-size 10m`` runs both on a
Qwen2-architecture model of about 10M parameters (random init, saved in a temporary
directory) instead of the 110k-parameter built-in one."""

from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import tempfile
import time
import warnings
from dataclasses import replace

import torch

from ..training.guards import check_bench_args, check_int

__all__ = ["bench_token_gae", "bench_trainer", "bench_trl_grpo", "run_bench",
           "build_bench_model", "MODEL_SIZES"]

MODEL_SIZES = ("tiny", "10m")


def build_bench_model(size: str, tok):
    """The benchmark's model: the built-in tiny Llama (``tiny``, about 0.1M parameters) or
    a Qwen2-architecture model of about 10M parameters (``10m``: width 256, 10 layers,
    4 heads of 64, MLP 1024), random init, seed 0, over the character tokenizer."""
    from ..modeling.models import build_tiny_model, quiet_transformers

    if size == "tiny":
        return build_tiny_model(tok)
    if size != "10m":
        from ppokit.errors import UsageError

        raise UsageError(f"--model-size: expected one of {', '.join(MODEL_SIZES)}, got "
                         f"{size!r}")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    quiet_transformers()
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=256, num_hidden_layers=10,
                      num_attention_heads=4, num_key_value_heads=4, intermediate_size=1024,
                      max_position_embeddings=128, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    return Qwen2ForCausalLM(cfg)


def rss_mb() -> float:
    """Resident set size of this process now (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def peak_rss_mb() -> float:
    """The process's peak resident set size (``ru_maxrss``: KiB on Linux)."""
    try:
        import resource
    except ImportError:  # not on this OS
        return 0.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(fn_name: str, threads: int, kwargs: dict) -> dict:
    torch.set_num_threads(threads)
    out = globals()[fn_name](**kwargs)
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def in_own_process(fn_name: str, **kwargs) -> dict:
    """``fn_name(**kwargs)`` of this module in a fresh process (same torch thread count),
    so that each side's peak memory is its own and no process-wide setting one library
    makes (ppokit's allocator settings, engine/allocator.py) reaches the other."""
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(_child, (fn_name, torch.get_num_threads(), kwargs))


def bench_token_gae(batch: int = 64, length: int = 4096, repeats: int = 3) -> dict:
    from ppokit.core import token_gae, token_gae_reference

    check_bench_args(batch=batch, length=length, iterations=1, algo="grpo")
    check_int("repeats", repeats, 1, 10_000)

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


def bench_trainer(algo: str = "grpo", iterations: int = 5, model_size: str = "tiny",
                  **overrides) -> dict:
    from ..modeling.models import build_char_tokenizer
    from ..training.trainer import LLMConfig

    tok = build_char_tokenizer()
    model = build_bench_model(model_size, tok)
    cfg = replace(LLMConfig(algo=algo, iterations=iterations, checkpoint_every=10**9),
                  **overrides)
    tr, recs, cpu, rss_start = timed_iterations(cfg, iterations, policy=model, tokenizer=tok)
    out = {"algo": algo, "sequences_per_iter": tr.cfg.prompts_per_iter * tr.cfg.samples_per_prompt}
    for phase in ("generation", "scoring", "training"):
        out[f"tokens_per_s_{phase}"] = statistics.median(r[f"tokens_per_s_{phase}"]
                                                         for r in recs)
        out[f"time_{phase}"] = statistics.median(r[f"time_{phase}"] for r in recs)
    tot = sum(r["time_generation"] + r["time_scoring"] + r["time_training"] for r in recs)
    out["tokens_per_s_total"] = sum(r["response_tokens"] for r in recs) / tot
    out["seconds_per_iteration"] = tot / len(recs)
    # CPU seconds of this process: on a shared machine, less sensitive to other jobs than
    # wall time (with one torch thread they measure the work itself)
    out["cpu_seconds_per_iteration"] = statistics.median(cpu)
    out["rss_start_mb"] = rss_start
    return out


def bench_trl_grpo(iterations: int = 5, prompts_per_iter: int = 16,
                   samples_per_prompt: int = 4, max_new_tokens: int | None = None,
                   model_size: str = "tiny", precision: str = "bf16") -> dict:
    """TRL's GRPO trainer on the same tiny model, task and batch geometry as ppokit's
    ``grpo`` preset: 64 completions per generation, 4 optimiser steps of 32 completions each
    (``steps_per_generation`` 2 x ``num_iterations`` 2), k3 KL loss with beta 0.02, plain
    sampling at temperature 1; ``precision`` bf16 is TRL's default (``bf16=True``: the
    model's forward under bfloat16 autocast), fp32 sets ``bf16=False``. Returns seconds and
    completion tokens per generation cycle."""
    from ..inputs.task import ReverseTask
    from ..modeling.models import build_char_tokenizer

    task = ReverseTask()
    tok = build_char_tokenizer()
    tmp = tempfile.mkdtemp(prefix="ppokit-trl-")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecations inside TRL's stack
        return _trl_run(tmp, task, tok, iterations, prompts_per_iter, samples_per_prompt,
                        max_new_tokens, model_size, precision)


def _trl_run(tmp, task, tok, iterations, prompts_per_iter, samples_per_prompt, max_new_tokens,
             model_size="tiny", precision="bf16"):
    import random

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from ..inputs.task import reverse_score
    from ..modeling.models import save_policy

    try:
        model_dir = f"{tmp}/model"
        # TRL builds its reference from a path
        save_policy(build_bench_model(model_size, tok), tok, model_dir)
        # the same token sequences as ppokit's prompts, which start with BOS (TRL
        # tokenizes a plain-text prompt as it is): the BOS written out in the text
        bos = tok.bos_token
        ds = Dataset.from_dict({"prompt": [bos + q for q in
                                           task.train_prompts(4096, random.Random(0))]})

        def reward(prompts, completions, **_):
            return reverse_score([q.removeprefix(bos) for q in prompts], completions)

        clock = step_clock()
        n = prompts_per_iter * samples_per_prompt
        steps_per_cycle = 4
        cfg = GRPOConfig(output_dir=f"{tmp}/out", per_device_train_batch_size=n // 2,
                         steps_per_generation=2, num_iterations=2,
                         num_generations=samples_per_prompt,
                         max_completion_length=max_new_tokens or task.max_new_tokens,
                         max_steps=steps_per_cycle * (iterations + 1), learning_rate=2e-4,
                         beta=0.02, temperature=1.0, top_p=1.0, top_k=0, logging_steps=1,
                         report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
                         bf16=precision == "bf16")
        trainer = GRPOTrainer(model=model_dir, reward_funcs=reward, args=cfg, train_dataset=ds,
                              processing_class=tok, callbacks=[clock])
        ends, cpus, calls, rss_start = train_trl_timed(trainer, clock)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return trl_record(trainer, ends, cpus, calls, steps_per_cycle, n, rss_start)


def step_clock():
    """A TRL callback that records the wall clock and the process time after each
    optimiser step (``.t``, ``.cpu``)."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self):
            self.t, self.cpu = [], []

        def on_step_end(self, args, state, control, **kw):  # noqa: ARG002
            self.t.append(time.perf_counter())
            self.cpu.append(time.process_time())

    return Clock()


def train_trl_timed(trainer, clock) -> tuple[list, list, dict, float]:
    """Run TRL's ``trainer`` (with ``clock``, a :func:`step_clock`, among its callbacks),
    timing where its time goes: its sampling call, and sampling + the reward, old and
    reference log-prob passes (once per generation cycle); the rest is training. Returns
    ``(wall clock marks, process time marks, the calls' end times, rss at start)``."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # keep the log dicts off stdout
    calls = {"_generate": [], "_generate_and_score_completions": []}
    for name, times in calls.items():
        if hasattr(trainer, name):
            setattr(trainer, name, timing_wrapper(getattr(trainer, name), times))
    rss_start = rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    return [t0] + clock.t, [c0] + clock.cpu, calls, rss_start


def trl_record(trainer, ends: list, cpus: list, calls: dict, steps: int, n: int,
               rss_start: float) -> dict:
    """TRL's timing of one run: a cycle every ``steps`` optimiser steps (``ends``: the wall
    clock at the start and after each step; ``cpus``: the process time likewise), the first
    one the warm-up; completion tokens from its log; the phases from ``calls`` (the times
    at which its generation and its scoring returned)."""
    def per_cycle(marks):
        return [marks[i + steps] - marks[i] for i in range(0, len(marks) - steps, steps)][1:]

    lengths = [h["completions/mean_length"] for h in trainer.state.log_history
               if "completions/mean_length" in h][1:]
    sec = statistics.median(per_cycle(ends))
    toks = statistics.mean(lengths) * n
    out = {"seconds_per_iteration": sec, "completion_tokens_per_iteration": toks,
           "tokens_per_s_total": toks / sec, "sequences_per_iter": n,
           "cpu_seconds_per_iteration": statistics.median(per_cycle(cpus)),
           "rss_start_mb": rss_start}
    gen, gen_score = calls["_generate"][1:], calls["_generate_and_score_completions"][1:]
    if gen and len(gen) == len(gen_score):  # the first cycle is the warm-up
        out["time_generation"] = statistics.median(gen)
        out["time_scoring"] = statistics.median(b - a for a, b in zip(gen, gen_score))
        out["time_training"] = max(sec - statistics.median(gen_score), 0.0)
    return out


def timing_wrapper(fn, times: list):
    def run(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            times.append(time.perf_counter() - t0)
    return run


def run_bench(batch: int = 64, length: int = 4096, iterations: int = 5,
              algo: str = "grpo", model_size: str = "tiny", precision: str = "bf16",
              rounds: int | None = None) -> dict:
    """``ppokit llm bench``. With TRL installed (and ``grpo``), ``rounds`` pairs of runs,
    ppokit then TRL, each in a fresh process (default 3): the table gives each figure's
    median over the rounds, and each round's end-to-end ratio is printed, so that a drift
    of the machine's speed during one run shows instead of deciding the result."""
    check_bench_args(batch=batch, length=length, iterations=iterations, algo=algo)
    if model_size not in MODEL_SIZES:
        from ppokit.errors import UsageError

        raise UsageError(f"--model-size: expected one of {', '.join(MODEL_SIZES)}, got "
                         f"{model_size!r}")
    if precision not in ("bf16", "fp32"):
        from ppokit.errors import UsageError

        raise UsageError(f"--precision: expected bf16 or fp32, got {precision!r}")
    compare = importlib.util.find_spec("trl") is not None and algo == "grpo"
    if rounds is not None:
        check_int("--rounds", rounds, 1, 100)
    rounds = (3 if compare else 1) if rounds is None else rounds
    g = bench_token_gae(batch, length)
    print(f"token_gae B={g['batch']} L={g['length']}: vectorised {g['token_gae_s'] * 1e3:.1f} ms, "
          f"position loop {g['loop_s'] * 1e3:.1f} ms  (x{g['speedup']:.1f}; max |diff| "
          f"{g['max_abs_diff']:.2e})")
    kw = {"iterations": iterations, "model_size": model_size, "precision": precision}
    ours, theirs = [], []
    for r in range(rounds):
        if compare:  # each side in its own process: its own peak memory and settings
            # the KL loss term TRL's GRPOTrainer computes (k3), so both do the same work
            ours.append(in_own_process("bench_trainer", algo=algo, kl_estimator="k3", **kw))
            theirs.append(in_own_process("bench_trl_grpo", **kw))
            if rounds > 1:
                a, b = ours[-1]["seconds_per_iteration"], theirs[-1]["seconds_per_iteration"]
                print(f"round {r + 1}/{rounds}: ppokit {a:.3f} s/iteration, TRL {b:.3f}: "
                      f"TRL/ppokit {b / a:.2f}x")
        else:
            ours.append(bench_trainer(algo, iterations, model_size=model_size,
                                      precision=precision))
    t = median_record(ours)
    print(f"trainer ({t['algo']}, model {model_size}, precision {precision}, "
          f"{t['sequences_per_iter']} "
          f"sequences/iteration, torch threads {torch.get_num_threads()}"
          f"{f', median of {rounds} runs' if rounds > 1 else ''}):")
    for phase in ("generation", "scoring", "training"):
        print(f"  {phase:<10} {t[f'tokens_per_s_{phase}']:>10.0f} tokens/s   "
              f"{t[f'time_{phase}'] * 1e3:7.1f} ms/iteration")
    print(f"  total      {t['tokens_per_s_total']:>10.0f} tokens/s   "
          f"{t['seconds_per_iteration'] * 1e3:7.1f} ms/iteration")
    res = {"token_gae": g, "trainer": t, "rounds": rounds}
    if importlib.util.find_spec("trl") is None:
        print("trl is not installed: the TRL GRPO comparison is skipped")
        return res
    if algo != "grpo":
        print("the TRL comparison runs with --algo grpo only")
        return res
    trl_res = with_trl(res, t, ours, theirs, rounds)
    res["ratio"] = t["tokens_per_s_total"] / trl_res["tokens_per_s_total"]
    res["cpu_ratio"] = trl_res["cpu_seconds_per_iteration"] / t["cpu_seconds_per_iteration"]
    return res


def with_trl(res: dict, t: dict, ours: list[dict], theirs: list[dict], rounds: int) -> dict:
    """TRL's median record into ``res`` (``trl``) with each round's ratio of seconds per
    iteration (``round_ratios``), and the side-by-side table printed; returns the record."""
    trl_res = median_record(theirs)
    res["trl"] = trl_res
    res["round_ratios"] = [b["seconds_per_iteration"] / a["seconds_per_iteration"]
                           for a, b in zip(ours, theirs)]
    print(comparison_table(t, trl_res, rounds))
    return trl_res


def timed_iterations(cfg, iterations: int, **trainer_kw):
    """``(trainer, records, cpu seconds, rss at start)`` of ``iterations`` timed training
    iterations of ``cfg`` after one warm-up, in a temporary run directory removed after;
    the resident memory is read once the libraries are imported and the models built."""
    from ..training.trainer import TokenTrainer

    tmp = tempfile.mkdtemp(prefix="ppokit-bench-")
    tr = None
    try:
        tr = TokenTrainer(cfg, tmp, log=lambda *a: None, **trainer_kw)
        rss_start = rss_mb()
        tr.train_iteration()  # warm-up
        recs, cpu = [], []
        for _ in range(iterations):
            c0 = time.process_time()
            recs.append(tr.train_iteration())
            cpu.append(time.process_time() - c0)
    finally:
        if tr is not None:
            tr.close()  # its metrics writers, before their directory goes
        shutil.rmtree(tmp, ignore_errors=True)
    return tr, recs, cpu, rss_start


def median_record(recs: list[dict]) -> dict:
    """Each numeric figure's median over the runs (the others from the first run)."""
    out = dict(recs[0])
    for k, v in recs[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            vals = [r[k] for r in recs if isinstance(r.get(k), (int, float))]
            out[k] = statistics.median(vals)
    return out


def comparison_table(t: dict, trl: dict, rounds: int = 1) -> str:
    """ppokit and TRL side by side: seconds per iteration by phase (wall), end-to-end
    tokens/s, CPU seconds, memory, and TRL / ppokit for each time (above 1: ppokit is
    faster); ``rounds`` > 1: each figure the median over that many runs."""
    title = "TRL GRPOTrainer vs ppokit, same model, prompts and batch geometry"
    if rounds > 1:
        title += f" (medians of {rounds} runs each)"
    rows = [f"{title:<66}",
            f"  {'':<30}{'ppokit':>10}{'TRL':>10}{'TRL/ppokit':>12}"]

    def line(label, a, b, fmt="{:.3f}", ratio=True):
        if a is None or b is None:
            return
        r = f"{b / a:.2f}x" if ratio and a > 0 else ""
        rows.append(f"  {label:<30}{fmt.format(a):>10}{fmt.format(b):>10}{r:>12}")

    for phase in ("generation", "scoring", "training"):
        line(f"{phase} (s/iteration)", t.get(f"time_{phase}"), trl.get(f"time_{phase}"))
    line("end to end (s/iteration)", t["seconds_per_iteration"], trl["seconds_per_iteration"])
    line("CPU seconds / iteration", t["cpu_seconds_per_iteration"],
         trl["cpu_seconds_per_iteration"])
    # each library's policy learns while it is timed, so the completions it samples (and
    # the work per iteration) drift apart: tokens/s divides that out
    line("completion tokens / iteration", t["tokens_per_s_total"] * t["seconds_per_iteration"],
         trl["completion_tokens_per_iteration"], "{:.0f}", ratio=False)
    line("completion tokens / s", t["tokens_per_s_total"], trl["tokens_per_s_total"],
         "{:.0f}", ratio=False)
    rows[-1] += f"{t['tokens_per_s_total'] / trl['tokens_per_s_total']:>11.2f}x (ppokit/TRL)"
    line("RSS before training (MiB)", t.get("rss_start_mb"), trl.get("rss_start_mb"), "{:.0f}",
         ratio=False)
    line("peak RSS (MiB)", t.get("peak_rss_mb"), trl.get("peak_rss_mb"), "{:.0f}", ratio=False)
    return "\n".join(rows)

