"""``ppokit train --seeds SPEC``: independent seeds, each in its own ``ppokit train``
process (``--backend ray``: each a Ray task, :mod:`ppokit.distributed.tasks`),
``--parallel`` at a time; then ``summary.json`` and a mean/spread plot.

The seeds' directory (``--run-dir``) holds ``seeds.json`` (the seeds, the resolved
configuration, how they run) and ``seeds.toml`` (that configuration, which every seed's
process is started with), one run directory per seed (``sSEED``) and its log. A SIGINT or
SIGTERM to the launcher reaches every seed once: each writes a checkpoint and stops, and
the launcher ends with 130 / 143 and the command that continues all of them,
``ppokit train --resume DIR``: finished seeds are kept, stopped ones resumed, seeds not
started yet started. The seed processes end with the launcher however it ends
(:mod:`ppokit.supervise`)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from ppokit.errors import UsageError

__all__ = ["parse_seeds", "run_seeds", "resume_seeds", "is_seeds_dir", "MAX_SEEDS",
           "MAX_SEED", "SEEDS_FILE"]

MAX_SEEDS = 1000
MAX_SEED = 2**32 - 1
SEEDS_FILE = "seeds.json"
SEEDS_TOML = "seeds.toml"
FORMAT = 1


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


def is_seeds_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is the directory of a ``ppokit train --seeds`` launch."""
    return os.path.lexists(Path(path) / SEEDS_FILE)


class _Plan:
    """What a seeds launch runs: the seeds, their configuration, how many at a time."""

    def __init__(self, root: Path, cfg, seeds: list[int], parallel: int | None, backend: str,
                 eval_episodes: int, env_named: str | None):
        self.root, self.cfg, self.seeds = root, cfg, seeds
        self.parallel, self.backend = parallel, backend
        self.eval_episodes, self.env_named = eval_episodes, env_named
        self.imports: list[str] = []  # --import modules, named again for each seed

    def to_json(self) -> dict:
        return {"format": FORMAT, "seeds": self.seeds, "parallel": self.parallel,
                "backend": self.backend, "eval_episodes": self.eval_episodes,
                "config": self.cfg.to_dict()}

    def toml_text(self) -> str:
        from ppokit.cliutil import to_toml

        values = {k: v for k, v in self.cfg.to_dict().items() if k != "seed"}
        return to_toml(values, "the configuration of every seed of this directory (written "
                               "by ppokit train --seeds from seeds.json)")

    def write(self) -> None:
        """``seeds.json`` and the ``seeds.toml`` the seed processes read (both replaced
        atomically; a link at either place is replaced, never followed)."""
        from ppokit.io.atomic import atomic_write_text

        atomic_write_text(self.root / SEEDS_FILE, json.dumps(self.to_json(), indent=2) + "\n")
        atomic_write_text(self.root / SEEDS_TOML, self.toml_text())

    def seed_args(self, seed: int, resume: bool, run_dir: str, config: str) -> list[str]:
        """The ``ppokit train`` arguments of one seed: it writes ``run_dir`` (``resume``:
        continues the run there), configured by the TOML file ``config``."""
        args = ["--no-progress", "--eval-episodes", str(self.eval_episodes)]
        if self.env_named is not None:  # named by the user on this command line
            args += ["--env", self.env_named]
        for mod in self.imports:
            args += ["--import", mod]
        if resume:
            return [*args, "--resume", run_dir]
        return [*args, "--config", config, "--seed", str(seed), "--run-dir", run_dir]

    def resume_command(self) -> str:
        env = f" --env {self.env_named}" if self.env_named else ""
        mods = "".join(f" --import {m}" for m in self.imports)
        return f"ppokit train --resume {self.root}{env}{mods}"


def _state_of_seed(run_dir: Path, cfg, eval_episodes: int) -> str:
    """``finished`` (its last checkpoint is the last iteration and its evaluation is
    written), ``started`` (it holds a run to resume) or ``new``."""
    from ppokit.io.checkpoint import list_checkpoints
    from ppokit.io.rundir import holds_run

    if not holds_run(run_dir):
        return "new"
    ckpts = list_checkpoints(run_dir / "checkpoints")
    if not ckpts:
        return "broken"
    last = int(ckpts[-1].name.split("_")[1])
    if last >= cfg.num_iterations and (eval_episodes == 0 or (run_dir / "eval.json").is_file()):
        return "finished"
    return "started"


