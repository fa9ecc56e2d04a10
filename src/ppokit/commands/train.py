"""``ppokit train``: train an agent on a Gymnasium environment into a run directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ppokit.cliutil import int_arg as _int
from ppokit.cliutil import parse_env_kwargs, read_toml
from ppokit.errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ppokit.algos.config import ALGORITHMS, ENV_PRESETS, config_help

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = (f"algorithms: {', '.join(ALGORITHMS)}\n"
                f"tuned environment presets (ppo): {', '.join(ENV_PRESETS)}, every "
                "Atari game ALE/Name-v5 (the atari extra) and MinAtar game; any other "
                "environment with image observations gets the image family's update "
                "settings (docs/benchmarks.md)\n\n"
                + config_help())
    p.add_argument("--env", dest="env_id",
                   help="Gymnasium id (default: CartPole-v1), or module:Id to import module "
                        "(from the current directory too) so that it registers Id; with "
                        "--resume, the run's own module:Id again")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (repeatable; from the current directory too) so "
                        "that it registers its policy losses or advantage estimators "
                        "(ppokit.register_policy_loss, ppokit.register_advantage_estimator); "
                        "with --resume, the run's modules again")
    p.add_argument("--env-kwargs", metavar="JSON",
                   help='keyword arguments of the environment, a JSON object such as '
                        '\'{"size": 8}\' (TOML: an env_kwargs table)')
    p.add_argument("--algo", help="ppo (default), a2c, reinforce or ppo-kl")
    p.add_argument("--total-steps", dest="total_timesteps", type=_int, metavar="N",
                   help="environment steps to train for (default: the preset's)")
    p.add_argument("--seed", type=_int, help="random seed (default 0)")
    p.add_argument("--seeds", metavar="SPEC",
                   help="train several independent seeds, e.g. 0-4 or 0,3,7: one run directory "
                        "each under --run-dir, plus summary.json and a mean/spread plot")
    p.add_argument("--parallel", type=_int, metavar="N",
                   help="with --seeds: runs at a time, each in its own process "
                        "(default: the number of CPU cores; 1 = one after another)")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="with --seeds: local (one process per seed, default) or ray (each "
                        "seed a Ray task: RAY_ADDRESS's cluster, else a local Ray)")
    p.add_argument("--num-envs", dest="n_envs", type=_int, metavar="N",
                   help="parallel environments (default: the preset's)")
    p.add_argument("--run-dir", help="run directory (default: runs/ENV-ALGO-sSEED-TIME)")
    p.add_argument("--config", metavar="FILE.toml", help="TOML file of configuration keys")
    p.add_argument("--set", dest="sets", action="extend", nargs="+", default=[],
                   metavar="KEY=VALUE",
                   help="override configuration keys: --set a=1 b=2 (repeatable; see the list "
                        "below)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue the run in RUN_DIR from its latest good checkpoint (or the "
                        "--seeds launch whose directory RUN_DIR is: finished seeds kept, "
                        "stopped ones resumed, the rest started)")
    p.add_argument("--eval-episodes", type=_int, default=10, metavar="N",
                   help="deterministic evaluation episodes at the end (0: none; default 10)")
    p.add_argument("--track", choices=("none", "wandb"), default=None,
                   help="also log to Weights & Biases (the wandb extra; WANDB_MODE=offline "
                        "writes under RUN_DIR/wandb without an account); same as --set "
                        "track=wandb")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")


def run(args: argparse.Namespace) -> int:
    from ppokit.algos import Trainer
    from ppokit.io import GracefulStop, Interrupted
    from ppokit.plugins import import_modules

    imports = import_modules(args.imports)  # named here; a run directory never names code
    if args.seeds is not None:
        from .seeds import run_seeds

        return run_seeds(args)
    _check_single_run_args(args)
    flags = {"env_id": args.env_id, "algo": args.algo, "total_timesteps": args.total_timesteps,
             "seed": args.seed, "n_envs": args.n_envs,
             "env_kwargs": parse_env_kwargs(args.env_kwargs), "track": args.track}
    fresh = False
    if args.resume:
        opened = _open_resumed(args, flags, imports)
        if isinstance(opened, int):  # a `ppokit train --seeds` launch, resumed
            return opened
        cfg, env, run_dir = opened
    else:
        cfg, env, run_dir, fresh = _new_run(args, flags)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    trainer = Trainer(cfg, run_dir, resume=bool(args.resume), log=log, fresh=fresh, env=env)
    if args.resume and not _resume_target(trainer, args.total_timesteps, log):
        trainer.close()
        return 0
    try:
        with GracefulStop(log) as stop:
            try:
                if not args.no_progress:  # a bar on a terminal, plain lines in a log
                    from ppokit.algos.progress import train_with_progress

                    train_with_progress(trainer, stop)
                else:
                    trainer.train(stop=stop)
            except Interrupted as exc:
                where = f"checkpoint {exc.checkpoint.name}" if exc.checkpoint else \
                    "its checkpoint"
                log(f"{exc}; {where} written; run dir {run_dir}")
                log(f"resume with: {trainer.resume_command()}")
                return exc.exit_code
        from ppokit.io.plots import plot_learning_curve

        png = plot_learning_curve(run_dir)
        summary = _summary(trainer, cfg)
        if args.eval_episodes:
            summary += _evaluate(run_dir, cfg, args.eval_episodes, env)
    finally:
        trainer.close()
    print(f"{summary}; run dir {run_dir} (curve: {png.name})", flush=True)
    if not cfg.selfplay:  # (a self-play return is against an opponent that improves too)
        _say_if_collapsed(run_dir, log)
    return 0


def _check_single_run_args(args: argparse.Namespace) -> None:
    """The flags that apply only with --seeds, and --eval-episodes' range."""
    if args.parallel is not None:
        raise UsageError("--parallel only applies with --seeds")
    if args.backend != "local":
        raise UsageError("--backend only applies with --seeds")
    if not 0 <= args.eval_episodes <= 10**6:
        raise UsageError(f"--eval-episodes: expected an integer in [0, 1000000], got "
                         f"{args.eval_episodes}")


