"""Launchers never leave orphans: real SIGTERM and ``kill -9`` sent to ``ppokit train
--seeds``, ``ppokit llm train --nproc`` and ``ppokit tune``.

A SIGTERM to a launcher reaches every child once: each writes a checkpoint and stops, the
launcher ends with 143 and the command that resumes. A ``kill -9`` of the launcher (which
it cannot handle) still ends every child, with a checkpoint (the children follow the
launcher's pid). In every case no process the launcher started is left running, and the
run (or the search) resumes to its end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ppokit.io import find_checkpoint, read_metrics


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[19].decode()
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> dict[int, str]:
    """Every live process under ``pid`` (children, grandchildren, ...) with its start time
    (so that a reused pid is not taken for a survivor)."""
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    ppid = int(fh.read().rsplit(b")", 1)[-1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(name))
    out, todo = {}, [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            st = _start_time(child)
            if st is not None:
                out[child] = st
                todo.append(child)
    return out


def wait_gone(procs: dict[int, str], timeout: float = 120.0) -> dict[int, str]:
    """Wait until none of ``procs`` runs; returns those still running at ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        left = {p: st for p, st in procs.items() if _start_time(p) == st}
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.5)


def wait_for(pred, timeout: float, proc: subprocess.Popen, what: str) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"ended (rc {proc.returncode}) before {what}:\n{err[-3000:]}")
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.25)


def launch(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ppokit", *args], cwd=cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def checkpoints(run: Path) -> list[str]:
    d = run / "checkpoints"
    return sorted(p for p in os.listdir(d) if p.startswith("iter_")) if d.is_dir() else []


# ------------------------------------------------------------------ --seeds

# checkpoints only where a run stops (and at the end): each one after a signal proves that
# the seed stopped at an iteration boundary, as asked, rather than at once
SEEDS = ["train", "--seeds", "0-1", "--parallel", "2", "--total-steps", "20480",
         "--num-envs", "1", "--set", "n_steps=2048", "batch_size=256", "n_epochs=2",
         "checkpoint_every=1000", "tensorboard=false", "--eval-episodes", "2",
         "--run-dir", "sd"]


def rows(run: Path) -> int:
    return len(read_metrics(run))


@pytest.mark.slow  # 34 s: two seed processes trained, signalled, resumed
def test_seeds_sigterm_and_kill_9_leave_no_orphan_and_resume(tmp_path):
    """SIGTERM to the --seeds launcher: each seed checkpoints and stops, the launcher ends
    143 naming `ppokit train --resume sd`; that resume, killed -9, ends its seed processes
    too (each with a checkpoint); a last resume finishes both seeds."""
    proc = launch(SEEDS, tmp_path)
    root = tmp_path / "sd"
    wait_for(lambda: all(rows(root / f"s{s}") for s in (0, 1)), 300, proc,
             "both seeds' first iteration")
    kids = descendants(proc.pid)
    assert len([p for p in kids if _start_time(p)]) >= 2
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-3000:]
    assert err.rstrip().split("\n")[-1] == "resume with: ppokit train --resume sd", err
    assert "Traceback" not in err
    assert wait_gone(kids, 5) == {}  # the launcher waited for them
    for s in (0, 1):
        log = (root / f"s{s}.log").read_text()
        assert "stopped by SIGTERM" in log and "written" in log, log[-2000:]
        ckpt = find_checkpoint(root / f"s{s}" / "checkpoints")[0]
        assert ckpt.name == f"iter_{rows(root / f's{s}'):09d}"

    proc = launch(["train", "--resume", "sd"], tmp_path)
    done = {s: len(read_metrics(root / f"s{s}")) for s in (0, 1)}
    wait_for(lambda: all(len(read_metrics(root / f"s{s}")) > done[s] for s in (0, 1)), 300,
             proc, "both seeds resumed")
    kids = descendants(proc.pid)
    proc.kill()
    proc.communicate()
    assert wait_gone(kids, 120) == {}, "seed processes outlived their killed launcher"
    for s in (0, 1):  # stopped at an iteration boundary, with a checkpoint
        assert "stopped by SIGTERM" in (root / f"s{s}.log").read_text().split(
            "resumed from")[-1]
        ckpt = find_checkpoint(root / f"s{s}" / "checkpoints")[0]
        assert ckpt.name == f"iter_{rows(root / f's{s}'):09d}" and int(ckpt.name[5:]) > 1

    proc = launch(["train", "--resume", "sd"], tmp_path)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads((root / "summary.json").read_text())
    assert summary["seeds"] == [0, 1] and summary["failed"] == []
    assert len(summary["eval_mean_returns"]) == 2
    for s in (0, 1):
        assert [r["iteration"] for r in read_metrics(root / f"s{s}")] == list(range(1, 11))


# ------------------------------------------------------------------ llm --nproc

