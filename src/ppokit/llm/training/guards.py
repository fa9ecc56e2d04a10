"""Argument checks of the LLM entry points and the refusal to save non-finite weights.

The Python entry points (:func:`ppokit.llm.training.sft.sft_train`,
:func:`ppokit.llm.training.rm.train_reward_model`, :func:`ppokit.llm.training.dpo.dpo_train`,
:func:`ppokit.llm.evaluation.bench.run_bench`) check their arguments before any work and raise
:class:`ppokit.errors.UsageError` naming the ``ppokit llm`` flag that sets each one
(``--lr: expected a finite number in (0, 10], got inf``); the command line turns that into
exit status 2 and one line. :func:`check_cli_args` runs the same checks on a parsed
``ppokit llm`` namespace, so a command can refuse bad flags before it builds a model.

:func:`check_finite_model` (from :mod:`ppokit.llm.modeling.tuning`, importable from here)
refuses a model with a NaN or infinite weight: training ends with it (nothing is saved)
rather than writing a model that cannot be used.
"""

from __future__ import annotations

import math
from typing import Any

from ppokit.algos import memory
from ppokit.algos.config import SEED_MAX
from ppokit.engine.recipe import COEF_MAX
from ppokit.errors import UsageError
from ppokit.settings import fail

from ..modeling.tuning import check_finite_model
from .presets import ALGOS

__all__ = ["check_int", "check_float", "check_pairs", "check_finite_model", "check_cli_args",
           "check_sft_args", "check_rm_args", "check_dpo_args", "check_bench_args",
           "MAX_STEPS", "MAX_BATCH", "LR_MAX", "BETA_MAX"]

MAX_STEPS = 10**7
MAX_EPOCHS = 10_000
MAX_BATCH = 65_536
MAX_PAIRS = 10**7
LR_MAX = 10.0
BETA_MAX = 1e6
BENCH_MAX_LENGTH = 2**20


def _fail(flag: str, what: str, value: Any) -> None:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    err = UsageError(f"{flag}: expected {what}, got {text}")
    err.field = flag
    raise err


def check_int(flag: str, value: Any, lo: int, hi: int) -> int:
    """``value`` if it is an integer in ``[lo, hi]``; else a UsageError naming ``flag``."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        _fail(flag, f"an integer in [{lo}, {hi}]", value)
    return value


def check_float(flag: str, value: Any, lo: float, hi: float, *, lo_open: bool = False,
                hi_open: bool = False) -> float:
    """``value`` if it is a finite number in the interval; else a UsageError naming ``flag``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        try:
            f = float(value)
        except OverflowError:
            ok = False
        else:
            ok = (math.isfinite(f) and (lo < f if lo_open else lo <= f)
                  and (f < hi if hi_open else f <= hi))
    if not ok:
        _fail(flag, f"a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}"
              f"{')' if hi_open else ']'}", value)
    return float(value)


def check_pairs(flag: str, pairs: Any) -> None:
    """A non-empty list of ``{prompt, chosen, rejected}`` dicts of strings."""
    if not isinstance(pairs, list) or not pairs:
        n = len(pairs) if isinstance(pairs, list) else type(pairs).__name__
        raise UsageError(f"{flag}: expected a non-empty list of preference pairs, got {n}")
    for i, p in enumerate(pairs):
        if not isinstance(p, dict) or not all(isinstance(p.get(k), str)
                                              for k in ("prompt", "chosen", "rejected")):
            raise UsageError(f"{flag}: pair {i} is not a {{prompt, chosen, rejected}} dict "
                             "of strings")


def _common(*, batch_size, lr, seed) -> None:
    check_int("--batch-size", batch_size, 1, MAX_BATCH)
    check_float("--lr", lr, 0.0, LR_MAX, lo_open=True)
    check_int("--seed", seed, 0, SEED_MAX)


def check_sft_args(*, steps, batch_size, lr, seed, weight_decay: float = 0.0) -> None:
    check_int("--steps", steps, 1, MAX_STEPS)
    _common(batch_size=batch_size, lr=lr, seed=seed)
    check_float("weight_decay", weight_decay, 0.0, 1.0)


def check_rm_args(*, epochs, batch_size, lr, seed) -> None:
    check_int("--epochs", epochs, 1, MAX_EPOCHS)
    _common(batch_size=batch_size, lr=lr, seed=seed)


def check_dpo_args(*, beta, epochs, batch_size, lr, seed) -> None:
    check_float("--beta", beta, 0.0, BETA_MAX, lo_open=True)
    check_rm_args(epochs=epochs, batch_size=batch_size, lr=lr, seed=seed)


