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
import math
import time
from pathlib import Path
from typing import Any

from ppokit.cliutil import int_arg as _int
from ppokit.errors import UsageError

__all__ = ["add_arguments", "run", "read_search", "SearchSpace", "Coordinator", "to_toml"]

SPEC_FIELDS = {"low", "high", "log", "step", "choices"}
TUNE_KEYS = {"eval_every": 5, "eval_episodes": 5, "pruner": "median", "startup_trials": 3,
             "warmup_evals": 2, "sampler": "tpe", "seed": 0}
MAX_TRIALS = 10_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = __doc__.split("\n\n", 1)[1]
    p.add_argument("--search", metavar="FILE.toml", required=True,
                   help="the search space (and [fixed], [tune] tables)")
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
    p.add_argument("--trials", type=_int, default=20, metavar="N",
                   help="trials to run (default 20)")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="local (trials one after another in this process, default) or ray "
                        "(trials as Ray tasks: RAY_ADDRESS's cluster, else a local Ray)")
    p.add_argument("--parallel", type=_int, metavar="N",
                   help="with --backend ray: trials at a time (default: the cluster's CPUs)")
    p.add_argument("--eval-episodes", type=_int, default=10, metavar="N",
                   help="deterministic episodes that score a trial's final policy (default 10)")
    p.add_argument("--run-dir", help="tuning directory (default: runs/ENV-ALGO-tune-TIME)")


# ------------------------------------------------------------------------------ search file

