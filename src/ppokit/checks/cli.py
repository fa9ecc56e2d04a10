"""``ppokit check [RUN_DIR] [--env ENV] [--model PATH | --lm] [--json]``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ppokit.cliutil import int_arg as _int
from ppokit.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", nargs="?",
                        help="check the policy trained in this run directory, environment "
                             "or language-model run (default: a freshly initialised policy "
                             "for --env)")
    parser.add_argument("--env", default=None,
                        help="Gymnasium id for the default policy (default: CartPole-v1); "
                             "with RUN_DIR, the run's module:Id again when it has one")
    parser.add_argument("--model", metavar="PATH",
                        help="check a local Hugging Face causal LM directory (token layout)")
    parser.add_argument("--lm", action="store_true",
                        help="check ppokit's built-in tiny language model (token layout)")
    parser.add_argument("--samples", type=_int, default=256,
                        help="environment transitions to check on (default 256, at most "
                             "1000000)")
    parser.add_argument("--seed", type=_int, default=0, help="random seed (default 0)")
    parser.add_argument("--no-labels", action="store_true",
                        help="skip the label-freezing check (it runs the trainer briefly)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def _env_report(args):
    import torch

    from . import run_checks
    from .labels import check_labels_frozen
    from .policy_checks import collect_batch

    if args.run_dir is not None:
        from ppokit.algos.evaluate import load_policy
        from ppokit.io.rundir import check_run_dir

        check_run_dir(args.run_dir)
        cfg, policy, norm, _ = load_policy(args.run_dir, args.env, "--env")
        if getattr(policy, "recurrent", False):
            raise UsageError(f"{args.run_dir}: ppokit check runs feed-forward policies; this "
                             "run's policy is recurrent (recurrent = lstm)")
        env_id, target = cfg.env_id, f"{args.run_dir} ({cfg.env_id})"
        base = cfg.to_dict()
        transform = None if norm is None else (lambda o: norm(o))
    else:
        from ppokit.algos.config import resolve_config
        from ppokit.envs import make_vec
        from ppokit.envs.source import import_env_module
        from ppokit.policies import policy_for_config

        cfg = resolve_config(env_id=import_env_module(args.env or "CartPole-v1", "--env"))
        env = make_vec(cfg.env_id, 1, vectorization="sync")
        torch.manual_seed(args.seed)
        # the preset's feed-forward policy (an Atari preset: the CNN); checks run
        # feed-forward policies, so a preset's LSTM is left out
        import dataclasses

        policy = policy_for_config(dataclasses.replace(cfg, recurrent="none"),
                                   env.single_observation_space, env.single_action_space)
        env.close()
        env_id, target, base, transform = cfg.env_id, f"default policy ({cfg.env_id})", \
            None, None
    batch = collect_batch(policy, env_id, n=args.samples, seed=args.seed,
                          obs_transform=transform, env_kwargs=cfg.env_kwargs)
    extra = []
    if not args.no_labels:
        extra.append(lambda: check_labels_frozen(policy, env=env_id, base_config=base,
                                                 seed=args.seed))
    clip = getattr(cfg, "clip_range", 0.2) or 0.2
    return run_checks(policy, batch, clip_eps=clip, seed=args.seed, extra=extra,
                      target=target)


def _lm_report(args):
    from .token_checks import run_token_checks

    if args.model is not None:
        from ppokit.llm.models import load_lm

        model, tok = load_lm(args.model)
        target = args.model
    else:
        from ppokit.llm.models import build_char_tokenizer, build_tiny_model

        tok = build_char_tokenizer()
        model = build_tiny_model(tok, seed=args.seed)
        target = "built-in tiny language model"
    return run_token_checks(model, tok, seed=args.seed, labels=not args.no_labels,
                            target=target)


MAX_SAMPLES = 10**6


def run(args: argparse.Namespace) -> int:
    from ppokit.algos.config import SEED_MAX

    if not 0 <= args.seed <= SEED_MAX:
        raise UsageError(f"--seed: expected an integer in [0, {SEED_MAX}], got {args.seed}")
    if not 2 <= args.samples <= MAX_SAMPLES:
        raise UsageError(f"--samples: expected an integer in [2, {MAX_SAMPLES}], got "
                         f"{args.samples}")
    if (args.model or args.lm) and args.run_dir:
        raise UsageError("give either RUN_DIR or --model/--lm, not both")
    if args.model and args.lm:
        raise UsageError("give either --model PATH or --lm, not both")
    if args.run_dir and (Path(args.run_dir) / "reference").is_dir():
        # a language-model run directory: check the policy it saved
        policy_dir = Path(args.run_dir) / "policy"
        if not policy_dir.is_dir():
            raise UsageError(f"{args.run_dir}: no saved policy/ yet (the run has not finished)")
        from ppokit.io import check_tree

        check_tree(policy_dir, "run dir")  # what it reads stays inside the run
        args.model, args.run_dir = str(policy_dir), None
    report = _lm_report(args) if (args.model or args.lm) else _env_report(args)
    if args.json:
        json.dump({"target": report.target, "ok": report.ok,
                   "results": [r.to_dict() for r in report.results]}, sys.stdout, indent=2,
                  default=float)
        sys.stdout.write("\n")
    else:
        report.print()
    return 0 if report.ok else 1
