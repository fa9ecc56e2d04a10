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
import os
import sys
import time
from pathlib import Path
from typing import Any

from ppokit.cliutil import int_arg as _int
from ppokit.cliutil import to_toml
from ppokit.errors import UsageError

__all__ = ["add_arguments", "run", "read_search", "SearchSpace", "Coordinator", "to_toml"]

SPEC_FIELDS = {"low", "high", "log", "step", "choices"}
TUNE_KEYS = {"eval_every": 5, "eval_episodes": 5, "pruner": "median", "startup_trials": 3,
             "warmup_evals": 2, "sampler": "tpe", "seed": 0}
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
    from ppokit.cliutil import load_toml

    return parse_search(load_toml(path, "--search"), f"--search {path}")


def parse_search(data: dict, where: str) -> SearchSpace:
    """Check the tables of a search file (``data``: its parsed TOML); every problem is one
    :class:`UsageError` line starting with ``where``."""
    from ppokit.algos.config import TrainConfig, unknown_key, valid_keys

    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected tables [search], [fixed], [tune]")
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
                raise UsageError(f"{where}: [{name}] " + str(unknown_key(k)))
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

STUDY_NAME = "ppokit-tune"
JOURNAL = "study.journal"
MAX_JOURNAL = 256 * 2**20


def journal_storage(path: Path):
    """Optuna's journal storage in the file ``path`` (created if missing): every trial,
    its parameters, evaluations and result, appended as they happen, so that a study
    killed at any moment continues. The file must be a regular file ppokit wrote (no link)
    of a bounded size; a lock file left by a killed writer is removed (the tuning
    directory's own lock says no other process writes it)."""
    import stat

    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    if os.path.lexists(path):
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"tuning dir: {path} is not a regular file (a link or a "
                             "special file is never read)")
        if st.st_size > MAX_JOURNAL:
            raise UsageError(f"tuning dir: {path} has {st.st_size} bytes, more than the "
                             f"{MAX_JOURNAL} a study journal may have")
    for stale in (f"{path}.lock",):
        if os.path.lexists(stale):
            os.unlink(stale)
    return JournalStorage(JournalFileBackend(str(path)))


class Coordinator:
    """The Optuna study: hands out trials, takes evaluations (and says when to prune),
    records results. Runs in the driver, or as a Ray actor for trials that run as tasks.

    With ``journal`` (a path) the study lives in Optuna's journal storage there and a
    coordinator made again on the same file continues it: finished trials (complete,
    pruned, failed) are kept with their results, and the trials that were running when
    the study stopped are handed out again (:meth:`ask` gives them first, with the same
    number and parameters)."""

    def __init__(self, space: SearchSpace, journal: str | None = None):
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
        storage = journal_storage(Path(journal)) if journal is not None else None
        try:
            self.study = optuna.create_study(direction="maximize", sampler=sampler,
                                             pruner=pruner, storage=storage,
                                             study_name=STUDY_NAME, load_if_exists=True)
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise UsageError(f"tuning dir: {journal} is not a study journal ppokit wrote "
                             f"({type(exc).__name__}: {str(exc)[:100]})") from None
        self.trials: dict[int, Any] = {}
        self.info: dict[int, dict] = {}
        self.again: list[int] = []  # running when the study stopped: to be run again
        for ft in self.study.get_trials(deepcopy=False):
            params = ft.user_attrs.get("ppokit_params")
            if not isinstance(params, dict):
                continue  # asked, but stopped before its parameters were drawn
            self.info[ft.number] = {"params": params}
            if ft.state.is_finished():
                result = ft.user_attrs.get("ppokit_result")
                self.info[ft.number].update(result if isinstance(result, dict) else
                                            {"state": ft.state.name.lower()})
            else:
                self.trials[ft.number] = optuna.trial.Trial(self.study, ft._trial_id)
                self.again.append(ft.number)

    def finished(self) -> int:
        """Trials with a result (complete, pruned or failed)."""
        return sum("state" in i for i in self.info.values())

    def ask(self) -> tuple[int, dict[str, Any], bool]:
        """``(number, parameters, again)``: a trial stopped earlier (``again``) or a new one."""
        if self.again:
            number = self.again.pop(0)
            return number, self.info[number]["params"], True
        trial = self.study.ask()
        params = self.space.suggest(trial)
        trial.set_user_attr("ppokit_params", params)
        self.trials[trial.number] = trial
        self.info[trial.number] = {"params": params}
        return trial.number, params, False

    def report(self, number: int, step: int, value: float) -> bool:
        """Record evaluation ``step`` (1, 2, …) of a trial; True when it should stop."""
        import warnings

        trial = self.trials[number]
        with warnings.catch_warnings():  # (a step reported before a restart: kept as it was)
            warnings.simplefilter("ignore")
            trial.report(float(value), step)
        return bool(trial.should_prune())

    def tell(self, number: int, result: dict[str, Any]) -> None:
        from optuna.trial import TrialState

        self.info[number].update(result)
        trial = self.trials.pop(number)
        trial.set_user_attr("ppokit_result",
                            {k: v for k, v in result.items() if k != "_refused"})
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
            if "state" not in i:
                continue  # stopped, to be run again
            out.append({"number": n, "state": i["state"],
                        "value": i.get("value"), "best_eval_during_training":
                        i.get("best_eval"), "evaluations": i.get("evaluations"),
                        "steps": i.get("steps"), "seconds": i.get("seconds"),
                        **{k: i["params"].get(k) for k in self.space.params},
                        "message": i.get("message", "")})
        return out


