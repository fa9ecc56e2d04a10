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
           "build_bench_model", "trainer_config", "MODEL_SIZES", "TRL_MATCH"]

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


# ppokit's settings in the TRL comparison besides the preset's: TRL's KL term (k3)
TRL_MATCH = {"kl_estimator": "k3"}


def trainer_config(algo: str = "grpo", iterations: int = 5, **overrides):
    """The token trainer's configuration the bench times (before resolution)."""
    from ..training.trainer import LLMConfig

    return replace(LLMConfig(algo=algo, iterations=iterations, checkpoint_every=10**9),
                   **overrides)


def bench_trainer(algo: str = "grpo", iterations: int = 5, model_size: str = "tiny",
                  **overrides) -> dict:
    from ..modeling.models import build_char_tokenizer

    tok = build_char_tokenizer()
    model = build_bench_model(model_size, tok)
    cfg = trainer_config(algo, iterations, **overrides)
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


def bench_trl_grpo(iterations: int = 5, model_size: str = "tiny", precision: str = "bf16",
                   gradient_checkpointing: bool = False, **overrides) -> dict:
    """TRL's GRPO trainer on the same model, task and batch geometry as ppokit's ``grpo``
    preset with :data:`TRL_MATCH` (``overrides``: more of its settings, such as
    ``prompts_per_iter``), configured by :func:`ppokit.llm.evaluation.bench_trl.trl_args`:
    with the built-in model's defaults 64 completions per generation and 4 optimiser steps
    of 32 (``steps_per_generation`` 2 x ``num_iterations`` 2) timed as one iteration, k3
    KL loss with beta 0.02, plain sampling at temperature 1; ``precision`` bf16 is TRL's
    ``bf16=True`` (bench_trl.precision_notes), fp32 sets ``bf16=False``. Returns seconds
    and completion tokens per generation cycle."""
    from ..inputs.task import ReverseTask
    from ..modeling.models import build_char_tokenizer

    cfg = trainer_config("grpo", iterations, precision=precision, **TRL_MATCH,
                         **overrides).resolved()
    tmp = tempfile.mkdtemp(prefix="ppokit-trl-")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecations inside TRL's stack
        return _trl_run(tmp, cfg, ReverseTask(), build_char_tokenizer(), iterations,
                        model_size, gradient_checkpointing)


