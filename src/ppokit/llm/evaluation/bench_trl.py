"""TRL's side of ``ppokit llm bench``: its ``GRPOConfig`` derived from ppokit's resolved
configuration, the timed window, the two TRL runs, the side-by-side table, and what
differs between the sides.

**One timed iteration is one generation on both sides.** ppokit's iteration samples
``prompts_per_iter x samples_per_prompt`` completions and takes ``n_epochs`` passes over
them in minibatches of ``batch_size`` sequences, one optimiser step each. TRL's
``GRPOTrainer`` generates ``generation_batch_size`` completions at once and then takes
``steps_per_generation x num_iterations`` optimiser steps on them before it generates
again. :func:`trl_args` sets ``per_device_train_batch_size`` to ppokit's ``batch_size``,
``steps_per_generation`` to the minibatches of one pass and ``num_iterations`` to
``n_epochs``, and the timed window is that many steps (:func:`trl_geometry`);
:func:`check_geometry` refuses a pair of configurations that would generate or step a
different number of times, and :func:`trl_record` reports how many generations TRL made
per timed window, counted.

**Gradient checkpointing** is on by default in TRL's ``GRPOConfig`` and never used by
ppokit's trainer: TRL runs twice in each round, with it off (the row ``TRL``) and on
(``TRL ckpt``, TRL's default), and both rows are printed with their peak memory.
"""

from __future__ import annotations

import math
import statistics

__all__ = ["TRL_RUNS", "LOSS_TYPES", "ppokit_geometry", "trl_geometry", "check_geometry",
           "trl_args", "trl_record", "precision_notes", "differences", "comparison_table"]

# (row label, gradient_checkpointing): each round runs TRL once per entry
TRL_RUNS = (("TRL", False), ("TRL ckpt", True))
# ppokit's loss aggregation -> TRL's loss_type computing the same sum
LOSS_TYPES = {"seq-mean-token-mean": "grpo"}


def ppokit_geometry(cfg) -> dict:
    """Completions generated and optimiser steps taken in one iteration of ppokit's
    resolved configuration ``cfg``."""
    n = cfg.prompts_per_iter * cfg.samples_per_prompt
    return {"completions": n, "optimizer_steps": cfg.n_epochs * math.ceil(n / cfg.batch_size)}


def trl_geometry(args) -> dict:
    """Completions generated at once by TRL with ``args`` (a ``GRPOConfig``, one process),
    and the optimiser steps it takes on them: the timed window of one iteration."""
    return {"completions": args.generation_batch_size,
            "optimizer_steps": args.steps_per_generation * args.num_iterations}


def check_geometry(cfg, args) -> dict:
    """The common geometry of ppokit's ``cfg`` and TRL's ``args``; a ``RuntimeError`` (a
    bench that would compare unequal work) when they differ."""
    ours, theirs = ppokit_geometry(cfg), trl_geometry(args)
    if ours != theirs:
        raise RuntimeError(f"bench geometry differs: ppokit {ours}, TRL {theirs}")
    return ours


