"""``ppokit train``: train an agent on a Gymnasium environment into a run directory."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ppokit.errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ppokit.algos.config import ALGORITHMS, ENV_PRESETS, config_help

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = (f"algorithms: {', '.join(ALGORITHMS)}\n"
                f"tuned environment presets (ppo): {', '.join(ENV_PRESETS)}\n\n"
                + config_help())
    p.add_argument("--env", dest="env_id", help="Gymnasium id (default: CartPole-v1)")
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
    p.add_argument("--num-envs", dest="n_envs", type=_int, metavar="N",
                   help="parallel environments (default: the preset's)")
    p.add_argument("--run-dir", help="run directory (default: runs/ENV-ALGO-sSEED-TIME)")
    p.add_argument("--config", metavar="FILE.toml", help="TOML file of configuration keys")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override one configuration key (repeatable; see the list below)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue the run in RUN_DIR from its latest good checkpoint")
    p.add_argument("--eval-episodes", type=_int, default=10, metavar="N",
                   help="deterministic evaluation episodes at the end (0: none; default 10)")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")


def _int(text: str) -> int:
    try:
        v = float(text)
        if not v.is_integer():
            raise ValueError
        return int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _read_toml(path: str) -> dict:
    import tomllib

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise UsageError(f"--config: no such file {path!r}") from None
    except IsADirectoryError:
        raise UsageError(f"--config: {path!r} is a directory, expected a TOML file") from None
    except OSError as exc:
        raise UsageError(f"--config: cannot read {path!r} ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UsageError(f"--config: {path!r} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--config: {path}: {exc}") from None
    # allow an optional [train] table
    section = data.get("train", data)
    if not isinstance(section, dict):
        raise UsageError(f"--config: {path}: 'train' must be a table, got "
                         f"{type(section).__name__}")
    return dict(section)


def _parse_sets(items: list[str]) -> dict:
    from ppokit.algos.config import parse_value

    out = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--set: expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        k = k.strip()
        out[k] = parse_value(k, v)
    return out


MAX_SEEDS = 1000
MAX_SEED = 2**32 - 1


def parse_seeds(spec: str) -> list[int]:
    """``"0-4"`` → [0, 1, 2, 3, 4]; ``"0,3,7"`` → [0, 3, 7] (ranges may be mixed in)."""
    seeds: list[int] = []
    try:
        for part in spec.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = part.split("-", 1)
                lo_i, hi_i = int(lo), int(hi)
                if hi_i < lo_i:
                    raise ValueError
                if hi_i - lo_i >= MAX_SEEDS:
                    raise UsageError(f"--seeds: at most {MAX_SEEDS} seeds at once, got "
                                     f"{hi_i - lo_i + 1} in {spec!r}")
                seeds.extend(range(lo_i, hi_i + 1))
            else:
                seeds.append(int(part))
            if len(seeds) > MAX_SEEDS:
                raise UsageError(f"--seeds: at most {MAX_SEEDS} seeds at once, got more in "
                                 f"{spec!r}")
    except ValueError as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(f"--seeds: expected a list like 0-4 or 0,3,7, got {spec!r}") from None
    if max(seeds, default=0) > MAX_SEED:
        raise UsageError(f"--seeds: seeds must be at most {MAX_SEED}, got {max(seeds)}")
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise UsageError(f"--seeds: expected distinct seeds >= 0, got {spec!r}")
    return seeds


def run(args: argparse.Namespace) -> int:
    from ppokit.algos import Trainer, load_run_config, resolve_config
    from ppokit.io import GracefulStop, Interrupted, unique_run_dir

    if args.seeds is not None:
        return _run_seeds(args)
    if args.parallel is not None:
        raise UsageError("--parallel only applies with --seeds")
    if not 0 <= args.eval_episodes <= 10**6:
        raise UsageError(f"--eval-episodes: expected an integer in [0, 1000000], got "
                         f"{args.eval_episodes}")

    flags = {"env_id": args.env_id, "algo": args.algo, "total_timesteps": args.total_timesteps,
             "seed": args.seed, "n_envs": args.n_envs}
    fresh = False
    if args.resume:
        if any(v is not None for v in flags.values()) or args.sets or args.config \
                or args.run_dir:
            raise UsageError("--resume continues a run with its saved configuration; it "
                             "cannot be combined with --env/--algo/--total-steps/--seed/"
                             "--num-envs/--run-dir/--config/--set")
        run_dir = Path(args.resume)
        if not run_dir.is_dir():
            raise UsageError(f"--resume: no such run directory {str(run_dir)!r}")
        cfg = load_run_config(run_dir)
    else:
        toml_values = _read_toml(args.config) if args.config else {}
        cfg = resolve_config(toml_values=toml_values, overrides=_parse_sets(args.sets),
                             flags=flags)
        if args.run_dir:
            run_dir = Path(args.run_dir)
        else:
            run_dir = unique_run_dir("runs", f"{cfg.env_id}-{cfg.algo}-s{cfg.seed}")
            fresh = True

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    trainer = Trainer(cfg, run_dir, resume=bool(args.resume), log=log, fresh=fresh)
    show = not args.no_progress and sys.stderr.isatty()
    try:
        with GracefulStop(log) as stop:
            try:
                if show:
                    _train_with_progress(trainer, stop)
                else:
                    trainer.train(stop=stop)
            except Interrupted as exc:
                where = f"checkpoint {exc.checkpoint.name}" if exc.checkpoint else \
                    "its checkpoint"
                log(f"{exc}; {where} written; run dir {run_dir}")
                log(f"resume with: ppokit train --resume {run_dir}")
                return exc.exit_code
        from ppokit.io.plots import plot_learning_curve

        png = plot_learning_curve(run_dir)
        summary = (f"{cfg.algo} on {cfg.env_id}: {trainer.global_step} steps, "
                   f"{trainer.iteration} iterations in {trainer.elapsed:.1f} s "
                   f"({trainer.global_step / max(trainer.elapsed, 1e-9):.0f} steps/s)")
        if trainer.last_return is not None:
            summary += f", last training return {trainer.last_return:.1f}"
        if args.eval_episodes:
            import json

            from ppokit.algos.evaluate import evaluate_run
            from ppokit.io import RunLock
            from ppokit.io.atomic import atomic_write_text

            with RunLock(run_dir, "eval"):
                res = evaluate_run(run_dir, episodes=args.eval_episodes)
                atomic_write_text(run_dir / "eval.json", json.dumps(res, indent=2) + "\n")
            summary += (f", eval {res['mean_return']:.1f} ± {res['std_return']:.1f} "
                        f"({res['episodes']} deterministic episodes)")
    finally:
        trainer.close()
    print(f"{summary}; run dir {run_dir} (curve: {png.name})", flush=True)
    return 0


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _train_with_progress(trainer, stop=None) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    total = trainer.cfg.num_iterations * trainer.cfg.rollout_size
    cols = [TextColumn("[bold]{task.description}"), BarColumn(),
            TextColumn("{task.completed:>9,.0f}/{task.total:,.0f} steps"),
            TextColumn("{task.fields[info]}"), TimeRemainingColumn()]
    with Progress(*cols, transient=False) as prog:
        task = prog.add_task(f"{trainer.cfg.algo} {trainer.cfg.env_id}", total=total,
                             completed=trainer.global_step, info="")

        def on_iter(r: dict) -> None:
            info = (f"{_fmt(r['sps'], '.0f')} sps  return {_fmt(trainer.last_return, '.1f')}"
                    f"  kl {_fmt(r['approx_kl'], '.4f')}  clip {_fmt(r['clipfrac'], '.3f')}")
            prog.update(task, completed=r["global_step"], info=info)

        trainer.train(on_iter, stop=stop)


def _run_seeds(args: argparse.Namespace) -> int:
    """Train each seed in its own ``ppokit train`` process, ``--parallel`` at a time."""
    import json
    import os
    import subprocess

    from ppokit.algos import resolve_config

    if args.seed is not None or args.resume:
        raise UsageError("--seeds cannot be combined with --seed or --resume (resume each "
                         "seed's run directory on its own)")
    seeds = parse_seeds(args.seeds)
    parallel = args.parallel if args.parallel is not None else (os.cpu_count() or 1)
    if parallel < 1:
        raise UsageError(f"--parallel: expected an integer >= 1, got {parallel}")
    flags = {"env_id": args.env_id, "algo": args.algo, "total_timesteps": args.total_timesteps,
             "n_envs": args.n_envs}
    toml_values = _read_toml(args.config) if args.config else {}
    cfg = resolve_config(toml_values=toml_values, overrides=_parse_sets(args.sets),
                         flags=flags)  # validates everything once, before any process starts
    from ppokit.io.rundir import RunLock, holds_run, unique_run_dir

    if args.run_dir:
        root = Path(args.run_dir)
        if os.path.lexists(root) and not root.is_dir():
            raise UsageError(f"--run-dir: {root} exists and is not a directory")
        for s in seeds:
            d = root / f"s{s}"
            if holds_run(d):
                raise UsageError(f"--run-dir: {d} already holds a run; choose another "
                                 "directory")
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--run-dir: cannot create {root} ({exc.strerror})") from None
    else:
        root = unique_run_dir("runs", f"{cfg.env_id}-{cfg.algo}-seeds")
    root_lock = RunLock(root, "train --seeds")  # summary.json and the plot are ours
    base = [sys.executable, "-m", "ppokit.cli", "train", "--no-progress",
            "--eval-episodes", str(args.eval_episodes)]
    for flag, val in (("--env", args.env_id), ("--algo", args.algo),
                      ("--total-steps", args.total_timesteps), ("--num-envs", args.n_envs),
                      ("--config", args.config)):
        if val is not None:
            base += [flag, str(val)]
    for item in args.sets:
        base += ["--set", item]
    pending = list(seeds)
    running: dict[int, tuple[subprocess.Popen, object]] = {}
    failed: list[int] = []
    total_steps = cfg.num_iterations * cfg.rollout_size
    t0 = time.perf_counter()
    print(f"training {len(seeds)} seeds of {cfg.algo} on {cfg.env_id}, {parallel} at a time, "
          f"into {root}", flush=True)

    def progress_line() -> str:
        parts = []
        for s in seeds:
            m = root / f"s{s}" / "metrics.jsonl"
            step = 0
            if m.exists():
                from ppokit.io.metrics import read_metrics

                recs = read_metrics(m)
                step = recs[-1]["global_step"] if recs else 0
            parts.append(f"s{s} {100 * step / total_steps:3.0f}%")
        return "  ".join(parts)

    try:
        last_print = 0.0
        while pending or running:
            while pending and len(running) < parallel:
                s = pending.pop(0)
                log = _open_log(root / f"s{s}.log")
                cmd = base + ["--seed", str(s), "--run-dir", str(root / f"s{s}")]
                running[s] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log)
            time.sleep(0.2)
            for s, (proc, log) in list(running.items()):
                if proc.poll() is not None:
                    log.close()
                    del running[s]
                    if proc.returncode != 0:
                        failed.append(s)
                        print(f"seed {s} failed (exit {proc.returncode}); see "
                              f"{root / f's{s}.log'}", file=sys.stderr, flush=True)
            if time.perf_counter() - last_print > 10 or not (pending or running):
                last_print = time.perf_counter()
                print(f"[{time.perf_counter() - t0:6.0f} s] {progress_line()}", flush=True)
    except KeyboardInterrupt:
        for proc, _ in running.values():
            proc.terminate()
        raise
    wall = time.perf_counter() - t0
    done = [s for s in seeds if s not in failed]
    summary = _seed_summary(root, done, wall, parallel)
    summary["failed"] = failed
    from ppokit.io.atomic import atomic_write_text
    from ppokit.io.plots import plot_runs

    atomic_write_text(root / "summary.json", json.dumps(summary, indent=2) + "\n")
    png = None
    if done:
        png = plot_runs([root / f"s{s}" for s in done], root / "summary.png",
                        title=f"{cfg.algo} on {cfg.env_id}: {len(done)} seeds")
    evals = summary["eval_mean_returns"]
    line = (f"{len(done)}/{len(seeds)} seeds in {wall:.1f} s wall "
            f"({summary['steps_per_second']:.0f} steps/s in all; the runs' own training "
            f"times add up to {summary['sum_of_run_times']:.1f} s)")
    if evals:
        import numpy as np

        line += (f"; eval {np.mean(evals):.1f} ± {np.std(evals):.1f} over seeds "
                 f"(min {min(evals):.1f}, max {max(evals):.1f})")
    print(f"{line}; summary {root / 'summary.json'}" + (f", plot {png}" if png else ""))
    root_lock.release()
    return 1 if failed else 0


def _open_log(path: Path):
    """A child's log file, truncated; a link at its place is replaced, never followed."""
    import os

    if path.is_symlink():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    return os.fdopen(fd, "w")


def _seed_summary(root: Path, seeds: list[int], wall: float, parallel: int) -> dict:
    import json

    from ppokit.io.atomic import read_regular
    from ppokit.io.metrics import read_metrics

    steps = 0
    run_time = 0.0
    evals = []
    for s in seeds:
        recs = read_metrics(root / f"s{s}" / "metrics.jsonl")
        if recs:
            steps += recs[-1]["global_step"]
            run_time += recs[-1].get("time") or 0.0
        ev = root / f"s{s}" / "eval.json"
        if ev.exists():
            try:
                evals.append(float(json.loads(read_regular(ev))["mean_return"]))
            except (ValueError, KeyError, TypeError, RecursionError):
                pass  # a seed without a readable evaluation: left out of the summary
    return {"seeds": seeds, "parallel": parallel, "wall_seconds": wall,
            "total_steps": steps, "steps_per_second": steps / wall if wall > 0 else None,
            "sum_of_run_times": run_time, "eval_mean_returns": evals}