def run_seeds(args: argparse.Namespace) -> int:
    """Train each seed in its own ``ppokit train`` process (``--backend ray``: a Ray task),
    ``--parallel`` at a time."""
    from ppokit.algos import resolve_config
    from ppokit.algos.config import parse_sets
    from ppokit.cliutil import parse_env_kwargs, read_toml

    if args.seed is not None or args.resume:
        raise UsageError("--seeds cannot be combined with --seed or --resume (a stopped "
                         "--seeds launch continues with ppokit train --resume DIR)")
    seeds = parse_seeds(args.seeds)
    if args.imports and args.backend == "ray":
        raise UsageError("--import with --backend ray: Ray workers do not import your module "
                         "yet; use --backend local")
    if args.parallel is not None and args.parallel < 1:
        raise UsageError(f"--parallel: expected an integer >= 1, got {args.parallel}")
    if not 0 <= args.eval_episodes <= 10**6:
        raise UsageError(f"--eval-episodes: expected an integer in [0, 1000000], got "
                         f"{args.eval_episodes}")
    flags = {"env_id": args.env_id, "algo": args.algo, "total_timesteps": args.total_timesteps,
             "n_envs": args.n_envs, "env_kwargs": parse_env_kwargs(args.env_kwargs),
             "track": args.track}
    toml_values = read_toml(args.config, "train") if args.config else {}
    cfg = resolve_config(toml_values=toml_values, overrides=parse_sets(args.sets),
                         flags=flags)  # validates everything once, before any process starts
    from ppokit.envs.source import import_env_module

    import_env_module(cfg.env_id, "--env")  # named on the command line: fails here, once
    from ppokit.io.rundir import RunLock, holds_run, parent_run_dir

    def taken(root: Path) -> str | None:
        if is_seeds_dir(root):
            return (f"{root} already holds a --seeds launch; continue it with ppokit train "
                    f"--resume {root}")
        held = [root / f"s{s}" for s in seeds if holds_run(root / f"s{s}")]
        return f"{held[0]} already holds a run" if held else None

    root = parent_run_dir(args.run_dir, f"{cfg.env_id}-{cfg.algo}-seeds", taken)
    root_lock = RunLock(root, "train --seeds")  # summary.json and the plot are ours
    plan = _Plan(root, cfg, seeds, args.parallel, args.backend, args.eval_episodes,
                 cfg.env_id if ":" in cfg.env_id else None)
    plan.imports = list(args.imports)
    plan.write()
    return _launch(plan, root_lock, {s: "new" for s in seeds})


def resume_seeds(root: Path, env_given: str | None, imports: list[str] | None = None) -> int:
    """``ppokit train --resume ROOT`` of a ``--seeds`` directory: the seeds that finished
    are kept, the stopped ones resumed, the ones never started started."""
    from ppokit.algos.config import config_from_dict
    from ppokit.envs.source import env_for_run
    from ppokit.io.atomic import MAX_SMALL_FILE, read_regular
    from ppokit.io.rundir import RunLock

    root_lock = RunLock(root, "train --seeds")
    try:
        doc = json.loads(read_regular(root / SEEDS_FILE, MAX_SMALL_FILE))
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError("not a seeds file of this version")
        cfg = config_from_dict(doc["config"])
        seeds = parse_seeds(",".join(str(int(s)) for s in doc["seeds"]))
        parallel, backend = doc["parallel"], doc["backend"]
        eval_episodes = int(doc["eval_episodes"])
        if parallel is not None and (not isinstance(parallel, int) or parallel < 1) \
                or backend not in ("local", "ray") or not 0 <= eval_episodes <= 10**6:
            raise ValueError("bad launch settings")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        root_lock.release()
        raise UsageError(f"--resume: {root / SEEDS_FILE} is not a seeds file ppokit wrote "
                         f"({type(exc).__name__}: {str(exc)[:100]})") from None
    env = env_for_run(cfg.env_id, cfg.env_source, env_given, "--resume")
    plan = _Plan(root, cfg, seeds, parallel, backend, eval_episodes,
                 env if isinstance(env, str) and ":" in env else None)
    plan.imports = list(imports or [])
    plan.write()  # seeds.toml again, from the checked seeds.json
    states = {s: _state_of_seed(root / f"s{s}", cfg, eval_episodes) for s in seeds}
    for s in [s for s, st in states.items() if st == "broken"]:
        # this launch's own seed directory, stopped before its first checkpoint (killed
        # in its first iteration): nothing in it can be resumed, so the seed starts again
        with RunLock(root / f"s{s}", "train --seeds"):  # (no process writes it now)
            pass
        shutil.rmtree(root / f"s{s}")
        print(f"seed {s} had stopped before its first checkpoint: it starts again",
              flush=True)
        states[s] = "new"
    done = [s for s, st in states.items() if st == "finished"]
    print(f"continuing {len(seeds) - len(done)} of {len(seeds)} seeds in {root} "
          f"({len(done)} finished, {sum(st == 'started' for st in states.values())} to "
          "resume)", flush=True)
    return _launch(plan, root_lock, states)