class SearchSpace:
    """The parsed search file: ``params`` (key → spec), ``fixed`` values, ``tune``
    settings."""

    def __init__(self, params: dict[str, dict], fixed: dict[str, Any], tune: dict[str, Any]):
        self.params, self.fixed, self.tune = params, fixed, tune

    def suggest(self, trial) -> dict[str, Any]:
        out = {}
        for k, s in self.params.items():
            if "choices" in s:
                idx = trial.suggest_categorical(f"{k}#", list(range(len(s["choices"]))))
                out[k] = s["choices"][idx]
            elif s["int"]:
                out[k] = trial.suggest_int(k, s["low"], s["high"], log=s["log"],
                                           step=s.get("step") or 1)
            else:
                out[k] = trial.suggest_float(k, s["low"], s["high"], log=s["log"],
                                             step=s.get("step"))
        return out


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_search(path: str) -> SearchSpace:
    """Parse and check a search file; every problem is one :class:`UsageError` line naming
    the file, the table and the key."""
    from ppokit.algos.config import TrainConfig, _unknown_key, valid_keys
    from ppokit.cliutil import load_toml

    data = load_toml(path, "--search")
    where = f"--search {path}"
    extra = sorted(set(data) - {"search", "fixed", "tune"})
    if extra:
        raise UsageError(f"{where}: unknown table [{extra[0]}] (expected [search], [fixed], "
                         "[tune])")
    tables = {}
    for name in ("search", "fixed", "tune"):
        t = data.get(name, {})
        if not isinstance(t, dict):
            raise UsageError(f"{where}: [{name}] must be a table, got {type(t).__name__}")
        tables[name] = t
    if not tables["search"]:
        raise UsageError(f"{where}: [search] names no key to search (e.g. learning_rate = "
                         "{low = 1e-4, high = 1e-2, log = true})")
    from typing import get_type_hints

    hints = get_type_hints(TrainConfig)
    for name in ("search", "fixed"):
        for k in tables[name]:
            if k not in valid_keys():
                raise UsageError(f"{where}: [{name}] " + str(_unknown_key(k)))
    both = sorted(set(tables["search"]) & set(tables["fixed"]))
    if both:
        raise UsageError(f"{where}: {both[0]!r} is both searched and fixed")
    params = {}
    for k, spec in tables["search"].items():
        w = f"{where}: [search] {k}"
        if not isinstance(spec, dict):
            raise UsageError(f"{w}: expected a table such as {{low = 1e-4, high = 1e-2}} or "
                             f"{{choices = [...]}}, got {spec!r:.60}")
        bad = sorted(set(spec) - SPEC_FIELDS)
        if bad:
            raise UsageError(f"{w}: unknown field {bad[0]!r} (expected low, high, log, step "
                             "or choices)")
        if "choices" in spec:
            if set(spec) != {"choices"}:
                raise UsageError(f"{w}: choices cannot be combined with low/high/log/step")
            ch = spec["choices"]
            if not isinstance(ch, list) or not ch:
                raise UsageError(f"{w}: choices must be a non-empty list, got {ch!r:.60}")
            params[k] = {"choices": ch}
            continue
        if "low" not in spec or "high" not in spec:
            raise UsageError(f"{w}: needs low and high (or choices)")
        lo, hi, log, step = spec["low"], spec["high"], spec.get("log", False), spec.get("step")
        if not (_num(lo) and _num(hi)):
            raise UsageError(f"{w}: low and high must be finite numbers, got {lo!r}, {hi!r}")
        if not lo < hi:
            raise UsageError(f"{w}: low must be below high, got low = {lo}, high = {hi}")
        if not isinstance(log, bool):
            raise UsageError(f"{w}: log must be true or false, got {log!r}")
        if log and lo <= 0:
            raise UsageError(f"{w}: log = true needs low > 0, got {lo}")
        if step is not None and (not _num(step) or step <= 0):
            raise UsageError(f"{w}: step must be a positive number, got {step!r}")
        if step is not None and log:
            raise UsageError(f"{w}: step and log = true cannot be combined")
        t = hints[k]
        if t is int:
            if not all(isinstance(v, int) for v in (lo, hi)) or \
                    (step is not None and not isinstance(step, int)):
                raise UsageError(f"{w}: {k} is an integer key; low, high and step must be "
                                 f"integers")
            params[k] = {"low": lo, "high": hi, "log": log, "step": step, "int": True}
        elif t is float or t == (float | None):
            params[k] = {"low": float(lo), "high": float(hi), "log": log,
                         "step": None if step is None else float(step), "int": False}
        else:
            raise UsageError(f"{w}: {k} is not a number; search it with choices = [...]")
    tune = dict(TUNE_KEYS)
    for k, v in tables["tune"].items():
        w = f"{where}: [tune] {k}"
        if k not in TUNE_KEYS:
            raise UsageError(f"{where}: [tune] unknown key {k!r} (expected "
                             f"{', '.join(TUNE_KEYS)})")
        if k == "pruner" and v not in ("median", "none"):
            raise UsageError(f"{w}: expected median or none, got {v!r:.60}")
        if k == "sampler" and v not in ("tpe", "random"):
            raise UsageError(f"{w}: expected tpe or random, got {v!r:.60}")
        lo = 1 if k in ("eval_every", "eval_episodes") else 0
        if k not in ("pruner", "sampler") and (not isinstance(v, int) or isinstance(v, bool)
                                               or not lo <= v <= 2**31):
            raise UsageError(f"{w}: expected an integer >= {lo}, got {v!r:.60}")
        tune[k] = v
    return SearchSpace(params, dict(tables["fixed"]), tune)


def _check_values(space: SearchSpace, base: dict[str, Any], where: str) -> None:
    """Each bound and choice alone on the base configuration: a value the key itself
    refuses is an error now, naming the key (combinations are left to the trials)."""
    from ppokit.algos import resolve_config

    for k, s in space.params.items():
        values = s["choices"] if "choices" in s else [s["low"], s["high"]]
        for v in values:
            try:
                resolve_config(**{**base, "overrides": {**base["overrides"], k: v}})
            except UsageError as exc:
                if getattr(exc, "field", None) == k:
                    raise UsageError(f"{where}: [search] {k}: {v!r:.60} is not a valid value "
                                     f"({exc})") from None


# ------------------------------------------------------------------------------ the study