def _trl_run(tmp, cfg, task, tok, iterations, model_size, gradient_checkpointing):
    import random

    from datasets import Dataset
    from trl import GRPOTrainer

    from ..inputs.task import reverse_score
    from ..modeling.models import save_policy
    from .bench_trl import trl_args, trl_record

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
        args = trl_args(cfg, f"{tmp}/out", iterations, gradient_checkpointing)
        trainer = GRPOTrainer(model=model_dir, reward_funcs=reward, args=args, train_dataset=ds,
                              processing_class=tok, callbacks=[clock])
        ends, cpus, calls, rss_start = train_trl_timed(trainer, clock)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return trl_record(trainer, ends, cpus, calls, rss_start)


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
    reference log-prob passes (once per generation); the rest is training. Returns
    ``(wall clock marks, process time marks, each call's duration, rss at start)``."""
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
    """``ppokit llm bench``. With TRL installed (and ``grpo``), ``rounds`` rounds of runs,
    ppokit then TRL with gradient checkpointing off and on (bench_trl.TRL_RUNS), each in a
    fresh process (default 3): the table gives each figure's median over the rounds, and
    each round's end-to-end ratios are printed, so that a drift of the machine's speed
    during one run shows instead of deciding the result."""
    check_bench_args(batch=batch, length=length, iterations=iterations, algo=algo)
    _check_choices(model_size, precision)
    compare = importlib.util.find_spec("trl") is not None and algo == "grpo"
    if rounds is not None:
        check_int("--rounds", rounds, 1, 100)
    rounds = (3 if compare else 1) if rounds is None else rounds
    g = bench_token_gae(batch, length)
    print(f"token_gae B={g['batch']} L={g['length']}: vectorised {g['token_gae_s'] * 1e3:.1f} ms, "
          f"position loop {g['loop_s'] * 1e3:.1f} ms  (x{g['speedup']:.1f}; max |diff| "
          f"{g['max_abs_diff']:.2e})")
    kw = {"iterations": iterations, "model_size": model_size, "precision": precision}
    ours, theirs = [], {}
    for r in range(rounds):
        if compare:  # each side in its own process: its own peak memory and settings
            from .bench_trl import TRL_RUNS

            ours.append(in_own_process("bench_trainer", algo=algo, **TRL_MATCH, **kw))
            for label, ckpt in TRL_RUNS:
                theirs.setdefault(label, []).append(in_own_process(
                    "bench_trl_grpo", gradient_checkpointing=ckpt, **kw))
            print(round_line(r, rounds, ours[-1], {k: v[-1] for k, v in theirs.items()}),
                  flush=True)
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
    cfg = trainer_config("grpo", iterations, precision=precision, **TRL_MATCH).resolved()
    with_trl(res, t, ours, theirs, rounds, cfg, iterations)
    return res


def _check_choices(model_size: str, precision: str) -> None:
    from ppokit.errors import UsageError

    if model_size not in MODEL_SIZES:
        raise UsageError(f"--model-size: expected one of {', '.join(MODEL_SIZES)}, got "
                         f"{model_size!r}")
    if precision not in ("bf16", "fp32"):
        raise UsageError(f"--precision: expected bf16 or fp32, got {precision!r}")


def round_line(r: int, rounds: int, ours: dict, theirs: dict[str, dict]) -> str:
    """One round's seconds per iteration of each side and TRL / ppokit of each TRL run."""
    a = ours["seconds_per_iteration"]
    return (f"round {r + 1}/{rounds}: ppokit {a:.3f} s/iteration, " + ", ".join(
        f"{k} {v['seconds_per_iteration']:.3f} ({v['seconds_per_iteration'] / a:.2f}x)"
        for k, v in theirs.items()))


def with_trl(res: dict, t: dict, ours: list[dict], theirs: dict[str, list[dict]],
             rounds: int, cfg, iterations: int) -> None:
    """Each TRL run's median record into ``res["trl"]`` (label -> record), each round's
    TRL / ppokit in seconds per iteration (``round_ratios``), TRL / ppokit of the medians
    (``ratios``) and ppokit / TRL in completion tokens per second (``token_ratios``); the
    geometry, what differs (``cfg``: ppokit's resolved configuration, and TRL's
    configuration the runs derived from it), what the number format means on each side
    and the side-by-side table printed."""
    from .bench_trl import (
        check_geometry,
        comparison_table,
        differences,
        precision_notes,
        trl_args,
    )

    trl = {k: median_record(v) for k, v in theirs.items()}
    res["trl"] = trl
    res["round_ratios"] = {k: [b["seconds_per_iteration"] / a["seconds_per_iteration"]
                               for a, b in zip(ours, v)] for k, v in theirs.items()}
    res["ratios"] = {k: v["seconds_per_iteration"] / t["seconds_per_iteration"]
                     for k, v in trl.items()}
    res["token_ratios"] = {k: t["tokens_per_s_total"] / v["tokens_per_s_total"]
                           for k, v in trl.items()}
    print(comparison_table(t, trl, rounds))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        args = trl_args(cfg, tempfile.gettempdir(), iterations, False)
    geo = check_geometry(cfg, args)
    gens = ", ".join(f"{k} {v['generations_per_iteration']:.2f}" for k, v in trl.items())
    print(f"per timed iteration, both sides: {geo['completions']} completions generated "
          f"({cfg.prompts_per_iter} prompts x {cfg.samples_per_prompt}), "
          f"{geo['optimizer_steps']} optimiser steps of {cfg.batch_size} sequences; TRL "
          f"generations counted per timed iteration: {gens}")
    print("\n".join(precision_notes(cfg.precision)))
    print("what differs (the rest is shared: prompts, group size, completion cap, "
          "temperature, learning rate, clip range, KL weight, gradient clipping, loss "
          "aggregation, number format):")
    print("\n".join(differences(cfg, args)))


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