def _launch(plan: _Plan, root_lock, states: dict[int, str]) -> int:
    ray = None
    if plan.backend == "ray":
        from ppokit.distributed import ensure_ray

        ray = ensure_ray(lambda m: print(m, flush=True), "--backend ray")
    cpus = (os.cpu_count() or 1) if ray is None else int(ray.cluster_resources().get("CPU", 1))
    parallel = plan.parallel if plan.parallel is not None else max(1, cpus)
    todo = [s for s in plan.seeds if states[s] != "finished"]
    runner = _run_on_ray if ray is not None else _run_local
    t0 = time.perf_counter()
    failed, stopped = runner(plan, todo, states, parallel, ray) if todo else ([], None)
    wall = time.perf_counter() - t0
    if stopped is not None:
        from ppokit.io.signals import signal_name

        left = [s for s in plan.seeds if _state_of_seed(plan.root / f"s{s}", plan.cfg,
                                                        plan.eval_episodes) != "finished"]
        print(f"stopped by {signal_name(stopped)}: {len(plan.seeds) - len(left)} of "
              f"{len(plan.seeds)} seeds finished; the others wrote a checkpoint or had not "
              f"started (seeds {', '.join(map(str, left))})", file=sys.stderr, flush=True)
        print(f"resume with: {plan.resume_command()}", file=sys.stderr, flush=True)
        root_lock.release()
        return 128 + stopped
    return _finish(plan.root, root_lock, plan.cfg, plan.seeds, parallel, failed, wall)


def _run_local(plan: _Plan, todo: list[int], states: dict[int, str], parallel: int,
               ray=None) -> tuple[list[int], int | None]:
    """Each seed of ``todo`` a ``ppokit train`` process, ``parallel`` at a time; a signal
    is forwarded to every running seed and no new one starts. ``(failed, signal)``."""
    import subprocess

    from ppokit.supervise import ChildGroup, SignalForwarder

    root, cfg = plan.root, plan.cfg
    base = [sys.executable, "-m", "ppokit.cli", "train"]
    pending = list(todo)
    running: dict[int, tuple[object, object]] = {}
    failed: list[int] = []
    total_steps = cfg.num_iterations * cfg.rollout_size
    t0 = time.perf_counter()
    print(f"training {len(todo)} seeds of {cfg.algo} on {cfg.env_id}, {parallel} at a time, "
          f"into {root}", flush=True)

    def progress_line() -> str:
        from ppokit.io.metrics import read_metrics

        parts = []
        for s in plan.seeds:
            try:
                recs = read_metrics(root / f"s{s}" / "metrics.jsonl")
            except UsageError:
                recs = []
            step = recs[-1].get("global_step", 0) if recs else 0
            parts.append(f"s{s} {100 * step / total_steps:3.0f}%")
        return "  ".join(parts)

    group = ChildGroup()
    with SignalForwarder(group.signal) as sig:
        last_print = 0.0
        while pending or running:
            while pending and len(running) < parallel and sig.signum is None:
                s = pending.pop(0)
                log = _open_log(root / f"s{s}.log", append=states[s] == "started")
                cmd = base + plan.seed_args(s, states[s] == "started", str(root / f"s{s}"),
                                            str(root / SEEDS_TOML))
                running[s] = (group.start(cmd, stdout=log, stderr=subprocess.STDOUT), log)
            if sig.signum is not None:
                pending.clear()
            time.sleep(0.2)
            for s, (proc, log) in list(running.items()):
                if proc.poll() is not None:
                    log.close()
                    del running[s]
                    if proc.returncode in (130, 143) and sig.signum is not None:
                        continue  # stopped with a checkpoint: resumed later
                    if proc.returncode != 0:
                        failed.append(s)
                        print(f"seed {s} failed (exit {proc.returncode}); see "
                              f"{root / f's{s}.log'}", file=sys.stderr, flush=True)
            if sig.signum is None and (time.perf_counter() - last_print > 10
                                       or not (pending or running)):
                last_print = time.perf_counter()
                print(f"[{time.perf_counter() - t0:6.0f} s] {progress_line()}", flush=True)
    return failed, sig.signum


