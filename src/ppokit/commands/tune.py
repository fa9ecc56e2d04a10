"""``ppokit tune``: a hyperparameter search with Optuna, trials run locally or as Ray tasks.

The search file (TOML; see docs/training.md#hyperparameter-search) names configuration keys
— ppokit's keys are Stable-Baselines3's / the RL Zoo's — and a range or a list for each::

    [search]
    learning_rate = {low = 1e-4, high = 1e-2, log = true}   # float, log-uniform
    n_epochs = {low = 4, high = 20}                         # integer (integer bounds)
    clip_range = {low = 0.1, high = 0.3, step = 0.05}       # a grid of floats
    gae_lambda = {choices = [0.8, 0.9, 0.95, 0.98]}         # one of these values

    [fixed]            # the same in every trial (as --set; --set wins over it)
    total_timesteps = 50000

    [tune]             # the search itself (all optional)
    eval_every = 5     # evaluate during training every this many iterations (the pruner
                       # compares trials on these evaluations)
    eval_episodes = 5  # episodes of each evaluation during training
    pruner = "median"  # median (stop a trial whose evaluation is below the median of the
                       # earlier trials' at the same point) or none
    startup_trials = 3 # trials that are never pruned (the median needs some)
    warmup_evals = 2   # the first evaluation of a trial at which it can be pruned
    sampler = "tpe"    # tpe or random
    seed = 0           # the sampler's seed

A trial trains a configuration (presets < ``--config`` < ``[fixed]`` < ``--set`` < the
sampled values < flags) into ``TUNE_DIR/trial_NNN``; its score is the mean return of
``--eval-episodes`` deterministic episodes of its final policy (ppokit eval's measure).
The tuning directory receives ``trials.csv`` (the study table), ``best.toml`` (the best
trial's keys, ready for ``ppokit train --config``), ``search.png`` (score per trial and per
searched value) and ``study.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ppokit.cliutil import int_arg as _int
from ppokit.cliutil import to_toml
from ppokit.errors import UsageError

from .tune_space import SearchSpace, check_values, parse_search, read_search
from .tune_study import JOURNAL, Coordinator, plot_study, ray_trial, run_trial, write_csv

__all__ = ["add_arguments", "run", "read_search", "SearchSpace", "Coordinator", "to_toml"]

MAX_TRIALS = 10_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = __doc__.split("\n\n", 1)[1]
    p.add_argument("--search", metavar="FILE.toml",
                   help="the search space (and [fixed], [tune] tables); required unless "
                        "--resume")
    p.add_argument("--env", dest="env_id", help="Gymnasium id (default: CartPole-v1) or "
                   "module:Id")
    p.add_argument("--algo", help="ppo (default), a2c, reinforce or ppo-kl")
    p.add_argument("--total-steps", dest="total_timesteps", type=_int, metavar="N",
                   help="environment steps of each trial (default: the preset's)")
    p.add_argument("--seed", type=_int, help="training seed of every trial (default 0)")
    p.add_argument("--config", metavar="FILE.toml", help="TOML file of configuration keys")
    p.add_argument("--set", dest="sets", action="extend", nargs="+", default=[],
                   metavar="KEY=VALUE",
                   help="fix configuration keys in every trial: --set a=1 b=2 (repeatable)")
    p.add_argument("--trials", type=_int, default=None, metavar="N",
                   help="trials to run (default 20)")
    p.add_argument("--backend", choices=("local", "ray"), default=None,
                   help="local (trials one after another in this process, default) or ray "
                        "(trials as Ray tasks: RAY_ADDRESS's cluster, else a local Ray)")
    p.add_argument("--parallel", type=_int, metavar="N",
                   help="with --backend ray: trials at a time (default: the cluster's CPUs)")
    p.add_argument("--eval-episodes", type=_int, default=None, metavar="N",
                   help="deterministic episodes that score a trial's final policy (default 10)")
    p.add_argument("--run-dir", help="tuning directory (default: runs/ENV-ALGO-tune-TIME); "
                   "the same command on the same directory continues its search")
    p.add_argument("--resume", metavar="DIR",
                   help="continue the search in the tuning directory DIR with its saved "
                        "settings (finished trials kept, a stopped one run again, up to the "
                        "number of trials asked for); --env again for a module:Id")


# ------------------------------------------------------------------------------ search file

# ------------------------------------------------------------------------------ command

SETTINGS = "tune.json"
SETTINGS_FORMAT = 1
DEFAULTS = {"trials": 20, "eval_episodes": 10, "backend": "local"}


def _settings_from_args(args) -> dict[str, Any]:
    """What a search runs, from the command line: the search file's and the --config
    file's contents (so that a restart reads neither file again), the --set items, the
    flags and the trial settings. Saved as the tuning directory's ``tune.json``."""
    from ppokit.cliutil import load_toml, read_toml

    if args.search is None:
        raise UsageError("--search: required (the search space), or --resume DIR to "
                         "continue a search")
    flags = {"env_id": args.env_id, "algo": args.algo,
             "total_timesteps": args.total_timesteps, "seed": args.seed}
    return _plain({"format": SETTINGS_FORMAT, "search": load_toml(args.search, "--search"),
                   "config": read_toml(args.config, "train") if args.config else {},
                   "sets": list(args.sets),
                   "flags": {k: v for k, v in flags.items() if v is not None},
                   **{k: DEFAULTS[k] if getattr(args, k) is None else getattr(args, k)
                      for k in DEFAULTS}, "parallel": args.parallel})


