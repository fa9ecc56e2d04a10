"""``ppokit train --seeds SPEC``: independent seeds, each in its own ``ppokit train``
process (``--backend ray``: each a Ray task, :mod:`ppokit.distributed.tasks`),
``--parallel`` at a time; then ``summary.json`` and a mean/spread plot."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ppokit.errors import UsageError

from .train import _parse_env_kwargs, _parse_sets, _read_toml

__all__ = ["parse_seeds", "run_seeds", "MAX_SEEDS", "MAX_SEED"]

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



def run_seeds(args: argparse.Namespace) -> int:
    """Train each seed in its own ``ppokit train`` process (``--backend ray``: a Ray task),
    ``--parallel`` at a time."""
    import os
    import subprocess

    from ppokit.algos import resolve_config

    if args.seed is not None or args.resume:
        raise UsageError("--seeds cannot be combined with --seed or --resume (resume each "
                         "seed's run directory on its own)")
    seeds = parse_seeds(args.seeds)
    backend = getattr(args, "backend", "local")
    ray = None
    if backend == "ray":
        from ppokit.distributed import ensure_ray

        ray = ensure_ray(lambda m: print(m, flush=True), "--backend ray")
    cpus = (os.cpu_count() or 1) if ray is None else int(ray.cluster_resources().get("CPU", 1))
    parallel = args.parallel if args.parallel is not None else max(1, cpus)
    if parallel < 1:
        raise UsageError(f"--parallel: expected an integer >= 1, got {parallel}")
    flags = {"env_id": args.env_id, "algo": args.algo, "total_timesteps": args.total_timesteps,
             "n_envs": args.n_envs, "env_kwargs": _parse_env_kwargs(args.env_kwargs),
             "track": args.track}
    toml_values = _read_toml(args.config) if args.config else {}
    cfg = resolve_config(toml_values=toml_values, overrides=_parse_sets(args.sets),
                         flags=flags)  # validates everything once, before any process starts
    from ppokit.envs.source import import_env_module

    import_env_module(cfg.env_id, "--env")  # named on the command line: fails here, once
    from ppokit.io.rundir import RunLock, holds_run, parent_run_dir

    def taken(root: Path) -> str | None:
        held = [root / f"s{s}" for s in seeds if holds_run(root / f"s{s}")]
        return f"{held[0]} already holds a run" if held else None

    root = parent_run_dir(args.run_dir, f"{cfg.env_id}-{cfg.algo}-seeds", taken)
    root_lock = RunLock(root, "train --seeds")  # summary.json and the plot are ours
    cli_args = ["--no-progress", "--eval-episodes", str(args.eval_episodes)]
    for flag, val in (("--env", args.env_id), ("--algo", args.algo),
                      ("--total-steps", args.total_timesteps), ("--num-envs", args.n_envs),
                      ("--env-kwargs", args.env_kwargs), ("--config", args.config),
                      ("--track", args.track)):
        if val is not None:
            cli_args += [flag, str(val)]
    for item in args.sets:
        cli_args += ["--set", item]
    base = [sys.executable, "-m", "ppokit.cli", "train", *cli_args]
    if ray is not None:
        return _finish(root, root_lock, cfg, seeds, parallel,
                       *_run_on_ray(ray, root, cfg, seeds, parallel, cli_args))
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
    return _finish(root, root_lock, cfg, seeds, parallel, failed,
                   time.perf_counter() - t0)


def _run_on_ray(ray, root: Path, cfg, seeds: list[int], parallel: int,
                cli_args: list[str]) -> tuple[list[int], float]:
    """Each seed a Ray task (:func:`ppokit.distributed.tasks.train_task`), ``parallel`` at
    a time; each finished run directory is unpacked to ``root/sSEED`` with its log."""
    from ppokit.distributed.tasks import train_task, unpack_run

    task = ray.remote(num_cpus=1, max_retries=1)(train_task)
    env_named = cfg.env_id if ":" in cfg.env_id else None
    pending = list(seeds)
    running: dict = {}
    failed: list[int] = []
    t0 = time.perf_counter()
    print(f"training {len(seeds)} seeds of {cfg.algo} on {cfg.env_id} as Ray tasks, "
          f"{parallel} at a time, into {root}", flush=True)
    while pending or running:
        while pending and len(running) < parallel:
            s = pending.pop(0)
            running[task.remote([*cli_args, "--seed", str(s)], env_named)] = s
        done, _ = ray.wait(list(running), num_returns=1)
        s = running.pop(done[0])
        try:
            rc, text, data = ray.get(done[0])
        except ray.exceptions.RayError as exc:
            rc, text, data = 1, f"Ray task failed: {type(exc).__name__}: {exc}\n", b""
        log = _open_log(root / f"s{s}.log")
        log.write(text)
        log.close()
        if data:
            unpack_run(data, root / f"s{s}")
        if rc != 0:
            failed.append(s)
            print(f"seed {s} failed (exit {rc}); see {root / f's{s}.log'}", file=sys.stderr,
                  flush=True)
        print(f"[{time.perf_counter() - t0:6.0f} s] seed {s} done; "
              f"{len(seeds) - len(pending) - len(running)}/{len(seeds)} finished", flush=True)
    return failed, time.perf_counter() - t0


def _finish(root: Path, root_lock, cfg, seeds: list[int], parallel: int,
            failed: list[int], wall: float) -> int:
    import json

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
