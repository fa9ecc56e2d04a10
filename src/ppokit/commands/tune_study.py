"""``ppokit tune``'s study: the Optuna study behind one lock (:class:`Coordinator`: trials
asked, reported and told from one process, local or Ray), its journal on disk, one trial's
training run (:func:`run_trial`, :func:`ray_trial`) and the study's table and figure."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from ppokit.errors import UsageError

from .tune_space import SearchSpace

__all__ = ["STUDY_NAME", "JOURNAL", "MAX_JOURNAL", "journal_storage", "Coordinator",
           "run_trial", "ray_trial", "write_csv", "plot_study"]

STUDY_NAME = "ppokit-tune"
JOURNAL = "study.journal"
MAX_JOURNAL = 256 * 2**20


def journal_storage(path: Path):
    """Optuna's journal storage in the file ``path`` (created if missing): every trial,
    its parameters, evaluations and result, appended as they happen, so that a study
    killed at any moment continues. The file must be a regular file ppokit wrote (no link)
    of a bounded size that Optuna can replay (anything else — bytes that are not UTF-8
    text, an operation it does not know — is a one-line :class:`UsageError` naming the
    file); a lock file left by a killed writer is removed (the tuning directory's own lock
    says no other process writes it)."""
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
    if os.path.lexists(path) and os.path.getsize(path) > 0:
        _check_journal(path)
    try:  # Optuna replays the whole journal here: whatever it cannot replay is said once
        return JournalStorage(JournalFileBackend(str(path)))
    except Exception as exc:  # noqa: BLE001 - bytes or operations ppokit did not write
        from ppokit.plugins import raised

        raise UsageError(f"tuning dir: {path} is not a study journal ppokit wrote (Optuna "
                         f"cannot replay it: {raised(exc)[:160]})") from None


def _check_journal(path: Path) -> None:
    """Refuse, before Optuna reads or appends a byte, a journal ppokit did not write.

    Optuna skips an unreadable last line (it takes it for a write cut short), so a file of
    bytes with no complete line would replay as an empty journal and then be appended to.
    Here every complete line must be a JSON object with an integer ``op_code``, the first
    one creating the study; a last line cut short after such lines (a writer killed mid
    line) is dropped, as Optuna would read it, so the next append starts on a line of its
    own."""
    bad = f"tuning dir: {path} is not a study journal ppokit wrote"
    good_end = 0
    with open(path, "rb") as f:
        for number, line in enumerate(f):
            if not line.endswith(b"\n"):
                if number == 0:
                    raise UsageError(f"{bad} (it holds no complete line)")
                break
            try:
                op = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                raise UsageError(f"{bad} (line {number + 1} is not JSON text)") from None
            if not isinstance(op, dict) or type(op.get("op_code")) is not int:
                raise UsageError(f"{bad} (line {number + 1} is not a journal operation)")
            if number == 0 and op["op_code"] != 0:
                raise UsageError(f"{bad} (its first line does not create a study)")
            good_end += len(line)
    if good_end < os.path.getsize(path):
        os.truncate(path, good_end)


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


def ray_trial(cfg_dict, env_named, episodes, number, coord, stop_flag=None
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

def write_csv(path: Path, rows: list[dict]) -> None:
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


def plot_study(path: Path, rows: list[dict], space: SearchSpace, title: str) -> Path | None:
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