@pytest.mark.slow  # two torchrun launches under signals (~55 s)
def test_nproc_sigterm_and_kill_9_leave_no_rank_running(tmp_path):
    """SIGTERM to `ppokit llm train --nproc 2`: torchrun's launcher (in the launcher's own
    process) forwards it to both ranks, which agree on the iteration, checkpoint and stop;
    143 and the resume command naming --nproc 2. A kill -9 of the resumed launcher ends
    both ranks (they follow its pid) with a checkpoint; the run then resumes to its end."""
    run = tmp_path / "ldp"
    args = ["llm", "train", "--algo", "grpo", "--set", "prompts_per_iter=4", "--set",
            "sft_steps=20", "--set", "max_new_tokens=10", "--set", "checkpoint_every=1000",
            "--no-progress", "--no-eval"]
    proc = launch([*args, "--iterations", "400", "--run-dir", str(run), "--nproc", "2"],
                  tmp_path)
    wait_for(lambda: rows(run) >= 2, 600, proc, "two iterations")
    ranks = descendants(proc.pid)
    assert len(ranks) >= 2
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-3000:]
    assert f"resume with: ppokit llm train --resume {run} --nproc 2" in err, err[-3000:]
    assert wait_gone(ranks, 5) == {}
    stopped_at = rows(run)
    assert checkpoints(run) == [f"iter_{stopped_at:09d}"]

    proc = launch(["llm", "train", "--resume", str(run), "--nproc", "2", "--no-progress",
                   "--no-eval"], tmp_path)
    wait_for(lambda: rows(run) > stopped_at, 600, proc, "the resumed ranks")
    ranks = descendants(proc.pid)
    proc.kill()
    out, err = proc.communicate()  # (ends when the ranks, which hold its pipes, end)
    assert wait_gone(ranks, 120) == {}, "ranks outlived their killed launcher"
    done = rows(run)
    time.sleep(2)
    assert rows(run) == done  # nothing writes the run any more
    assert f"stopped by SIGTERM after iteration {done}; checkpoint" in err, err[-3000:]
    ckpt, damaged = find_checkpoint(run / "checkpoints")
    assert ckpt is not None and not damaged and ckpt.name == f"iter_{done:09d}"

    from ppokit.cli import main

    assert main(["llm", "train", "--resume", str(run), "--iterations", str(done + 1),
                 "--no-progress", "--no-eval"]) == 0
    assert [r["iteration"] for r in read_metrics(run)] == list(range(1, done + 2))


# ------------------------------------------------------------------ tune

SEARCH = """
[search]
learning_rate = {low = 1e-4, high = 1e-2, log = true}
[fixed]
n_envs = 4
n_steps = 64
batch_size = 128
checkpoint_every = 1
tensorboard = false
[tune]
eval_every = 2
eval_episodes = 2
pruner = "none"
sampler = "random"
"""


def _trials(root: Path) -> list[dict]:
    import csv

    with open(root / "trials.csv") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow  # a tuning study stopped and resumed (~25 s)
@pytest.mark.parametrize("how", ["sigterm", "kill"])
def test_tune_stopped_in_a_trial_continues_to_the_full_count(tmp_path, how):
    """B35: a search stopped in trial 2 (SIGTERM: 143 and `ppokit tune --resume DIR`; kill
    -9: the same command again) keeps the trials that finished with their results, runs
    trial 2 again from its checkpoint and ends with all 4 trials complete."""
    (tmp_path / "s.toml").write_text(SEARCH)
    args = ["tune", "--search", "s.toml", "--trials", "4", "--total-steps", "4096",
            "--eval-episodes", "2", "--run-dir", "tk"]
    root = tmp_path / "tk"
    proc = launch(args, tmp_path)
    wait_for(lambda: len(checkpoints(root / "trial_002")) >= 1, 600, proc,
             "trial 2's first checkpoint")
    before = {r["number"]: r for r in _trials(root)}
    assert sorted(before) == ["0", "1"]
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 143, err[-3000:]
        assert err.rstrip().split("\n")[-1] == "resume with: ppokit tune --resume tk", err
        again = ["tune", "--resume", "tk"]
    else:
        proc.kill()
        proc.communicate()
        again = args
    proc = launch(again, tmp_path)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "continuing the search in tk: 2 of 4 trials finished; trial 2 runs again" in out
    rows = _trials(root)
    assert [r["number"] for r in rows] == ["0", "1", "2", "3"]
    assert all(r["state"] == "complete" for r in rows)
    for n in ("0", "1"):  # kept as they were, not run again
        assert rows[int(n)]["value"] == before[n]["value"]
        assert rows[int(n)]["seconds"] == before[n]["seconds"]
    assert [r["iteration"] for r in read_metrics(root / "trial_002")] == list(range(1, 17))
    assert (root / "best.toml").is_file()


# ------------------------------------------------------------------ the mechanism

CHILD = """
import sys, time
from ppokit.supervise import follow_supervisor

try:
    follow_supervisor()
    print("ready", flush=True)
    time.sleep(600)
except SystemExit as exc:  # (not training: a follower whose launcher ended stops at once)
    open(sys.argv[1], "w").write(f"stopped {exc.code}")
    raise
"""