class Coordinator:
    """The Optuna study: hands out trials, takes evaluations (and says when to prune),
    records results. Runs in the driver, or as a Ray actor for trials that run as tasks."""

    def __init__(self, space: SearchSpace):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        t = space.tune
        sampler = (optuna.samplers.TPESampler(seed=t["seed"], n_startup_trials=max(
            1, min(10, t["startup_trials"]))) if t["sampler"] == "tpe"
            else optuna.samplers.RandomSampler(seed=t["seed"]))
        pruner = (optuna.pruners.MedianPruner(n_startup_trials=t["startup_trials"],
                                              n_warmup_steps=t["warmup_evals"])
                  if t["pruner"] == "median" else optuna.pruners.NopPruner())
        self.space = space
        self.study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
        self.trials: dict[int, Any] = {}
        self.info: dict[int, dict] = {}

    def ask(self) -> tuple[int, dict[str, Any]]:
        trial = self.study.ask()
        params = self.space.suggest(trial)
        self.trials[trial.number] = trial
        self.info[trial.number] = {"params": params}
        return trial.number, params

    def report(self, number: int, step: int, value: float) -> bool:
        """Record evaluation ``step`` (1, 2, …) of a trial; True when it should stop."""
        trial = self.trials[number]
        trial.report(float(value), step)
        return bool(trial.should_prune())

    def tell(self, number: int, result: dict[str, Any]) -> None:
        from optuna.trial import TrialState

        self.info[number].update(result)
        trial = self.trials[number]
        if result["state"] == "complete":
            self.study.tell(trial, float(result["value"]))
        elif result["state"] == "pruned":
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for n in sorted(self.info):
            i = self.info[n]
            out.append({"number": n, "state": i.get("state", "running"),
                        "value": i.get("value"), "best_eval_during_training":
                        i.get("best_eval"), "evaluations": i.get("evaluations"),
                        "steps": i.get("steps"), "seconds": i.get("seconds"),
                        **{k: i["params"].get(k) for k in self.space.params},
                        "message": i.get("message", "")})
        return out


def run_trial(cfg_dict: dict[str, Any], env_named: str | None, trial_dir: str,
              episodes: int, number: int, report) -> dict[str, Any]:
    """Train one trial into ``trial_dir``, reporting each evaluation during training
    (``report(number, k, value) -> prune?``), then score the final policy."""
    import torch

    from ppokit.algos import Trainer
    from ppokit.algos.config import config_from_dict
    from ppokit.algos.evaluate import evaluate_run
    from ppokit.envs.source import import_env_module

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    state = {"evaluations": 0, "last": None, "pruned": False}
    try:
        if env_named is not None:
            import_env_module(env_named, "--env")
        cfg = config_from_dict(cfg_dict)
        tr = Trainer(cfg, trial_dir, log=lambda m: None)
    except (UsageError, ValueError) as exc:
        return {"state": "failed", "value": None, "message": str(exc)[:300],
                "seconds": time.perf_counter() - t0}

    def on_iteration(rec):
        v = rec.get("eval_return_mean")
        if v is None:
            return None
        state["evaluations"] += 1
        state["last"] = v
        prune = report(number, state["evaluations"], v)
        if prune and tr.iteration < tr.cfg.num_iterations:  # (a finished trial is scored)
            state["pruned"] = True
            return "stop"
        return None

    try:
        tr.train(on_iteration)
        best = tr.best_eval_return
        steps = tr.global_step
    except Exception as exc:  # noqa: BLE001 - a diverging trial fails, the search goes on
        return {"state": "failed", "value": None, "steps": tr.global_step,
                "message": f"{type(exc).__name__}: {str(exc)[:300]}",
                "seconds": time.perf_counter() - t0}
    finally:
        tr.close()
    out = {"best_eval": best, "evaluations": state["evaluations"], "steps": steps}
    if state["pruned"]:
        out.update(state="pruned", value=state["last"],
                   message=f"pruned after evaluation {state['evaluations']}")
    else:
        res = evaluate_run(trial_dir, episodes=episodes, env=env_named)
        out.update(state="complete", value=res["mean_return"], message="")
    out["seconds"] = time.perf_counter() - t0
    return out


