"""``ppokit llm``: token-level RLHF from the command line.

Subcommands: ``train`` (PPO / GRPO / Dr. GRPO / RLOO / REINFORCE++ / GSPO / CISPO / DAPO),
``compare`` (presets side by side), ``eval`` (trained vs reference on held-out prompts),
``sft`` (supervised warm start), ``rm`` (Bradley–Terry reward model), ``dpo`` (direct
preference optimisation), ``bench`` (throughput).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import MISSING, fields

from ppokit.cliutil import int_arg as _int
from ppokit.errors import UsageError

from .tools_cli import TOOLS, add_tool_arguments

__all__ = ["add_arguments", "run"]


def add_config_arguments(p: argparse.ArgumentParser, skip: tuple[str, ...] = (),
                          epilog: bool = True) -> None:
    """One flag per :class:`LLMConfig` field (help from the field's metadata), the
    deprecated names as hidden flags, and ``--set`` / ``--config`` as for ``ppokit train``.
    ``skip``: fields whose flag the command defines itself (with the same meaning)."""
    from .training.config import DEPRECATED, LLMConfig
    from .training.config_values import config_help

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    if epilog:
        p.epilog = config_help()
    types = {}
    for f in fields(LLMConfig):
        ann = str(f.type)
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = None if f.default is MISSING else f.default
        h = f.metadata.get("help", "").replace("%", "%%")  # argparse formats help with %
        if ann.startswith("bool"):
            p.add_argument(flag, dest=f.name, default=None, action=argparse.BooleanOptionalAction,
                           help=h + ("" if default is None or "default" in h
                                     else f" (default: {default})"))
            types[f.name] = None
            continue
        base = ann.split("|")[0].strip()
        typ = {"int": _int, "float": float, "str": str, "tuple": str,
               "dict[str, Any]": json_object}[base]
        types[f.name] = typ
        if f.name == "reward":  # repeatable: one reward function each
            p.add_argument(flag, dest=f.name, action="append", default=None,
                           metavar="MODULE:FUNCTION", help=f"{h} (repeatable)")
            continue
        shown = "" if default is None or "default" in h else f" (default: {default})"
        p.add_argument(flag, dest=f.name, type=typ, default=None, help=h + shown)
    for old, new in DEPRECATED.items():
        flag = "--" + old.replace("_", "-")
        if types.get(new) is None and old != "minibatches":
            p.add_argument(flag, dest=f"deprecated_{old}", default=None,
                           action=argparse.BooleanOptionalAction, help=argparse.SUPPRESS)
        else:
            p.add_argument(flag, dest=f"deprecated_{old}", default=None,
                           type=_int if old == "minibatches" else types[new],
                           help=argparse.SUPPRESS)
    p.add_argument("--config", metavar="FILE.toml", dest="config_file",
                   help="TOML file of configuration keys (top level or an [llm] table)")
    p.add_argument("--set", dest="sets", action="extend", nargs="+", default=[],
                   metavar="KEY=VALUE",
                   help="override configuration keys: --set a=1 b=2 (repeatable; keys "
                        "below), as ppokit train takes them")


def json_object(text: str) -> dict:
    """A flag's JSON object (an option table: ``--loss-options '{"beta": 0.3}'``)."""
    import json

    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(text)
    return value


def flag_values(args) -> dict:
    """The values given as flags, deprecated names included (with a message)."""
    from .training.config import DEPRECATED, LLMConfig

    own = getattr(args, "llm_not_config", ())  # the command's own flags of those names
    out = {f.name: getattr(args, f.name) for f in fields(LLMConfig)
           if getattr(args, f.name, None) is not None and f.name not in own}
    if isinstance(out.get("reward"), list):
        out["reward"] = ",".join(out["reward"])
    for old, new in DEPRECATED.items():
        v = getattr(args, f"deprecated_{old}", None)
        if v is not None:
            print(f"ppokit llm: --{old.replace('_', '-')} is deprecated; use "
                  f"--{new.replace('_', '-')}", file=sys.stderr)
            out[old] = v
    return out


def config_from_args(args):
    """preset < --config TOML < --set < flags."""
    from .training.config_values import config_from_values, parse_sets, read_toml

    def log(msg):
        print(f"ppokit llm: {msg}", file=sys.stderr)

    toml = read_toml(args.config_file) if getattr(args, "config_file", None) else {}
    sets = parse_sets(getattr(args, "sets", []) or [], log)
    return config_from_values(("--config", toml), ("--set", sets), ("flags", flag_values(args)),
                              log=log)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="llm_command", metavar="SUBCOMMAND")
    sub.required = True

    p = sub.add_parser("train", help="token-level RLHF training (ppo, grpo, dr-grpo, rloo, "
                       "reinforce++, gspo, cispo, dapo)")
    add_config_arguments(p)
    p.add_argument("--run-dir", help="run directory (default: runs/llm-<algo>-<time>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (repeatable; from the current directory too) so "
                        "that it registers its policy losses or advantage estimators "
                        "(ppokit.register_policy_loss, ppokit.register_advantage_estimator); "
                        "with --resume, the run's modules again")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation at the end")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="data-parallel training on N processes of this machine (launches "
                        "torchrun --standalone --nproc_per_node N -m ppokit llm train ...; "
                        "gloo between the ranks); under torchrun, ranks come from it")

    p = sub.add_parser("compare", help="train several presets on one task and budget over "
                       "several seeds; writes a table and a plot of held-out score "
                       "against iterations")
    add_config_arguments(p, skip=("algo", "seed", "eval_every"), epilog=False)
    p.add_argument("--algos", default="grpo,dapo,gspo,cispo",
                   help="comma-separated presets (default: grpo,dapo,gspo,cispo)")
    p.add_argument("--seeds", default="0-2", help="seeds: a range 0-2 or a list 0,3,5 "
                   "(default: 0-2)")
    p.add_argument("--eval-every", dest="eval_every", type=_int, default=10,
                   help="held-out score every N iterations, the curves' points (default: 10)")
    p.add_argument("--out", default=None, help="directory of the runs, the table and the "
                   "plot (default: runs/compare-<time>)")

    p = sub.add_parser("eval", help="score the trained and the reference policy on held-out "
                       "prompts (an agent run: held-out episodes); writes RUN_DIR/eval.json")
    p.add_argument("run_dir")
    p.add_argument("--n-prompts", "--n-episodes", dest="n_prompts", type=int,
                   help="number of held-out prompts, or an agent run's held-out episodes "
                        "(default: config)")
    p.add_argument("--temperature", type=float, help="sampling temperature (default: training's)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--reward", metavar="MODULE:FUNCTION", action="append",
                   help="the reward function(s) the run was trained with, repeatable (a run "
                        "directory never names code that ppokit imports)")
    p.add_argument("--reward-model", metavar="DIR",
                   help="the reward model the run was trained with")
    p.add_argument("--env", metavar="MODULE:ID", help="an agent run's environment from a "
                   "module of yours, named again (a run directory never names code that "
                   "ppokit imports)")
    p.add_argument("--tools", metavar="MODULE:FUNCTION", action="append",
                   help="an agent run's tools, named again, repeatable")

    add_tool_arguments(sub)