def train_main(argv: list[str]) -> int:
    """``ppokit train ARGV`` in this process (a Ray task's entry: the command line's own
    error handling, one line and an exit status)."""
    from ppokit.cli import main

    return main(["train", *argv])


def _run_on_ray(plan: _Plan, todo: list[int], states: dict[int, str], parallel: int,
                ray) -> tuple[list[int], int | None]:
    """Each seed a Ray task (:func:`ppokit.distributed.tasks.train_task`), ``parallel`` at
    a time; each finished run directory is unpacked to ``root/sSEED`` with its log. A signal
    asks every running task to stop with a checkpoint (through a stop flag the tasks
    watch); their run directories come back as usual."""
    from ppokit.distributed.tasks import (
        CONFIG,
        RUN_DIR,
        StopFlag,
        pack_run,
        replace_run,
        train_task,
    )
    from ppokit.supervise import SignalForwarder

    root, cfg = plan.root, plan.cfg
    task = ray.remote(num_cpus=1, max_retries=1)(train_task)
    stop_flag = ray.remote(num_cpus=0)(StopFlag).remote()
    toml_text = plan.toml_text()
    pending = list(todo)
    running: dict = {}
    failed: list[int] = []
    t0 = time.perf_counter()
    told = False
    print(f"training {len(todo)} seeds of {cfg.algo} on {cfg.env_id} as Ray tasks, "
          f"{parallel} at a time, into {root}", flush=True)
    with SignalForwarder(lambda signum: None) as sig:
        while pending or running:
            if sig.signum is not None and not told:
                ray.get(stop_flag.set.remote(sig.signum))
                told = True
                pending.clear()
            while pending and len(running) < parallel:
                s = pending.pop(0)
                resume = states[s] == "started"
                archive = pack_run(root / f"s{s}") if resume else None
                running[task.remote(train_main, plan.seed_args(s, resume, RUN_DIR, CONFIG),
                                    plan.env_named, toml_text, archive, stop_flag)] = s
            if not running:
                continue
            done, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            if not done:
                continue
            s = running.pop(done[0])
            try:
                rc, text, data = ray.get(done[0])
            except ray.exceptions.RayError as exc:
                rc, text, data = 1, f"Ray task failed: {type(exc).__name__}: {exc}\n", b""
            log = _open_log(root / f"s{s}.log", append=states[s] == "started")
            log.write(text)
            log.close()
            if data:
                replace_run(data, root / f"s{s}")
            if rc in (130, 143) and sig.signum is not None:
                continue
            if rc != 0:
                failed.append(s)
                print(f"seed {s} failed (exit {rc}); see {root / f's{s}.log'}",
                      file=sys.stderr, flush=True)
            print(f"[{time.perf_counter() - t0:6.0f} s] seed {s} done; "
                  f"{len(todo) - len(pending) - len(running)}/{len(todo)} finished",
                  flush=True)
    return failed, sig.signum


def _finish(root: Path, root_lock, cfg, seeds: list[int], parallel: int,
            failed: list[int], wall: float) -> int:
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


def _open_log(path: Path, append: bool = False):
    """A child's log file, truncated (``append``: continued); a link at its place is
    replaced, never followed."""
    if path.is_symlink():
        path.unlink()
    mode = os.O_APPEND if append else os.O_TRUNC
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | mode | os.O_NOFOLLOW, 0o644)
    return os.fdopen(fd, "a" if append else "w")


def _seed_summary(root: Path, seeds: list[int], wall: float, parallel: int) -> dict:
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