def _new_run(args: argparse.Namespace, flags: dict):
    """``(config, environment module, run directory, whether ppokit chose the
    directory)`` of a new run: presets < --config < --set < flags."""
    from ppokit.algos import resolve_config
    from ppokit.algos.config import parse_sets
    from ppokit.envs.source import import_env_module
    from ppokit.io import unique_run_dir

    toml_values = read_toml(args.config, "train") if args.config else {}
    cfg = resolve_config(toml_values=toml_values, overrides=parse_sets(args.sets),
                         flags=flags)
    env = import_env_module(cfg.env_id, "--env")  # named on the command line
    if args.run_dir:
        return cfg, env, Path(args.run_dir), False
    return cfg, env, unique_run_dir("runs", f"{cfg.env_id}-{cfg.algo}-s{cfg.seed}"), True


def _open_resumed(args: argparse.Namespace, flags: dict, imports):
    """``(config, environment module, run directory)`` of the run ``--resume`` names, or
    the exit code of a resumed ``ppokit train --seeds`` launch; a UsageError for flags
    that would change the run, a missing directory or a language-model run."""
    if any(v is not None for k, v in flags.items()
           if k not in ("env_id", "total_timesteps")) or args.sets \
            or args.config or args.run_dir:
        raise UsageError("--resume continues a run with its saved configuration; it "
                         "cannot be combined with --algo/--seed/--num-envs/"
                         "--env-kwargs/--run-dir/--config/--set (--total-steps N "
                         "sets a new total, to train a finished run further)")
    run_dir = Path(args.resume)
    if not run_dir.is_dir():
        raise UsageError(f"--resume: no such run directory {str(run_dir)!r}")
    from ppokit.io.rundir import is_llm_run_dir

    from .seeds import is_seeds_dir, resume_seeds

    if is_seeds_dir(run_dir):  # a stopped `ppokit train --seeds` launch
        return resume_seeds(run_dir, args.env_id, imports)
    if is_llm_run_dir(run_dir):
        raise UsageError(f"--resume: {run_dir} is a language-model run: continue it with "
                         f"`ppokit llm train --resume {run_dir}`")
    from ppokit.algos.runs import open_run

    # a module:Id is imported only because it is named here again, never because the
    # checkpoint says so
    saved = open_run(run_dir, args.env_id, "--resume")
    return saved.cfg, saved.env, run_dir