def check_bench_args(*, batch, length, iterations, algo) -> None:
    check_int("--batch", batch, 1, MAX_BATCH)
    check_int("--length", length, 1, BENCH_MAX_LENGTH)
    check_int("--iterations", iterations, 1, MAX_EPOCHS)
    if algo not in ALGOS:
        raise UsageError(f"--algo: expected one of {', '.join(ALGOS)}, got {algo!r}")
    # token_gae's inputs and outputs: rewards, values, mask, advantages, returns and the
    # position loop's copies, float32 (the mask as bool)
    need, avail = 4 * 8 * batch * length, memory.available_memory()
    if avail is not None and need > avail:
        raise UsageError(f"--length: --batch * --length = {batch} * {length} = "
                         f"{batch * length:,} positions need at least {need / 2**30:.1f} GiB, "
                         f"more than the {avail / 2**30:.1f} GiB of memory available")


def _check_pair_args(args) -> None:
    check_float("--eval-frac", args.eval_frac, 0.0, 1.0, lo_open=True, hi_open=True)
    if getattr(args, "data", None) is None:
        check_int("--n-pairs", args.n_pairs, 2, MAX_PAIRS)
    if getattr(args, "prefer_longer", None) is not None:
        check_float("--prefer-longer", args.prefer_longer, 0.0, 1.0)


def _check_paths(args, *names: str) -> None:
    from ..modeling.models import check_output_dir

    for name in names:
        v = getattr(args, name, None)
        if v is not None and (not v.strip() or "\0" in v):
            raise UsageError(f"--{name.replace('_', '-')}: expected a non-empty path, "
                             f"got {v!r}")
        if name == "out" and v is not None:
            check_output_dir(v)  # before any training: nothing saved may be lost


def check_cli_args(args) -> None:
    """Check a parsed ``ppokit llm SUBCOMMAND`` namespace before any work (``train``'s
    settings are checked by :meth:`LLMConfig.resolved`)."""
    cmd = getattr(args, "llm_command", None)
    if cmd == "sft":
        _check_paths(args, "model", "data", "out")
        check_sft_args(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                       seed=args.seed)
    elif cmd == "rm":
        _check_paths(args, "model", "data", "out")
        _check_pair_args(args)
        check_rm_args(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                      seed=args.seed)
    elif cmd == "dpo":
        _check_paths(args, "model", "data", "out")
        _check_pair_args(args)
        check_dpo_args(beta=args.beta, epochs=args.epochs, batch_size=args.batch_size,
                       lr=args.lr, seed=args.seed)
    elif cmd == "bench":
        check_bench_args(batch=args.batch, length=args.length,
                         iterations=5 if args.iterations is None else args.iterations,
                         algo=args.algo)
    elif cmd == "compare":
        check_int("--eval-every", args.eval_every, 1, 10**9)
    elif cmd == "eval":
        if args.n_prompts is not None:
            check_int("--n-prompts", args.n_prompts, 1, 10**6)
        if args.temperature is not None:
            check_float("--temperature", args.temperature, 0.0, 100.0)
        check_int("--seed", args.seed, 0, SEED_MAX)


def reward_weights(w):
    """``reward_weights`` as a tuple of finite floats (from a list or '1,0.5')."""
    import math

    if w is None:
        return None
    if isinstance(w, str):
        try:
            w = [float(x) for x in w.split(",") if x.strip()]
        except ValueError:
            fail("reward_weights", "expected comma-separated numbers", w)
    if isinstance(w, (int, float)) and not isinstance(w, bool):
        w = [w]
    if not isinstance(w, (list, tuple)) or not w or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            and abs(x) <= COEF_MAX for x in w):
        fail("reward_weights", "expected a non-empty list of finite numbers", w)
    return tuple(float(x) for x in w)


def check_rollout_memory(cfg) -> None:
    """Refuse a rollout whose per-token buffers alone (token ids, old, reference and new
    log-probs, values, advantages, returns, masks: at least 64 bytes a token) exceed the
    available memory, naming the largest of its three factors."""
    tokens = cfg.prompts_per_iter * cfg.samples_per_prompt * (cfg.max_new_tokens or 1)
    need, avail = 64 * tokens, memory.available_memory()
    if avail is None or need <= avail:
        return
    factors = {"prompts_per_iter": cfg.prompts_per_iter,
               "samples_per_prompt": cfg.samples_per_prompt,
               "max_new_tokens": cfg.max_new_tokens or 1}
    name = max(factors, key=factors.__getitem__)
    fail(name, f"prompts_per_iter * samples_per_prompt * max_new_tokens = "
          f"{' * '.join(map(str, factors.values()))} = {tokens:,} tokens per iteration need "
          f"at least {need / 2**30:.1f} GiB, more than the {avail / 2**30:.1f} GiB of memory "
          "available", show=False)