def _ray_trial(cfg_dict, env_named, episodes, number, coord) -> tuple[dict, bytes]:
    """A trial as a Ray task: trains in a temporary directory of its node and returns the
    result with the trial directory as an archive."""
    import io
    import os
    import tarfile
    import tempfile

    import ray

    def report(n, k, v):
        return ray.get(coord.report.remote(n, k, v))

    with tempfile.TemporaryDirectory(prefix="ppokit-trial-") as tmp:
        d = os.path.join(tmp, "trial")
        res = run_trial(cfg_dict, env_named, d, episodes, number, report)
        buf = io.BytesIO()
        if os.path.isdir(d):
            with tarfile.open(fileobj=buf, mode="w:gz") as tar:
                tar.add(d, arcname=".")
        return res, buf.getvalue()


# ------------------------------------------------------------------------------ outputs

def _toml_value(v: Any) -> str:
    if v is None:
        return '"none"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def to_toml(values: dict[str, Any], header: str = "") -> str:
    lines = [f"# {h}" for h in header.splitlines()]
    lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def _write_csv(path: Path, rows: list[dict]) -> None:
    import csv
    import io

    from ppokit.io.atomic import atomic_write_text

    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v
                        for k, v in r.items()})
    atomic_write_text(path, buf.getvalue())


def _plot(path: Path, rows: list[dict], space: SearchSpace, title: str) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(space.params)
    fig, axes = plt.subplots(1, 1 + len(keys), figsize=(4.2 * (1 + len(keys)), 3.6),
                             squeeze=False)
    ax = axes[0][0]
    best, xs, ys = -math.inf, [], []
    marks = {"complete": ("o", "C0"), "pruned": ("x", "C3")}
    for r in rows:
        if r["value"] is None or r["state"] not in marks:
            continue
        m, c = marks[r["state"]]
        ax.scatter(r["number"], r["value"], marker=m, color=c)
        if r["state"] == "complete":
            best = max(best, r["value"])
            xs.append(r["number"])
            ys.append(best)
    if xs:
        ax.step(xs, ys, where="post", color="k", lw=1, label="best so far")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("trial")
    ax.set_ylabel("score (eval return; x: pruned, last eval)")
    ax.set_title(title, fontsize=9)
    for ax, k in zip(axes[0][1:], keys):
        s = space.params[k]
        for r in rows:
            if r["value"] is None or r["state"] not in marks:
                continue
            m, c = marks[r["state"]]
            x = r[k]
            if "choices" in s:
                x = s["choices"].index(x)
            ax.scatter(x, r["value"], marker=m, color=c)
        if "choices" in s:
            ax.set_xticks(range(len(s["choices"])))
            ax.set_xticklabels([str(v) for v in s["choices"]], fontsize=7)
        elif s.get("log"):
            from matplotlib.ticker import NullFormatter

            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # (crowded on a short range)
        ax.set_xlabel(k)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------ command