def _summary(trainer, cfg) -> str:
    """The finished run in one line: steps, speed, returns, best evaluation, early stop."""
    summary = (f"{cfg.algo} on {cfg.env_id}: {trainer.global_step} steps, "
               f"{trainer.iteration} iterations in {trainer.elapsed:.1f} s "
               f"({trainer.global_step / max(trainer.elapsed, 1e-9):.0f} steps/s)")
    if trainer.recent_returns and trainer.reports_games:
        summary += (f", mean game score {trainer.mean_recent_return:.1f} (last "
                    f"{len(trainer.recent_returns)} training games: all lives, "
                    "unclipped)")
    elif trainer.recent_returns:
        summary += (f", mean training return {trainer.mean_recent_return:.1f} (last "
                    f"{len(trainer.recent_returns)} episodes)")
    if trainer.best_eval_return is not None:
        summary += (f", best evaluation during training {trainer.best_eval_return:.1f} "
                    "(kept in best/)")
    if trainer.stop_reason is not None:
        summary += f", stopped early: {trainer.stop_reason}"
    return summary


def _evaluate(run_dir: Path, cfg, episodes: int, env) -> str:
    """--eval-episodes: the final policy's deterministic episodes, written to eval.json
    (a self-play run's: games against the random player, eval_opponent.json, as
    ``ppokit eval RUN --opponent random``); their summary for the line above."""
    import json

    from ppokit.algos.evaluate import evaluate_run
    from ppokit.io import RunLock
    from ppokit.io.atomic import atomic_write_text

    with RunLock(run_dir, "eval"):
        if cfg.selfplay:
            from ppokit.algos.opponent_eval import evaluate_versus

            res = evaluate_versus(run_dir, "random", games=episodes)
            atomic_write_text(run_dir / "eval_opponent.json", json.dumps(res, indent=2) + "\n")
            return (f", against the random player: win {res['win_rate']:.2f}, draw "
                    f"{res['draw_rate']:.2f}, loss {res['loss_rate']:.2f} ({episodes} "
                    "deterministic games)")
        res = evaluate_run(run_dir, episodes=episodes, env=env)
        atomic_write_text(run_dir / "eval.json", json.dumps(res, indent=2) + "\n")
    return (f", eval {res['mean_return']:.1f} ± {res['std_return']:.1f} "
            f"({res['episodes']} deterministic episodes)")


def _resume_target(trainer, total: int | None, log) -> bool:
    """With ``--resume``: a new total (``--total-steps``) extends the run to it; a run
    that has finished, given none, has nothing to do (said, and False returned)."""
    done, planned = trainer.global_step, trainer.cfg.total_timesteps
    if total is not None:
        if total <= done:
            trainer.close()
            raise UsageError(f"--total-steps: the run has already trained {done:,} steps; "
                             f"give a larger total to train it further, got {total:,}")
        trainer.extend(total - done)
        log(f"training on to {trainer.cfg.total_timesteps:,} steps (a linear schedule is "
            f"stretched to the new total)")
        return True
    if trainer.iteration >= trainer.cfg.num_iterations:
        log(f"nothing to do: {trainer.run_dir} finished its {planned:,} steps ({done:,} "
            f"trained); train it further with ppokit train --resume {trainer.run_dir} "
            f"--total-steps N")
        return False
    return True


def _say_if_collapsed(run_dir: Path, log) -> None:
    """A run whose return fell after a plateau says so in its last lines: the final policy
    is then not the best one the run had (``ppokit report`` gives the evidence)."""
    from ppokit.diagnose.metrics import read_metrics_table
    from ppokit.diagnose.rules import Thresholds, rule_return_collapse

    try:
        found = rule_return_collapse(read_metrics_table(run_dir), Thresholds())
    except UsageError:
        return
    for f in found:
        s = f.evidence[0]["summary"]
        log(f"note: the training return reached {s['plateau']:g} and then fell to "
            f"{s['tail_median']:g} (median of the last {s['tail_points']} iterations with "
            f"episodes): the final policy is not the best this run had. Details: ppokit "
            f"report {run_dir}; eval_every keeps the best policy in best/.")