def _plain(value: Any) -> Any:
    """``value`` as JSON would read it back (tuples as lists, dates as strings)."""
    return json.loads(json.dumps(value, default=str))


def _read_settings(root: Path) -> dict[str, Any]:
    from ppokit.io.atomic import MAX_SMALL_FILE, read_regular

    path = root / SETTINGS
    if not os.path.lexists(path):
        raise UsageError(f"--resume: {root} holds no search ppokit started (no {SETTINGS})")
    try:
        doc = json.loads(read_regular(path, MAX_SMALL_FILE))
    except UsageError as exc:  # a link, not a regular file, too large: said as it is
        raise UsageError(f"--resume: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"--resume: {path} is not a settings file ppokit wrote "
                         f"({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("format") != SETTINGS_FORMAT:
        raise UsageError(f"--resume: {path} is not a settings file of this version")
    return doc


def _study_setup(st: dict[str, Any], where: str) -> tuple[SearchSpace, dict, Any]:
    """``(space, base, cfg0)`` of the settings ``st`` (from the command line or from a
    tuning directory's ``tune.json``: checked the same way)."""
    from ppokit.algos import resolve_config
    from ppokit.algos.config import parse_sets

    try:
        trials, episodes = st["trials"], st["eval_episodes"]
        backend, parallel = st["backend"], st["parallel"]
        search, toml_values, sets, flags = st["search"], st["config"], st["sets"], st["flags"]
    except (KeyError, TypeError):
        raise UsageError(f"{where}: the settings miss a field") from None
    if isinstance(trials, bool) or not isinstance(trials, int) or not 1 <= trials <= MAX_TRIALS:
        raise UsageError(f"--trials: expected an integer in [1, {MAX_TRIALS}], got {trials}")
    if isinstance(episodes, bool) or not isinstance(episodes, int) \
            or not 1 <= episodes <= 10**6:
        raise UsageError(f"--eval-episodes: expected an integer in [1, 1000000], got "
                         f"{episodes}")
    if backend not in ("local", "ray"):
        raise UsageError(f"--backend: expected local or ray, got {backend!r:.60}")
    if parallel is not None and (backend != "ray" or not isinstance(parallel, int)
                                 or parallel < 1):
        raise UsageError("--parallel: an integer >= 1, and only with --backend ray")
    if not isinstance(sets, list) or not all(isinstance(x, str) for x in sets) \
            or not isinstance(flags, dict) or not isinstance(toml_values, dict):
        raise UsageError(f"{where}: the settings are not what ppokit wrote")
    space = parse_search(search, where)
    t = space.tune
    overrides = {"eval_every": t["eval_every"], "eval_episodes": t["eval_episodes"],
                 "tensorboard": False, **space.fixed, **parse_sets(sets)}
    base = {"toml_values": toml_values, "overrides": overrides, "flags": flags}
    try:
        cfg0 = resolve_config(**base)
    except UsageError as exc:
        raise UsageError(f"{where} [fixed] / --set: {exc}") from None
    check_values(space, base, where)
    return space, base, cfg0


def run(args: argparse.Namespace) -> int:
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise UsageError("ppokit tune needs Optuna, which is not installed (pip install "
                         "'ppokit[tune]')") from None
    from ppokit.envs.source import env_for_run, import_env_module
    from ppokit.io.atomic import atomic_write_text
    from ppokit.io.rundir import RunLock, holds_run, parent_run_dir

    if args.resume is not None:
        given = [f for f, v in (("--search", args.search), ("--config", args.config),
                                ("--set", args.sets), ("--algo", args.algo),
                                ("--total-steps", args.total_timesteps), ("--seed", args.seed),
                                ("--trials", args.trials), ("--backend", args.backend),
                                ("--parallel", args.parallel), ("--run-dir", args.run_dir),
                                ("--eval-episodes", args.eval_episodes)) if v not in (None, [])]
        if given:
            raise UsageError(f"--resume continues a search with its saved settings; it "
                             f"cannot be combined with {given[0]}")
        root = Path(args.resume)
        if not root.is_dir():
            raise UsageError(f"--resume: no such tuning directory {str(root)!r}")
        settings = _read_settings(root)
        where = f"--resume {root / SETTINGS}"
    else:
        settings = _settings_from_args(args)
        root = None
        where = f"--search {args.search}"
    space, base, cfg0 = _study_setup(settings, where)
    if root is not None:  # a module:Id is imported only because the user names it again
        env_for_run(cfg0.env_id, cfg0.env_source, args.env_id, "--resume")
    else:
        import_env_module(cfg0.env_id, "--env")
    env_named = cfg0.env_id if ":" in cfg0.env_id else None

    def taken(d: Path) -> str | None:
        if os.path.lexists(d / SETTINGS):
            if _plain(_read_settings(d)) == settings:
                return None  # the same command again: it continues the search
            return (f"{d} holds a search with other settings; continue it with `ppokit tune "
                    f"--resume {d}` or choose another directory")
        if (d / "trials.csv").exists() or holds_run(d) or (d / "trial_000").exists():
            return f"{d} already holds a search or a run"
        return None

    if root is None:
        root = parent_run_dir(args.run_dir, f"{cfg0.env_id}-{cfg0.algo}-tune", taken)
    lock = RunLock(root, "tune")
    if not os.path.lexists(root / SETTINGS):
        atomic_write_text(root / SETTINGS, json.dumps(settings, indent=2) + "\n")
    ray = None
    if settings["backend"] == "ray":
        from ppokit.distributed import ensure_ray

        ray = ensure_ray(lambda m: print(m, flush=True), "--backend ray")
    keys = ", ".join(space.params)
    t = space.tune
    print(f"tuning {keys} of {cfg0.algo} on {cfg0.env_id}: {settings['trials']} trials "
          f"({settings['backend']}), pruner {t['pruner']}, into {root}", flush=True)
    resume_cmd = f"ppokit tune --resume {root}" + (f" --env {env_named}" if env_named else "")
    t0 = time.perf_counter()
    runner = _run_local if ray is None else _run_on_ray
    rows, stopped = runner(ray, space, base, env_named, root, settings)
    wall = time.perf_counter() - t0
    if stopped is not None:
        from ppokit.io.signals import signal_name

        write_csv(root / "trials.csv", rows)
        print(f"stopped by {signal_name(stopped)} after {len(rows)} of {settings['trials']} "
              "trials; the trial in progress wrote a checkpoint and runs again on resume",
              file=sys.stderr, flush=True)
        print(f"resume with: {resume_cmd}", file=sys.stderr, flush=True)
        lock.release()
        return 128 + stopped
    return _finish(root, lock, rows, space, base, cfg0, wall, settings["eval_episodes"])


def _say_continued(coord: Coordinator, root: Path, trials: int) -> None:
    if coord.info:
        print(f"continuing the search in {root}: {coord.finished()} of {trials} trials "
              f"finished" + (f"; trial {', '.join(map(str, coord.again))} runs again "
                             "(it was stopped)" if coord.again else ""), flush=True)


def _run_local(ray, space, base, env_named, root: Path, st: dict
               ) -> tuple[list[dict], int | None]:
    """The trials one after another in this process; a SIGINT / SIGTERM stops the trial in
    progress with a checkpoint (it runs again, from there, when the search continues).
    ``(rows, signal or None)``."""
    from ppokit.io import GracefulStop, Interrupted

    coord = Coordinator(space, journal=str(root / JOURNAL))
    _say_continued(coord, root, st["trials"])
    with GracefulStop(lambda m: print(m, file=sys.stderr, flush=True)) as stop:
        while coord.finished() < st["trials"] and not stop.requested:
            number, params, again = coord.ask()
            cfg = _trial_config(base, params)
            try:
                res = (run_trial(cfg["_config"], env_named, str(root / f"trial_{number:03d}"),
                                 st["eval_episodes"], number, coord.report, again=again,
                                 stop=stop)
                       if "_config" in cfg else cfg)
            except Interrupted:
                break
            coord.tell(number, res)
            _say(number, params, res)
            write_csv(root / "trials.csv", coord.rows())
    return coord.rows(), stop.signum


def _trial_config(base: dict, params: dict[str, Any]) -> dict[str, Any]:
    """``{"_config": the trial's full configuration}``, or a failed result when the
    sampled combination is refused (e.g. batch_size larger than the rollout)."""
    from ppokit.algos import resolve_config

    try:
        cfg = resolve_config(toml_values=base["toml_values"],
                             overrides={**base["overrides"], **params}, flags=base["flags"])
    except UsageError as exc:
        return {"state": "failed", "value": None, "message": str(exc)[:300], "_refused": True}
    return {"_config": cfg.to_dict()}


def _say(number: int, params: dict, res: dict) -> None:
    p = ", ".join(f"{k}={_short(v)}" for k, v in params.items())
    v = res.get("value")
    print(f"trial {number:3d} {res['state']:<8} score "
          f"{'-' if v is None else format(v, '.1f'):>7}  {p}"
          + (f"  ({res['message']})" if res.get("message") else ""), flush=True)


def _short(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _run_on_ray(ray, space, base, env_named, root: Path, st: dict
                ) -> tuple[list[dict], int | None]:
    """The trials as Ray tasks, ``parallel`` at a time; the study's coordinator is an
    actor on this machine (its journal is in the tuning directory). A SIGINT / SIGTERM
    stops the running trials through a stop flag; they run again (from the start) when
    the search continues. ``(rows, signal or None)``."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from ppokit.distributed.tasks import StopFlag, replace_run
    from ppokit.supervise import SignalForwarder

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    coord = ray.remote(num_cpus=0, scheduling_strategy=here)(Coordinator).remote(
        space, str(root / JOURNAL))
    task = ray.remote(num_cpus=1, max_retries=0)(ray_trial)
    stop_flag = ray.remote(num_cpus=0)(StopFlag).remote()
    parallel = st["parallel"] or max(1, int(ray.cluster_resources().get("CPU", 1)))
    finished = ray.get(coord.finished.remote())
    if finished or ray.get(coord.rows.remote()):
        print(f"continuing the search in {root}: {finished} of {st['trials']} trials "
              "finished", flush=True)
    running: dict = {}
    told = False
    with SignalForwarder(lambda signum: None) as sig:
        while (finished + len(running) < st["trials"] and sig.signum is None) or running:
            if sig.signum is not None and not told:
                ray.get(stop_flag.set.remote(sig.signum))
                told = True
            while (finished + len(running) < st["trials"] and len(running) < parallel
                   and sig.signum is None):
                number, params, _ = ray.get(coord.ask.remote())
                cfg = _trial_config(base, params)
                if "_config" not in cfg:
                    ray.get(coord.tell.remote(number, cfg))
                    finished += 1
                    _say(number, params, cfg)
                    continue
                ref = task.remote(cfg["_config"], env_named, st["eval_episodes"], number,
                                  coord, stop_flag)
                running[ref] = (number, params)
            if not running:
                continue
            done, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            if not done:
                continue
            number, params = running.pop(done[0])
            try:
                res, data = ray.get(done[0])
            except ray.exceptions.RayError as exc:
                res, data = {"state": "failed", "value": None,
                             "message": f"Ray task failed: {type(exc).__name__}"}, b""
            if data:  # (in place of an earlier, stopped attempt of this trial)
                replace_run(data, root / f"trial_{number:03d}")
            if res.get("state") == "stopped":
                continue  # runs again when the search continues
            ray.get(coord.tell.remote(number, res))
            finished += 1
            _say(number, params, res)
            write_csv(root / "trials.csv", ray.get(coord.rows.remote()))
    return ray.get(coord.rows.remote()), sig.signum


def _finish(root: Path, lock, rows: list[dict], space: SearchSpace, base: dict, cfg0,
            wall: float, eval_episodes: int) -> int:
    from ppokit.io.atomic import atomic_write_text

    for r in rows:
        r.pop("_refused", None)
    write_csv(root / "trials.csv", rows)
    done = [r for r in rows if r["state"] == "complete" and r["value"] is not None]
    counts = {s: sum(r["state"] == s for r in rows) for s in ("complete", "pruned", "failed")}
    best = max(done, key=lambda r: r["value"]) if done else None
    study = {"trials": len(rows), **counts, "wall_seconds": wall,
             "search": space.params, "fixed": space.fixed, "tune": space.tune,
             "best": None if best is None else {"number": best["number"],
                                                 "value": best["value"]}}
    atomic_write_text(root / "study.json", json.dumps(study, indent=2) + "\n")
    png = plot_study(root / "search.png", rows, space,
                f"{cfg0.algo} on {cfg0.env_id}: {len(rows)} trials")
    line = (f"{len(rows)} trials in {wall:.0f} s: {counts['complete']} complete, "
            f"{counts['pruned']} pruned, {counts['failed']} failed")
    if best is not None:
        values = {**base["flags"], **{k: v for k, v in base["toml_values"].items()},
                  **{k: v for k, v in base["overrides"].items() if k != "tensorboard"},
                  **{k: best[k] for k in space.params}}
        values.setdefault("env_id", cfg0.env_id)
        values.setdefault("algo", cfg0.algo)
        header = (f"ppokit tune: best of {len(rows)} trials, trial {best['number']} "
                  f"(score {best['value']:.1f}: mean return of {eval_episodes} "
                  f"deterministic episodes)\nppokit train --config best.toml")
        atomic_write_text(root / "best.toml", to_toml(values, header))
        p = ", ".join(f"{k}={_short(best[k])}" for k in space.params)
        line += (f"; best trial {best['number']}: score {best['value']:.1f} ({p}); "
                 f"best.toml, trials.csv, {png.name} in {root}")
    else:
        line += f"; no trial completed (see {root / 'trials.csv'})"
    print(line, flush=True)
    lock.release()
    return 0 if best is not None else 1