def run(args: argparse.Namespace) -> int:

    from ppokit.algos import resolve_config

    from .train import _parse_sets, _read_toml

    try:
        import optuna  # noqa: F401
    except ImportError:
        raise UsageError("ppokit tune needs Optuna, which is not installed (pip install "
                         "'ppokit[tune]')") from None
    if not 1 <= args.trials <= MAX_TRIALS:
        raise UsageError(f"--trials: expected an integer in [1, {MAX_TRIALS}], got "
                         f"{args.trials}")
    if not 1 <= args.eval_episodes <= 10**6:
        raise UsageError(f"--eval-episodes: expected an integer in [1, 1000000], got "
                         f"{args.eval_episodes}")
    if args.parallel is not None and (args.backend != "ray" or args.parallel < 1):
        raise UsageError("--parallel: an integer >= 1, and only with --backend ray")
    space = read_search(args.search)
    sets = _parse_sets(args.sets)
    toml_values = _read_toml(args.config) if args.config else {}
    flags = {"env_id": args.env_id, "algo": args.algo,
             "total_timesteps": args.total_timesteps, "seed": args.seed}
    flags = {k: v for k, v in flags.items() if v is not None}
    t = space.tune
    overrides = {"eval_every": t["eval_every"], "eval_episodes": t["eval_episodes"],
                 "tensorboard": False, **space.fixed, **sets}
    base = {"toml_values": toml_values, "overrides": overrides, "flags": flags}
    where = f"--search {args.search}"
    try:
        cfg0 = resolve_config(**base)
    except UsageError as exc:
        raise UsageError(f"{where} [fixed] / --set: {exc}") from None
    _check_values(space, base, where)
    from ppokit.envs.source import import_env_module
    from ppokit.io.rundir import RunLock, holds_run, parent_run_dir

    import_env_module(cfg0.env_id, "--env")
    env_named = cfg0.env_id if ":" in cfg0.env_id else None
    def taken(root: Path) -> str | None:
        if (root / "trials.csv").exists() or holds_run(root):
            return f"{root} already holds a search or a run"
        return None

    root = parent_run_dir(args.run_dir, f"{cfg0.env_id}-{cfg0.algo}-tune", taken)
    lock = RunLock(root, "tune")
    ray = None
    if args.backend == "ray":
        from ppokit.distributed import ensure_ray

        ray = ensure_ray(lambda m: print(m, flush=True), "--backend ray")
    keys = ", ".join(space.params)
    print(f"tuning {keys} of {cfg0.algo} on {cfg0.env_id}: {args.trials} trials "
          f"({args.backend}), pruner {t['pruner']}, into {root}", flush=True)
    t0 = time.perf_counter()
    if ray is None:
        coord = Coordinator(space)
        for _ in range(args.trials):
            number, params = coord.ask()
            cfg = _trial_config(base, params)
            res = (run_trial(cfg["_config"], env_named, str(root / f"trial_{number:03d}"),
                             args.eval_episodes, number, coord.report)
                   if "_config" in cfg else cfg)
            coord.tell(number, res)
            _say(number, params, res)
        rows = coord.rows()
    else:
        rows = _run_on_ray(ray, space, base, env_named, root, args)
    wall = time.perf_counter() - t0
    return _finish(root, lock, rows, space, base, cfg0, wall, args)


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


def _run_on_ray(ray, space, base, env_named, root: Path, args) -> list[dict]:
    from ppokit.distributed.tasks import unpack_run

    coord = ray.remote(num_cpus=0)(Coordinator).remote(space)
    task = ray.remote(num_cpus=1, max_retries=0)(_ray_trial)
    parallel = args.parallel or max(1, int(ray.cluster_resources().get("CPU", 1)))
    asked = 0
    running: dict = {}
    while asked < args.trials or running:
        while asked < args.trials and len(running) < parallel:
            number, params = ray.get(coord.ask.remote())
            asked += 1
            cfg = _trial_config(base, params)
            if "_config" not in cfg:
                ray.get(coord.tell.remote(number, cfg))
                _say(number, params, cfg)
                continue
            ref = task.remote(cfg["_config"], env_named, args.eval_episodes, number, coord)
            running[ref] = (number, params)
        if not running:
            continue
        done, _ = ray.wait(list(running), num_returns=1)
        number, params = running.pop(done[0])
        try:
            res, data = ray.get(done[0])
        except ray.exceptions.RayError as exc:
            res, data = {"state": "failed", "value": None,
                         "message": f"Ray task failed: {type(exc).__name__}"}, b""
        if data:
            unpack_run(data, root / f"trial_{number:03d}")
        ray.get(coord.tell.remote(number, res))
        _say(number, params, res)
    return ray.get(coord.rows.remote())


def _finish(root: Path, lock, rows: list[dict], space: SearchSpace, base: dict, cfg0,
            wall: float, args) -> int:
    from ppokit.io.atomic import atomic_write_text

    for r in rows:
        r.pop("_refused", None)
    _write_csv(root / "trials.csv", rows)
    done = [r for r in rows if r["state"] == "complete" and r["value"] is not None]
    counts = {s: sum(r["state"] == s for r in rows) for s in ("complete", "pruned", "failed")}
    best = max(done, key=lambda r: r["value"]) if done else None
    study = {"trials": len(rows), **counts, "wall_seconds": wall,
             "search": space.params, "fixed": space.fixed, "tune": space.tune,
             "best": None if best is None else {"number": best["number"],
                                                 "value": best["value"]}}
    atomic_write_text(root / "study.json", json.dumps(study, indent=2) + "\n")
    png = _plot(root / "search.png", rows, space,
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
                  f"(score {best['value']:.1f}: mean return of {args.eval_episodes} "
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