def run_trial(cfg_dict: dict[str, Any], env_named: str | None, trial_dir: str,
              episodes: int, number: int, report, *, again: bool = False,
              stop=None) -> dict[str, Any]:
    """Train one trial into ``trial_dir``, reporting each evaluation during training
    (``report(number, k, value) -> prune?``), then score the final policy. ``again``: the
    trial was stopped before; it continues from its last checkpoint (or starts over when
    it had none). ``stop``: a :class:`ppokit.io.GracefulStop`; a signal ends the trial with
    a checkpoint and raises :class:`ppokit.io.Interrupted`."""
    import shutil

    import torch

    from ppokit.algos import Trainer
    from ppokit.algos.config import config_from_dict
    from ppokit.algos.evaluate import evaluate_run
    from ppokit.envs.source import import_env_module
    from ppokit.io.checkpoint import find_checkpoint

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    state = {"evaluations": 0, "last": None, "pruned": False}
    resume = False
    if again and os.path.isdir(trial_dir) and not os.path.islink(trial_dir):
        resume = find_checkpoint(os.path.join(trial_dir, "checkpoints"))[0] is not None
        if not resume:  # stopped before its first checkpoint: start it over
            shutil.rmtree(trial_dir)
    try:
        if env_named is not None:
            import_env_module(env_named, "--env")
        cfg = config_from_dict(cfg_dict)
        tr = Trainer(cfg, trial_dir, log=lambda m: None, resume=resume)
    except (UsageError, ValueError) as exc:
        return {"state": "failed", "value": None, "message": str(exc)[:300],
                "seconds": time.perf_counter() - t0}
    if resume:  # the evaluations before the checkpoint were reported before the stop
        state["evaluations"] = tr.iteration // cfg.eval_every if cfg.eval_every else 0

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

    from ppokit.io import Interrupted

    try:
        tr.train(on_iteration, stop=stop)
        best = tr.best_eval_return
        steps = tr.global_step
    except Interrupted:
        raise
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


def _ray_trial(cfg_dict, env_named, episodes, number, coord, stop_flag=None
               ) -> tuple[dict, bytes]:
    """A trial as a Ray task: trains in a temporary directory of its node and returns the
    result with the trial directory as an archive. When the driver sets ``stop_flag``, the
    trial stops with a checkpoint and returns ``{"state": "stopped"}``."""
    import tempfile
    import threading

    import ray

    from ppokit.distributed.tasks import pack_run, watch_stop_flag
    from ppokit.io import GracefulStop, Interrupted
    from ppokit.io.signals import clear_stop_request

    def report(n, k, v):
        return ray.get(coord.report.remote(n, k, v))

    done = threading.Event()
    clear_stop_request()
    if stop_flag is not None:
        threading.Thread(target=watch_stop_flag, args=(stop_flag, done), daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="ppokit-trial-") as tmp:
        d = os.path.join(tmp, "trial")
        try:
            with GracefulStop(lambda m: None) as stop:
                res = run_trial(cfg_dict, env_named, d, episodes, number, report, stop=stop)
        except Interrupted:
            res = {"state": "stopped"}
        finally:
            done.set()
            clear_stop_request()
        return res, pack_run(d)


# ------------------------------------------------------------------------------ outputs

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
    _check_values(space, base, where)
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

        _write_csv(root / "trials.csv", rows)
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
            _write_csv(root / "trials.csv", coord.rows())
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
    task = ray.remote(num_cpus=1, max_retries=0)(_ray_trial)
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
            _write_csv(root / "trials.csv", ray.get(coord.rows.remote()))
    return ray.get(coord.rows.remote()), sig.signum


def _finish(root: Path, lock, rows: list[dict], space: SearchSpace, base: dict, cfg0,
            wall: float, eval_episodes: int) -> int:
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