LAUNCHER = """
import os, subprocess, sys, time
from ppokit.supervise import ENV, ChildGroup, supervisor_token

child = [sys.executable, "-c", sys.argv[1], sys.argv[2]]
if sys.argv[3] == "child":  # the launcher's own child: PR_SET_PDEATHSIG
    ChildGroup().start(child)
else:  # a grandchild, under a process that does not follow (as torchrun's ranks would
    # be under an outside launcher): the watchdog on the launcher's pid
    env = {**os.environ, ENV: supervisor_token()}
    middle = [sys.executable, "-c",
              "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(600)",
              *child]
    subprocess.Popen(middle, env=env, start_new_session=True)
print("started", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("where", ["child", "grandchild"])
def test_a_process_ends_when_its_launcher_is_killed(tmp_path, where):
    """kill -9 of a launcher: its child (PR_SET_PDEATHSIG) and a grandchild that follows
    it (the watchdog on its pid) both stop (with 143, as at SIGTERM)."""
    marker = tmp_path / "got"
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, CHILD, str(marker), where],
                            env=_env(), stdout=subprocess.PIPE, text=True)
    kids: list[int] = []
    try:
        assert proc.stdout.readline().strip() == "started"
        end = time.monotonic() + 120
        while len(descendants(proc.pid)) < (2 if where == "grandchild" else 1):
            assert time.monotonic() < end
            time.sleep(0.2)
        time.sleep(3)  # (the follower is set up: imports, then follow_supervisor)
        kids = descendants(proc.pid)
        proc.kill()
        proc.wait()
        end = time.monotonic() + 60
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < end, "the follower never stopped"
            time.sleep(0.2)
        assert marker.read_text() == "stopped 143"
    finally:
        # and the grandchild's middle process (it does not follow the launcher, and in a
        # session of its own it is no descendant of this one once the launcher is gone)
        left = kids if where == "grandchild" else []
        for pid in {*descendants(os.getpid()), *left} - {os.getpid()}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if where == "child":
        assert wait_gone(kids, 30) == {}


def test_a_process_whose_launcher_is_gone_stops_at_once(tmp_path):
    """A follower started after its launcher died (a pid that no longer runs) stops."""
    marker = tmp_path / "got"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    env = {**_env(), "PPOKIT_SUPERVISOR": f"{dead.pid}:1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(marker)], env=env, timeout=120,
                          capture_output=True, text=True)
    assert proc.returncode == 143 and marker.read_text() == "stopped 143", proc.stderr
    assert "ready" not in proc.stdout


def test_repeated_parent_death_signals_are_one_stop():
    """Linux sends the parent-death signal again as each thread of a dying multi-threaded
    launcher ends: while training, the repeats request one graceful stop (a checkpoint at
    the iteration boundary), never the "second signal" that stops at once."""
    from ppokit.io import GracefulStop
    from ppokit.supervise import PARENT_GONE, _parent_gone

    old = signal.signal(PARENT_GONE, _parent_gone)
    try:
        with GracefulStop(lambda m: None) as stop:
            for _ in range(3):
                os.kill(os.getpid(), PARENT_GONE)
            assert stop.signum == signal.SIGTERM
        assert signal.getsignal(PARENT_GONE) is signal.SIG_IGN
        signal.signal(PARENT_GONE, _parent_gone)
        with pytest.raises(SystemExit) as exc:  # not training: stop now
            os.kill(os.getpid(), PARENT_GONE)
        assert exc.value.code == 143
    finally:
        signal.signal(PARENT_GONE, old)


@pytest.mark.slow
def test_ray_seeds_sigterm_stop_with_checkpoints_and_resume(tmp_path):
    """--backend ray: SIGTERM to the driver sets the stop flag; each task's run writes a
    checkpoint and comes back; 143 and the resume command, which finishes both seeds on
    Ray again (each stopped directory sent back to its task)."""
    args = ["train", "--seeds", "0-1", "--backend", "ray", "--parallel", "2",
            "--total-steps", "102400", "--num-envs", "1", "--set", "n_steps=2048",
            "batch_size=256", "n_epochs=2", "checkpoint_every=1000", "tensorboard=false",
            "--eval-episodes", "2", "--run-dir", "rs"]
    proc = launch(args, tmp_path)
    while "as Ray tasks" not in proc.stdout.readline():
        assert proc.poll() is None
    time.sleep(40)  # both tasks training (no file shows it: they run in temporary
    assert proc.poll() is None  # directories of the node)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, err[-3000:]
    assert err.rstrip().split("\n")[-1] == "resume with: ppokit train --resume rs", err
    root = tmp_path / "rs"
    for s in (0, 1):
        assert "stopped by SIGTERM" in (root / f"s{s}.log").read_text()
        ckpt = find_checkpoint(root / f"s{s}" / "checkpoints")[0]
        assert ckpt.name == f"iter_{rows(root / f's{s}'):09d}"
    proc = launch(["train", "--resume", "rs"], tmp_path)
    out, err = proc.communicate(timeout=1800)
    assert proc.returncode == 0, err[-3000:]
    for s in (0, 1):
        assert [r["iteration"] for r in read_metrics(root / f"s{s}")] == list(range(1, 51))