def run(args) -> int:
    from ppokit.errors import require_extras

    needs = [("llm", ("transformers", "tokenizers"))]
    model = getattr(args, "model", None)
    if args.llm_command == "fetch" and not getattr(args, "list", False) or \
            isinstance(model, str) and model.lower().endswith(".gguf"):
        needs.append(("gguf", ("gguf",)))  # every extra the command needs, in one message
    require_extras(needs, f"ppokit llm {args.llm_command}")
    from .modeling.models import quiet_transformers
    from .training.guards import check_cli_args

    check_cli_args(args)  # every argument before any work (a warm start, pair generation)
    quiet_transformers()
    # never reach a model hub: every model and tokenizer is a local directory
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    set_threads(getattr(args, "model", None))
    cmd = args.llm_command
    return {"train": _train, "eval": _eval, "compare": _compare, **TOOLS}[cmd](args)


THREADS_NOTE: list[str] = []  # why a user model got fewer threads than the cores (said once)


def set_threads(model: str | None) -> None:
    """The built-in tiny model (``model`` None) runs fastest on one thread (and shares a
    busy CPU better); PPOKIT_THREADS overrides; a user model gets one thread per core that
    no other process keeps busy now (:mod:`ppokit.threads`; several ranks keep torch's
    setting)."""
    import torch

    from ppokit.engine.dist import world_from_env
    from ppokit.threads import choose_threads

    if os.environ.get("PPOKIT_THREADS"):
        torch.set_num_threads(int(os.environ["PPOKIT_THREADS"]))
    elif model is None:
        torch.set_num_threads(1)
    elif world_from_env()[1] <= 1:
        want = torch.get_num_threads()
        n, why = choose_threads(want)
        if n < want:
            torch.set_num_threads(n)
            THREADS_NOTE[:] = [f"torch threads: {why} (PPOKIT_THREADS=N sets the number)"]


