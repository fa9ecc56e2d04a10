"""What ppokit learns, measured: every task of ``bench.learning_tasks`` trained with ppokit's
preset on several seeds, evaluated by a fixed protocol, side by side with the published
results of the RL-zoo, CleanRL and Tianshou (``docs/benchmarks/references.json``).

    python -m bench.learning list                       # the task table
    python -m bench.learning run --tasks cartpole,pendulum --seeds 0-4 --jobs 2
    python -m bench.learning run --family mujoco        # every task of a family
    python -m bench.learning table                      # docs/benchmarks.md's table + figure
    python -m bench.learning quick --jobs 2             # the regression net (exit 1 on a fall)
    python -m bench.learning sb3 --tasks minatar-breakout --seeds 0-2   # SB3, same budget
    python -m bench.learning sb3 --tasks ant --seeds 0-1                # (MuJoCo too)

``run`` is resumable: each (task, seed) trains in its own run directory under ``--out``
(default ``runs/bench-learning``); a run stopped by a signal or a lost session continues
from its last checkpoint when ``run`` is called again (ppokit's exact resume), and a run
whose result file exists is skipped. Each finished run writes one small JSON file,
``docs/benchmarks/results/<task>/seed<N>.json``: the commit, the versions, the evaluation
curve, the final evaluation, wall time and steps per second. ``table`` reads only those
files, so results gathered over several sittings and machines aggregate into one table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.learning_tasks import QUICK, TASKS, Task, random_key, slug, task

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "benchmarks" / "results"
REFERENCES = ROOT / "docs" / "benchmarks" / "references.json"
RESULTS_SB3 = ROOT / "docs" / "benchmarks" / "results_sb3"  # bench/learning_sb3.py
EVAL_SEED = 7_000_000  # final evaluations: episode seeds seed + this + k


# ------------------------------------------------------------------ one run
def _ppokit(*args: str) -> list[str]:
    return [sys.executable, "-m", "ppokit", *args]


def _iteration_steps(t: Task) -> int:
    from ppokit.algos.config import resolve_config

    cfg = resolve_config(env_id=t.env_id, overrides=dict(t.sets))
    return cfg.n_envs * cfg.n_steps


def eval_every(t: Task, steps: int) -> int:
    """Iterations between the evaluations during training (``curve_points`` of them over
    a budget of ``steps``)."""
    iters = max(1, steps // _iteration_steps(t))
    return max(1, iters // t.curve_points)


def train_command(t: Task, seed: int, run_dir: Path, steps: int) -> list[str]:
    """The ``ppokit train`` invocation of one run: the task's preset, its budget, the
    evaluation protocol; nothing else."""
    every = eval_every(t, steps)
    sets = {"eval_every": every, "eval_episodes": t.curve_episodes,
            "checkpoint_every": max(1, min(every, 50)), **t.sets}
    if t.stochastic_eval:  # (named only where it differs from the default, so that the
        sets["eval_deterministic"] = "false"  # net also runs on code older than the key)
    return _ppokit("train", "--env", t.env_id, "--seed", str(seed), "--run-dir", str(run_dir),
                   "--total-steps", str(steps), "--no-progress", "--eval-episodes", "0",
                   "--set", *(f"{k}={v}" for k, v in sets.items()))


def _finished(run_dir: Path) -> bool:
    return (run_dir / "bench-trained").exists()


def _has_checkpoint(run_dir: Path) -> bool:
    return any((run_dir / "checkpoints").glob("iter_*")) if run_dir.is_dir() else False


def _metrics(run_dir: Path) -> list[dict]:
    rows = []
    with open(run_dir / "metrics.jsonl") as fh:
        for line in fh:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def _versions() -> dict:
    import gymnasium
    import numpy
    import torch

    import ppokit

    out = {"ppokit": getattr(ppokit, "__version__", "?"), "torch": torch.__version__,
           "gymnasium": gymnasium.__version__, "numpy": numpy.__version__,
           "python": platform.python_version()}
    for mod in ("mujoco", "ale_py", "minatar", "Box2D"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 (not installed, or no version attribute)
            continue
    return out


def _commit(where: Path = ROOT) -> str:
    """The commit of the checkout at ``where`` (``+changes`` when its tracked files differ)."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where,
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=where, capture_output=True, text=True, timeout=10).stdout
        return rev + ("+changes" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def result_record(t: Task, seed: int, run_dir: Path, steps: int, final: dict,
                  src: str | None = None) -> dict:
    """The result file's content, from the run directory's metrics and final evaluation;
    ``src``: the source directory of the ppokit that trained it (``--src``), whose
    checkout's commit is recorded (this one's by default)."""
    rows = _metrics(run_dir)
    last = rows[-1]
    wall = float(last["time"])
    curve = [[int(r["global_step"]), float(r["eval_return_mean"]), float(r["time"])]
             for r in rows if r.get("eval_return_mean") is not None]
    stride = max(1, len(rows) // 100)
    train_curve = [[int(r["global_step"]), r.get("episode_return_mean")]
                   for r in rows[::stride]]
    return {
        "task": t.name, "env_id": t.env_id, "seed": seed, "budget": steps,
        "steps": int(last["global_step"]), "iterations": int(last["iteration"]),
        "wall_s": round(wall, 1), "steps_per_s": round(last["global_step"] / wall, 1),
        "final": {"mean": final["mean_return"], "std": final["std_return"],
                  "episodes": final["episodes"], "deterministic": final["deterministic"],
                  "seed": final["seed"]},
        "curve": curve, "train_curve": train_curve,
        "protocol": {"curve_episodes": t.curve_episodes, "final_episodes": t.final_episodes,
                     "stochastic_eval": t.stochastic_eval, "sets": dict(t.sets)},
        "commit": _commit(Path(src).resolve() if src else ROOT), "versions": _versions(),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "load_1min": round(os.getloadavg()[0], 2)},
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def result_path(t: Task, seed: int, results: Path = RESULTS) -> Path:
    return results / slug(t) / f"seed{seed}.json"


def command_for(t: Task, seed: int, run_dir: Path, steps: int) -> tuple[list[str], str]:
    """What to run for (task, seed) given its run directory's state: nothing more when it
    trained to the end (evaluation only), ``ppokit train --resume`` from its last
    checkpoint, else a new run (a directory stopped before its first checkpoint is
    removed first)."""
    if _finished(run_dir):
        return [sys.executable, "-c", "pass"], ""
    if _has_checkpoint(run_dir):
        return (_ppokit("train", "--resume", str(run_dir), "--no-progress", "--eval-episodes",
                        "0"), f"resuming {run_dir}")
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return train_command(t, seed, run_dir, steps), f"training {steps} steps into {run_dir}"


class Runner:
    """Runs (task, seed) pairs, at most ``jobs`` at a time, each resumable; a SIGTERM or
    SIGINT stops every child at its next iteration boundary (each writes a checkpoint)."""

    def __init__(self, out: Path, results: Path, jobs: int, quick: bool = False,
                 log=print, src: str | None = None):
        self.out, self.results, self.jobs, self.quick, self.log = out, results, jobs, quick, log
        self.env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.src = src
        if src:  # train another checkout's ppokit (the quick net on an earlier commit)
            self.env["PYTHONPATH"] = os.pathsep.join(
                [str(Path(src).resolve()), *filter(None, [os.environ.get("PYTHONPATH")])])
        self.children: list[subprocess.Popen] = []
        self.stopping = False

    def _stop(self, signum, frame):  # noqa: ARG002
        self.stopping = True
        for p in self.children:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def run(self, pairs: list[tuple[Task, int]]) -> list[Path]:
        saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        for sig in saved:
            signal.signal(sig, self._stop)
        try:
            return self._run(pairs)
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)

    def _run(self, pairs: list[tuple[Task, int]]) -> list[Path]:
        todo = [(t, s) for t, s in pairs if not self._has_result(t, s)]
        skipped = len(pairs) - len(todo)
        if skipped:
            self.log(f"{skipped} run(s) already have a result file: skipped")
        done: list[Path] = []
        running: dict[subprocess.Popen, tuple] = {}
        while (todo or running) and not self.stopping:
            while todo and len(running) < self.jobs and not self.stopping:
                t, s = todo.pop(0)
                proc, info = self._start(t, s)
                if proc is not None:
                    running[proc] = info
            finished = [p for p in running if p.poll() is not None]
            for p in finished:
                info = running.pop(p)
                self.children.remove(p)
                path = self._finish(p, *info)
                if path is not None:
                    done.append(path)
            time.sleep(0.5)
        for p in list(running):
            p.wait()
        return done

    def _budget(self, t: Task) -> int:
        return t.quick.steps if self.quick else t.steps

    def _has_result(self, t: Task, seed: int) -> bool:
        """A result file at this budget exists (one at another budget is trained again, in
        a new run directory)."""
        path = result_path(t, seed, self.results)
        if not path.exists():
            return False
        if json.loads(path.read_text()).get("budget") == self._budget(t):
            return True
        stale = self.out / slug(t) / f"seed{seed}"
        if stale.exists():
            import shutil

            shutil.rmtree(stale)
        return False

    def _start(self, t: Task, seed: int):
        steps = self._budget(t)
        run_dir = self.out / slug(t) / f"seed{seed}"
        cmd, what = command_for(t, seed, run_dir, steps)
        if what:
            self.log(f"{t.name} seed {seed}: {what}")
        log_path = self.out / slug(t) / f"seed{seed}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(log_path, "a")
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.env)
        fh.close()
        self.children.append(proc)
        return proc, (t, seed, run_dir, steps, log_path)

    def _finish(self, proc, t: Task, seed: int, run_dir: Path, steps: int,
                log_path: Path) -> Path | None:
        if proc.returncode != 0:
            if not self.stopping:
                self.log(f"{t.name} seed {seed}: ppokit train exited {proc.returncode} "
                         f"(log: {log_path})")
            return None
        (run_dir / "bench-trained").touch()
        args = ["eval", str(run_dir), "--episodes", str(t.final_episodes),
                "--seed", str(seed + EVAL_SEED)]
        if t.stochastic_eval:
            args.append("--stochastic")
        ev = subprocess.run(_ppokit(*args), capture_output=True, text=True, env=self.env)
        if ev.returncode != 0:
            self.log(f"{t.name} seed {seed}: ppokit eval exited {ev.returncode}: "
                     f"{ev.stderr.strip()[-300:]}")
            return None
        name = "eval_stochastic.json" if t.stochastic_eval else "eval.json"
        final = json.loads((run_dir / name).read_text())
        rec = result_record(t, seed, run_dir, steps, final, self.src)
        path = result_path(t, seed, self.results)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, indent=1) + "\n")
        tmp.replace(path)
        self.log(f"{t.name} seed {seed}: final {rec['final']['mean']:.3f} ± "
                 f"{rec['final']['std']:.3f} ({rec['final']['episodes']} episodes), "
                 f"{rec['steps']} steps in {rec['wall_s']:.0f} s -> {_shown(path)}")
        return path


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


