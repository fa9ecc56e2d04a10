"""``ppokit check [RUN_DIR] [--env ENV] [--model PATH | --lm] [--json]``.

``--env ID`` checks the environment itself first (:mod:`ppokit.checks.environment`), then
the default policy on it; every result goes into one table (or one JSON object). The exit
status is 1 when a check FAILs (with ``--strict``, also when one WARNs), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ppokit.cliutil import int_arg
from ppokit.errors import UsageError

from .environment import DEFAULT_SECONDS, DEFAULT_STEPS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", nargs="?",
                        help="check the policy trained in this run directory, environment "
                             "or language-model run (default: a freshly initialised policy "
                             "for --env)")
    parser.add_argument("--env", default=None,
                        help="check this environment (registered id, module:Id, "
                             "ALE/Game-v5), then the default policy on it (default: "
                             "CartPole-v1, policy only); with RUN_DIR, the run's module:Id "
                             "again when it has one")
    parser.add_argument("--env-kwargs", metavar="JSON",
                        help='keyword arguments of the environment, a JSON object such as '
                             '\'{"size": 8}\'')
    parser.add_argument("--env-steps", type=int_arg, default=DEFAULT_STEPS, metavar="N",
                        help=f"steps of the environment checks' run (default {DEFAULT_STEPS})")
    parser.add_argument("--env-seconds", type=float, default=DEFAULT_SECONDS, metavar="S",
                        help="seconds the environment checks' run may take at most "
                             f"(default {DEFAULT_SECONDS:g})")
    parser.add_argument("--no-policy", action="store_true",
                        help="with --env: only the environment checks")
    parser.add_argument("--model", metavar="PATH",
                        help="check a local Hugging Face causal LM directory (token layout), "
                             "and the run's configuration on it")
    parser.add_argument("--lm", action="store_true",
                        help="check ppokit's built-in tiny language model (token layout), "
                             "and the run's configuration on it after its warm start")
    parser.add_argument("--samples", type=int_arg, default=256,
                        help="environment transitions to check on (default 256, at most "
                             "1000000)")
    parser.add_argument("--seed", type=int_arg, default=0, help="random seed (default 0)")
    parser.add_argument("--no-labels", action="store_true",
                        help="skip the label-freezing check (it runs the trainer briefly)")
    parser.add_argument("--no-config", action="store_true",
                        help="with --lm/--model: only the token-layout checks, not the "
                             "run's configuration")
    parser.add_argument("--lm-prompts", type=int_arg, default=8, metavar="N",
                        help="with --lm/--model: training prompts sampled for the "
                             "configuration checks (default 8), each completed "
                             "samples_per_prompt times (4 when that is 1)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1 on a warning too")
    parser.add_argument("--list-codes", action="store_true",
                        help="list the check codes and exit")
    group = parser.add_argument_group(
        "the language-model run's configuration (with --lm / --model: the flags of "
        "ppokit llm train, --config FILE.toml and --set KEY=VALUE)")
    from ppokit.llm.cli import add_config_arguments

    add_config_arguments(group, skip=("model", "seed", "env", "env_kwargs"), epilog=False)
    # check's own --env / --env-kwargs name a Gymnasium environment, not an agent run's
    parser.set_defaults(llm_not_config=("env", "env_kwargs"))


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
        if cfg.selfplay:
            raise UsageError(f"{args.run_dir}: ppokit check does not play self-play games; "
                             f"evaluate this run with ppokit eval {args.run_dir} --opponent "
                             "random (or heuristic, snapshot:N, RUN2)")
        env_id, target = cfg.env_id, f"{args.run_dir} ({cfg.env_id})"
        base = cfg.to_dict()
        transform = None if norm is None else (lambda o: norm(o))
    else:
        from ppokit.algos.config import resolve_config
        from ppokit.envs import make_vec
        from ppokit.envs.source import import_env_module
        from ppokit.policies import policy_for_config

        cfg = resolve_config(env_id=import_env_module(args.env or "CartPole-v1", "--env"),
                             flags={"env_kwargs": args.parsed_env_kwargs})
        env = make_vec(cfg.env_id, 1, vectorization="sync", env_kwargs=cfg.env_kwargs)
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
                          obs_transform=transform, env_kwargs=cfg.env_kwargs,
                          agent_id=cfg.agent_id, agent_groups=cfg.agent_groups)
    extra = []
    if not args.no_labels:
        extra.append(lambda: check_labels_frozen(policy, env=env_id, base_config=base,
                                                 seed=args.seed))
    clip = getattr(cfg, "clip_range", 0.2) or 0.2
    return run_checks(policy, batch, clip_eps=clip, seed=args.seed, extra=extra,
                      target=target)


def _lm_report(args, cfg=None):
    """The token-layout checks on the model; with ``cfg`` (the run's configuration, from
    the ``ppokit llm train`` flags) the configuration checks too, on the model training
    would start from (the built-in model after its warm start, on the built-in task)."""
    from ppokit.errors import require_extra

    require_extra(("transformers", "tokenizers"), "llm", "--lm / --model")
    import time

    from .token_checks import run_token_checks

    t0 = time.monotonic()

    def log(msg: str) -> None:  # progress on stderr, with the seconds since the start
        print(f"[{time.monotonic() - t0:5.1f} s] {msg}", file=sys.stderr, flush=True)

    if args.model is not None:
        from ppokit.llm.cli import set_threads
        from ppokit.llm.modeling.models import load_lm

        set_threads(args.model)  # as ppokit llm train runs it
        log(f"check: loading {args.model}")
        model, tok = load_lm(args.model)
        target = args.model
    else:
        from ppokit.llm.cli import set_threads
        from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model

        set_threads(None)  # as ppokit llm train runs the built-in model
        tok = build_char_tokenizer()
        model = build_tiny_model(tok, seed=args.seed)
        target = "built-in tiny language model"
    report = run_token_checks(model, tok, seed=args.seed, labels=not args.no_labels,
                              target=target, log=log)
    if cfg is not None:
        from .lm_config import run_config_checks

        start = model
        if args.model is None and cfg.prompts is None:
            log("check: the built-in model's warm start")
            start = _warm_start(model, tok, cfg)
        log(f"check: the run's configuration ({args.lm_prompts} prompts sampled)")
        report.results += run_config_checks(cfg, start, tok, prompts=args.lm_prompts,
                                            seed=args.seed, log=log)
    return report


def _warm_start(model, tok, cfg):
    """A copy of the built-in model after the warm start ``ppokit llm train`` gives it."""
    import copy

    from ppokit.llm.inputs.task import make_task
    from ppokit.llm.training.sft import builtin_sft

    task = make_task(cfg.task or "reverse")  # the built-in model's default task
    warm = copy.deepcopy(model)
    builtin_sft(task, warm, tok, steps=cfg.sft_steps or task.sft_steps, lr=cfg.sft_lr,
                seed=cfg.seed)
    return warm


def _lm_config(args):
    """The run's configuration from the ``ppokit llm train`` flags given to ``check``, or
    None when none was given and no model is checked; an error when flags come without
    ``--lm`` / ``--model``."""
    from ppokit.llm.cli import config_from_args, flag_values

    given = {k for k in flag_values(args) if k not in ("model", "seed")}
    given |= {"--set"} if args.sets else set()
    given |= {"--config"} if args.config_file else set()
    if not (args.model or args.lm) or args.no_config:
        if given:
            name = sorted(given)[0]
            flag = name if name.startswith("--") else "--" + name.replace("_", "-")
            raise UsageError(f"{flag}: a language-model setting; give --lm or --model DIR "
                             "with it (and not --no-config)")
        return None
    if args.lm_prompts < 1:
        raise UsageError(f"--lm-prompts: expected an integer >= 1, got {args.lm_prompts}")
    cfg = config_from_args(args)
    try:  # every field valid before any work (one sample per group is a finding, later)
        cfg.resolved()
    except UsageError as exc:
        if not str(exc).startswith("samples_per_prompt:"):
            raise
    return cfg


def _environment_report(args):
    """``--env ID``: the environment checks, then (unless ``--no-policy``) the default
    policy's, in one report; the policy's are skipped when the env cannot be run."""
    from .environment import check_env
    from .result import CheckReport, CheckResult

    if args.env_steps < 1:
        raise UsageError(f"--env-steps: expected an integer >= 1, got {args.env_steps}")
    if not (0 < args.env_seconds < float("inf")):
        raise UsageError(f"--env-seconds: expected a positive number, got {args.env_seconds}")
    report = check_env(args.env, env_kwargs=args.parsed_env_kwargs, steps=args.env_steps,
                       seconds=args.env_seconds, seed=args.seed, where="--env")
    if args.no_policy:
        return report
    # the policy checks collect a batch from the env: not from one that raises, breaks its
    # API, or returns NaN or observations outside its space (the batch would refuse them)
    broken = [n for n in ("env-api", "env-exception", "env-nonfinite", "obs-outside-space")
              if n in report.failed]
    if broken:
        from . import POLICY_CHECKS

        names = [*POLICY_CHECKS] + ([] if args.no_labels else ["labels-frozen"])
        policy = [CheckResult(n, None, "-", "-", f"not run: the environment fails "
                              f"{' and '.join(broken)}") for n in names]
    else:
        policy = _env_report(args).results
    return CheckReport(report.target, report.results + policy)


MAX_SAMPLES = 10**6


def run(args: argparse.Namespace) -> int:
    if args.list_codes:
        from .codes import GROUPS

        for group, codes in GROUPS.items():
            print(group)
            for code, desc in codes.items():
                print(f"  {code:30s} {desc}")
        return 0
    from ppokit.cliutil import parse_env_kwargs

    args.parsed_env_kwargs = parse_env_kwargs(args.env_kwargs)
    if args.parsed_env_kwargs is not None and (args.env is None or args.run_dir):
        raise UsageError("--env-kwargs: only with --env ID and no RUN_DIR (a run directory "
                         "keeps its own)")
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
    if (args.model or args.lm) and args.env:
        raise UsageError("--env: an environment is not checked together with --lm/--model")
    cfg = _lm_config(args)
    if args.run_dir and (Path(args.run_dir) / "reference").is_dir():
        # a language-model run directory: check the policy it saved
        policy_dir = Path(args.run_dir) / "policy"
        if not policy_dir.is_dir():
            raise UsageError(f"{args.run_dir}: no saved policy/ yet (the run has not finished)")
        from ppokit.io import check_tree

        check_tree(policy_dir, "run dir")  # what it reads stays inside the run
        args.model, args.run_dir = str(policy_dir), None
    if args.model or args.lm:
        report = _lm_report(args, cfg)
    elif args.env is not None and args.run_dir is None:
        report = _environment_report(args)
    else:
        report = _env_report(args)
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=2, default=_jsonable)
        sys.stdout.write("\n")
    else:
        report.print()
    if not report.ok or (args.strict and report.warned):
        return 1
    return 0


def _jsonable(v):
    """numpy scalars and arrays in ``values`` as plain JSON."""
    if hasattr(v, "tolist"):
        return v.tolist()
    return str(v)