def _ci(ev: dict, key: str) -> str:
    lo_hi = ev.get(key.replace("_mean", "_ci95"))
    return f" [{lo_hi[0]:.3f}, {lo_hi[1]:.3f}]" if lo_hi else ""


def _print_eval(ev: dict) -> None:
    if "n_episodes" in ev:  # an agent run
        from .evaluation.agent_eval import agent_eval_lines

        print("\n".join(agent_eval_lines(ev)))
        return
    print(f"held-out prompts: {ev['n_prompts']}  (temperature {ev['temperature']}; score: the "
          "weighted sum of the rewards per completion, mean [95 % interval])")
    print(f"  trained   score_mean {ev['score_mean']:.4f}{_ci(ev, 'score_mean')}   length "
          f"{ev['response_length_mean']:.2f}")
    print(f"  reference score_mean {ev['reference_score_mean']:.4f}"
          f"{_ci(ev, 'reference_score_mean')}   length "
          f"{ev['reference_response_length_mean']:.2f}")
    if "greedy_score_mean" in ev:
        print(f"  greedy: trained {ev['greedy_score_mean']:.4f}{_ci(ev, 'greedy_score_mean')}"
              f"  reference {ev['reference_greedy_score_mean']:.4f}"
              f"{_ci(ev, 'reference_greedy_score_mean')}")
    for k in ev:
        if k.startswith("reward/"):
            print(f"  {k:<24} trained {ev[k]:.4f}  reference {ev['reference_' + k]:.4f}")


def _launch(nproc: int) -> int:
    """``--nproc N``: run this same command on N local ranks (:mod:`ppokit.llm.training.launch`)."""
    from .training.launch import launch

    argv = list(sys.argv[1:])
    out, skip = [], False
    for a in argv:  # drop --nproc N / --nproc=N
        if skip:
            skip = False
            continue
        if a == "--nproc":
            skip = True
            continue
        if a.startswith("--nproc="):
            continue
        out.append(a)
    return launch(nproc, out)


def _train(args) -> int:
    from ppokit.engine.dist import init_from_env, world_from_env
    from ppokit.plugins import import_modules

    import_modules(args.imports)  # named here; a run directory never names code to import

    if args.nproc is not None:
        if not 1 <= args.nproc <= 1024:
            raise UsageError(f"--nproc: expected an integer in [1, 1024], got {args.nproc}")
        if world_from_env()[1] > 1:
            raise UsageError("--nproc: already running under torchrun (its --nproc_per_node "
                             "sets the number of ranks)")
        if args.nproc > 1:
            return _launch(args.nproc)
    dp = init_from_env()
    try:
        return _train_ranks(args, dp)
    except Exception as exc:
        if dp is None or isinstance(exc, UsageError):
            raise
        # a collective failed: another rank died (its own error names the cause)
        print(f"ppokit llm train (rank {dp.rank}): stopped because the job lost a rank "
              f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); the "
              "last checkpoint in the run directory is intact", file=sys.stderr, flush=True)
        return 1
    finally:
        if dp is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def _train_ranks(args, dp) -> int:
    from ppokit.io import GracefulStop, Interrupted, unique_run_dir

    from .evaluation.evaluate import evaluate_lm_run
    from .training.runfiles import resume_command
    from .training.trainer import TokenTrainer, config_from_run

    main_rank = dp is None or dp.is_main
    fresh = False
    if args.resume:
        if args.run_dir:
            raise UsageError("--run-dir: --resume names the run directory already")
        if args.config_file:
            raise UsageError("--config: --resume continues a run with its saved "
                             "configuration")
        over = dict(_config_overrides(args))
        cfg = config_from_run(args.resume, **over)  # refuses keys that would change it
        run_dir = args.resume
    else:
        cfg = config_from_args(args).resolved()  # every field checked before any work
        if args.run_dir:
            run_dir = args.run_dir
        else:
            run_dir = str(unique_run_dir("runs", f"llm-{cfg.algo}")) if main_rank else None
            fresh = True
            if dp is not None:  # rank 0 names (and creates) it
                run_dir = dp.gather_objects(run_dir)[0]

    def log(m: str) -> None:
        if main_rank:
            print(m, file=sys.stderr, flush=True)

    for note in THREADS_NOTE:
        log(note)
    tr = TokenTrainer(cfg, run_dir, resume=bool(args.resume), fresh=fresh, log=log, dp=dp)
    if main_rank:
        print(f"run dir: {run_dir}" + (f" ({dp.world} ranks)" if dp is not None else ""))
    t0 = time.perf_counter()
    try:
        with GracefulStop() as stop:
            try:
                recs = tr.train(progress=not args.no_progress, stop=stop)
            except Interrupted as exc:
                if not main_rank:
                    return exc.exit_code
                print(f"{exc}; checkpoint {exc.checkpoint.name} written; run dir {run_dir}",
                      file=sys.stderr)
                print(f"resume with: {resume_command(run_dir, cfg, dp.world if dp else 1)}",
                      file=sys.stderr, flush=True)
                return exc.exit_code
    finally:
        tr.close()
    if not main_rank:
        return 0
    if recs:
        last = recs[-1]
        print(f"iteration {last['iteration']}: score_mean {last['score_mean']:.4f}  kl_ref "
              f"{last['kl_ref']:.4f}  non_score_reward {last['non_score_reward']:.4f}  "
              f"length {last['response_length_mean']:.2f}  "
              f"({time.perf_counter() - t0:.1f} s)")
        from .training.progress import PhaseSpeed

        speed = PhaseSpeed()
        for rec in recs:
            speed.add(rec)
        if speed.summary():
            print(speed.summary())
    if not args.no_eval and getattr(tr, "agent", None) is not None:
        # the trained policy and the reference on held-out seeds, as `ppokit llm eval`
        _print_eval(evaluate_lm_run(run_dir, env=cfg.env, tools=cfg.tools,
                                    log=lambda m: print(m, file=sys.stderr)))
    elif not args.no_eval:
        if cfg.prompts is not None and not getattr(tr, "eval_rows", True):
            print("no held-out evaluation: no prompts were held out (eval_fraction=0 and no "
                  "eval prompts)", file=sys.stderr)
            return 0
        _print_eval(evaluate_lm_run(run_dir, reward=cfg.reward, reward_model=cfg.reward_model,
                                 log=lambda m: print(m, file=sys.stderr)))
    return 0