def trl_args(cfg, out_dir: str, iterations: int, gradient_checkpointing: bool):
    """TRL's ``GRPOConfig`` for ppokit's resolved ``cfg``: the same completions per
    generation, minibatch, passes, completion cap, sampling temperature (no top-k/top-p),
    learning rate (constant, no warm-up), Adam epsilon, clip range, KL weight, gradient
    clipping, loss aggregation and number format (module doc), for one warm-up and
    ``iterations`` timed generation cycles."""
    from trl import GRPOConfig

    n = cfg.prompts_per_iter * cfg.samples_per_prompt
    if n % cfg.batch_size or cfg.agg not in LOSS_TYPES:
        raise RuntimeError(f"no TRL configuration does the same work as batch_size "
                           f"{cfg.batch_size} of {n} sequences with agg {cfg.agg!r}")
    args = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=cfg.batch_size,
        steps_per_generation=n // cfg.batch_size, num_iterations=cfg.n_epochs,
        num_generations=cfg.samples_per_prompt, max_completion_length=cfg.max_new_tokens,
        max_steps=cfg.n_epochs * (n // cfg.batch_size) * (iterations + 1),
        learning_rate=cfg.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        adam_epsilon=1e-6, weight_decay=0.0, epsilon=cfg.clip_range, beta=cfg.kl_coef,
        loss_type=LOSS_TYPES[cfg.agg], max_grad_norm=cfg.max_grad_norm,
        temperature=cfg.temperature, top_p=1.0, top_k=0,
        gradient_checkpointing=gradient_checkpointing, bf16=cfg.precision == "bf16",
        logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    check_geometry(cfg, args)
    return args


def trl_record(trainer, ends: list, cpus: list, calls: dict, rss_start: float) -> dict:
    """TRL's timing of one run: a cycle every :func:`trl_geometry` optimiser steps
    (``ends``: the wall clock at the start and after each step; ``cpus``: the process
    time likewise), the first one the warm-up; completion tokens from its log; the phases
    from ``calls``; the generations it made per cycle, counted."""
    geo = trl_geometry(trainer.args)
    steps, n = geo["optimizer_steps"], geo["completions"]

    def per_cycle(marks):
        return [marks[i + steps] - marks[i] for i in range(0, len(marks) - steps, steps)][1:]

    lengths = [h["completions/mean_length"] for h in trainer.state.log_history
               if "completions/mean_length" in h][1:]
    sec = statistics.median(per_cycle(ends))
    toks = statistics.mean(lengths) * n
    gen, gen_score = calls["_generate"][1:], calls["_generate_and_score_completions"][1:]
    out = {"seconds_per_iteration": sec, "completion_tokens_per_iteration": toks,
           "tokens_per_s_total": toks / sec, "sequences_per_iter": n,
           "optimizer_steps_per_iteration": steps,
           "generations_per_iteration": len(calls["_generate_and_score_completions"])
           / ((len(ends) - 1) // steps),
           "cpu_seconds_per_iteration": statistics.median(per_cycle(cpus)),
           "rss_start_mb": rss_start}
    if gen and len(gen) == len(gen_score):  # the first cycle is the warm-up
        out["time_generation"] = statistics.median(gen)
        out["time_scoring"] = statistics.median(b - a for a, b in zip(gen, gen_score))
        out["time_training"] = max(sec - statistics.median(gen_score), 0.0)
    return out


def precision_notes(precision: str) -> list[str]:
    """What ``--precision`` means on each side, as each library runs it."""
    if precision == "fp32":
        return ["number format: float32 on both sides (TRL bf16=False, its model loaded in "
                "float32; ppokit precision=fp32)"]
    return ["bf16 in TRL (bf16=True): the weights float32 as loaded; the scoring and "
            "training forwards under accelerate's bfloat16 autocast (linear layers and "
            "sdpa attention in bfloat16, the RMS norms in float32); sampling "
            "(transformers' generate on the unwrapped model) outside it, in float32",
            "bf16 in ppokit (precision=bf16): linear layers' products in bfloat16 under "
            "autocast (weights float32), residual stream, RMS norms, rotary embedding and "
            "attention in float32 (C kernels on the CPU); the reference's frozen linear "
            "weights stored in bfloat16 (llm/modeling/precision.py)"]


def differences(cfg, args) -> list[str]:
    """Every setting in which ppokit's resolved ``cfg`` and TRL's ``args`` differ, one
    line each (what each library does its own way, not the shared geometry)."""
    lora = cfg.lora_r > 0
    old = ("a separate no-grad pass" if args.num_iterations > 1
           or args.steps_per_generation > args.gradient_accumulation_steps
           else "the training pass's, detached")
    rows = [("gradient checkpointing", "off", "off (row TRL) / on (row TRL ckpt, "
             "TRL's default)"),
            ("old log-probs", "the sampler's" if cfg.old_logprobs == "sampler"
             else "a separate no-grad pass", old),
            ("sampling", "its own sampler, each group's prompt computed once",
             "transformers' generate, each completion's prompt computed"),
            ("forward", "its fused forward (llm/modeling/fused.py)",
             "transformers' forward (attention as the model's configuration gives: sdpa)")]
    if not lora:  # with LoRA both take the model with its adapters off
        rows.append(("reference log-probs", "a frozen copy" + (
            " (linear weights in bfloat16)" if cfg.precision == "bf16" else ""),
            "a second model loaded from disk"))
    if cfg.kl_estimator != "k3":
        rows.append(("KL loss estimator", cfg.kl_estimator, "k3"))
    if cfg.guard_kl:
        rows.append(("divergence guard", f"guard_kl {cfg.guard_kl:g}: a no-grad pass over "
                     "up to 8 rows after each update", "none"))
    return [f"  {name} - ppokit: {a}; TRL: {b}" for name, a, b in rows]


def comparison_table(t: dict, trls: dict[str, dict], rounds: int = 1) -> str:
    """ppokit and each TRL run (``trls``: label -> record) side by side: seconds per
    iteration by phase (wall), end-to-end tokens/s, CPU seconds, memory, and TRL / ppokit
    for each time (above 1: ppokit is faster); ``rounds`` > 1: medians over the rounds."""
    title = "TRL GRPOTrainer vs ppokit, same model, prompts and batch geometry"
    if rounds > 1:
        title += f" (medians of {rounds} runs each)"
    head = f"  {'':<30}{'ppokit':>10}" + "".join(f"{k:>10}{'/ppokit':>9}" for k in trls)
    rows = [title, head]

    def line(label, a, bs, fmt="{:.3f}", ratio=True):
        if a is None:
            return
        row = f"  {label:<30}{fmt.format(a):>10}"
        for b in bs:
            r = f"{b / a:.2f}x" if ratio and b is not None and a > 0 else ""
            row += f"{'' if b is None else fmt.format(b):>10}{r:>9}"
        rows.append(row)

    def pair(label, key, fmt="{:.3f}", ratio=True):
        line(label, t.get(key), [r.get(key) for r in trls.values()], fmt, ratio)

    for phase in ("generation", "scoring", "training"):
        pair(f"{phase} (s/iteration)", f"time_{phase}")
    pair("end to end (s/iteration)", "seconds_per_iteration")
    pair("CPU seconds / iteration", "cpu_seconds_per_iteration")
    # each library's policy learns while it is timed, so the completions it samples (and
    # the work per iteration) drift apart: tokens/s divides that out
    line("completion tokens / iteration", t["tokens_per_s_total"] * t["seconds_per_iteration"],
         [r["completion_tokens_per_iteration"] for r in trls.values()], "{:.0f}", False)
    pair("completion tokens / s", "tokens_per_s_total", "{:.0f}", ratio=False)
    rows.append("  ppokit / TRL in completion tokens per s: " + ", ".join(
        f"{k} {t['tokens_per_s_total'] / r['tokens_per_s_total']:.2f}x" for k, r in trls.items()))
    pair("RSS before training (MiB)", "rss_start_mb", "{:.0f}", ratio=False)
    pair("peak RSS (MiB)", "peak_rss_mb", "{:.0f}", ratio=False)
    return "\n".join(rows)