# ------------------------------------------------------------------ selection
def parse_seeds(text: str) -> list[int]:
    """``"0-4"`` or ``"0,2,5"`` as a list of seeds."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return out


def select(tasks: str | None, family: str | None, pool=TASKS) -> list[Task]:
    chosen = [task(n.strip()) for n in tasks.split(",")] if tasks else list(pool)
    if family:
        chosen = [t for t in chosen if t.family in family.split(",")]
    return chosen


def installed(t: Task) -> bool:
    """Whether the environment of ``t`` can be built here (its extra installed)."""
    mod = {"mujoco": "mujoco", "box2d": "Box2D", "atari": "ale_py",
           "minatar": "minatar"}.get(t.extra or "")
    if mod is None:
        return True
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


# ------------------------------------------------------------------ commands
def cmd_list(a) -> int:
    for t in TASKS:
        q = f"quick {t.quick.steps:>9,} ≥ {t.quick.threshold:g}" if t.quick else ""
        print(f"{slug(t):<34}{t.env_id:<28}{t.steps:>11,}  {t.seeds} seeds  {t.policy:<32}{q}")
    return 0


def cmd_run(a) -> int:
    chosen = select(a.tasks, a.family)
    missing = [t for t in chosen if not installed(t)]
    for t in missing:
        print(f"{t.name}: needs the {t.extra} extra (pip install 'ppokit[{t.extra}]'); "
              "skipped", file=sys.stderr)
    pairs = [(t, s) for t in chosen if t not in missing
             for s in (parse_seeds(a.seeds) if a.seeds else range(t.seeds))]
    runner = Runner(Path(a.out), Path(a.results), a.jobs)
    done = runner.run(pairs)
    print(f"{len(done)} run(s) finished this time; `python -m bench.learning table` "
          "aggregates every result file")
    return 130 if runner.stopping else 0


def cmd_quick(a) -> int:
    from bench.learning_table import quick_verdicts

    chosen = select(a.tasks, None, QUICK)
    missing = [t for t in chosen if not installed(t)]
    if missing:
        print("quick net: needs " + ", ".join(f"{t.name} ({t.extra} extra)" for t in missing),
              file=sys.stderr)
        return 2
    seeds = parse_seeds(a.seeds)
    results = Path(a.results) if a.results != str(RESULTS) else Path(a.out) / "results"
    if a.fresh:
        import shutil

        shutil.rmtree(a.out, ignore_errors=True)
    runner = Runner(Path(a.out), results, a.jobs, quick=True, src=a.src)
    t0 = time.time()
    runner.run([(t, s) for t in chosen for s in seeds])
    if runner.stopping:
        return 130
    ok = quick_verdicts(chosen, seeds, results, print)
    print(f"quick net: {'pass' if ok else 'FAIL'} in {time.time() - t0:.0f} s")
    return 0 if ok else 1


def random_score(t: Task, episodes: int = 20) -> float:
    """The mean return of uniformly random actions over ``episodes`` episodes (seeds 0..)."""
    import gymnasium as gym

    import ppokit.envs  # noqa: F401 (registers ppokit's ids)
    from ppokit.envs.vec import check_env_id

    check_env_id(t.env_id)
    kwargs = json.loads(t.sets["env_kwargs"]) if "env_kwargs" in t.sets else {}
    if t.family == "atari":
        from ppokit.envs.atari import make_env

        env = make_env(t.env_id, training=False)  # whole games, unclipped scores
    else:
        env = gym.make(t.env_id, **kwargs)
    env.action_space.seed(0)
    total = 0.0
    for k in range(episodes):
        env.reset(seed=k)
        done = False
        while not done:
            _, r, term, trunc, _ = env.step(env.action_space.sample())
            total += float(r)
            done = term or trunc
    env.close()
    return total / episodes


def cmd_random(a) -> int:
    """docs/benchmarks/random.json: each installed task's random-policy score (the zero of
    the time-to-threshold column)."""
    path = REFERENCES.with_name("random.json")
    out = json.loads(path.read_text()) if path.exists() else {}
    for t in select(a.tasks, None):
        key = random_key(t)
        if key in out or not installed(t) or (t.sets and not t.published):
            continue
        out[key] = round(random_score(t, 5 if t.family == "atari" else 20), 3)
        print(f"{key}: {out[key]}", flush=True)
        path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


def cmd_table(a) -> int:
    from bench.learning_table import write_table

    write_table(Path(a.results), REFERENCES, ROOT / "docs" / "benchmarks.md",
                ROOT / "docs" / "benchmarks" / "curves.png", sb3_results=Path(a.sb3_results))
    return 0


def cmd_sb3(a) -> int:
    try:
        from bench.learning_sb3 import cmd_sb3 as run_sb3
    except ImportError as exc:
        print(f"python -m bench.learning sb3: needs stable-baselines3 ({exc})", file=sys.stderr)
        return 2
    return run_sb3(a)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.learning",
                                description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the task table")
    for name, hlp in (("run", "train and evaluate (resumable)"),
                      ("quick", "the regression net: reduced budgets, two seeds")):
        q = sub.add_parser(name, help=hlp)
        q.add_argument("--tasks", help="task names or slugs, comma-separated (default: all)")
        q.add_argument("--seeds", default=None if name == "run" else "0,1",
                       help="seeds, e.g. 0-4 or 0,2 (default: each task's count from 0)")
        q.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
        q.add_argument("--out", default="runs/bench-learning" + ("-quick" * (name == "quick")),
                       help="where the run directories go")
        q.add_argument("--results", default=str(RESULTS), help="where result files go")
        if name == "run":
            q.add_argument("--family", help="only tasks of these families (comma-separated)")
        else:
            q.add_argument("--fresh", action="store_true",
                           help="remove --out first (the net trains the current code anew)")
            q.add_argument("--src", help="train the ppokit package of this source directory "
                                         "(another checkout's src/) instead of the installed one")
    b = sub.add_parser("sb3", help="the equal-budget Stable-Baselines3 reference (MinAtar, "
                                   "MuJoCo; bench/learning_sb3.py)")
    b.add_argument("--tasks", help="MinAtar or MuJoCo task names or slugs, "
                                     "comma-separated")
    b.add_argument("--seeds", default="0-2", help="seeds, e.g. 0-2 (default)")
    b.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    b.add_argument("--steps", type=int, default=None,
                   help="a reduced budget, for smoke tests only (recorded in the file; the "
                        "table reads only files at the task's budget)")
    b.add_argument("--results", default=str(RESULTS_SB3), help="where result files go")
    r = sub.add_parser("random", help="random-policy scores into docs/benchmarks/random.json")
    r.add_argument("--tasks")
    t = sub.add_parser("table", help="aggregate the result files into docs/benchmarks.md")
    t.add_argument("--results", default=str(RESULTS))
    t.add_argument("--sb3-results", default=str(RESULTS_SB3),
                   help="the SB3 reference's result files (python -m bench.learning sb3)")
    a = p.parse_args(argv)
    return {"list": cmd_list, "run": cmd_run, "quick": cmd_quick, "table": cmd_table,
            "random": cmd_random, "sb3": cmd_sb3}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