def _compare(args) -> int:
    from .evaluation.compare import compare, parse_seeds, table

    seeds = parse_seeds(args.seeds)
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    cfg = config_from_args(args)  # every key checked before any run starts
    base = {f.name: getattr(cfg, f.name) for f in fields(cfg)
            if f.name not in ("algo", "seed") and getattr(cfg, f.name) != f.default}
    base["eval_every"] = args.eval_every
    out = args.out or os.path.join("runs", time.strftime("compare-%Y%m%d-%H%M%S"))
    print(f"comparing {', '.join(algos)} over seeds {', '.join(map(str, seeds))} in {out}",
          flush=True)
    from ppokit.io import GracefulStop, Interrupted

    with GracefulStop() as stop:
        try:
            summary = compare(algos, seeds, base, out, log=lambda m: print(m, flush=True),
                              stop=stop)
        except Interrupted as exc:
            print(f"{exc}; the run in progress was checkpointed; the same command "
                  f"continues the comparison: ppokit llm compare ... --out {out}",
                  file=sys.stderr, flush=True)
            return exc.exit_code
    print(table(summary))
    print(f"wrote {os.path.join(out, 'compare.md')}, compare.json and compare.png")
    return 0


def _config_overrides(args) -> dict:
    """Flags and ``--set`` values given with ``--resume`` (deprecated names renamed)."""
    from .training.config import DEPRECATED
    from .training.config_values import parse_sets

    vals = {**parse_sets(args.sets or []), **flag_values(args)}
    return {DEPRECATED.get(k, k): v for k, v in vals.items()}


def _eval(args) -> int:
    from .evaluation.evaluate import evaluate_lm_run

    if not os.path.isdir(args.run_dir):
        raise UsageError(f"RUN_DIR: no such directory {args.run_dir!r}")
    reward = ",".join(args.reward) if args.reward else None
    ev = evaluate_lm_run(args.run_dir, n_prompts=args.n_prompts, temperature=args.temperature,
                         seed=args.seed, reward=reward, reward_model=args.reward_model,
                         env=args.env, tools=",".join(args.tools) if args.tools else None,
                         log=lambda m: print(m, file=sys.stderr))
    _print_eval(ev)
    print(f"wrote {os.path.join(args.run_dir, 'eval.json')}")
    return 0
