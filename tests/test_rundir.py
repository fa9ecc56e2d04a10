"""Run directories you can trust (environment runs): one writer at a time with real
processes, unique default names, signals that checkpoint, refusal without an intact
checkpoint, fallback to an older one, a crash at every step of a checkpoint write, and
hostile run directories (links, FIFOs, manifest paths, edited files)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from _faults import _count_and_crash, _Crash, _snapshot, count_write_steps
from ppokit.algos import Trainer, resolve_config
from ppokit.cli import main
from ppokit.errors import UsageError
from ppokit.io import (
    GracefulStop,
    Interrupted,
    RunLock,
    latest_checkpoint,
    load_checkpoint,
    read_metrics,
    save_checkpoint,
    unique_run_dir,
)

FAST = ["--set", "tensorboard=false", "--eval-episodes", "0", "--no-progress"]


def _env():
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "0"
    return env


def _cli(*args, cwd=None):
    return subprocess.Popen([sys.executable, "-m", "ppokit.cli", *args], env=_env(), cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _train_in_process(run_dir: Path, steps: int = 512, every: int = 1) -> None:
    assert main(["train", "--total-steps", str(steps), "--run-dir", str(run_dir),
                 "--set", f"checkpoint_every={every}", *FAST]) == 0


# ---------------------------------------------------------------- one writer at a time


def test_lock_names_the_holder_and_is_released_with_the_process(tmp_path):
    lock = RunLock(tmp_path, "train")
    with pytest.raises(UsageError, match=f"in use by pid {os.getpid()} \\(train\\)"):
        RunLock(tmp_path, "eval")
    lock.release()
    RunLock(tmp_path, "eval").release()
    # a killed holder leaves no stale lock: the kernel drops it with the process
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; from ppokit.io import "
                             f"RunLock; lk = RunLock({str(tmp_path)!r}); print(1, flush=True); "
                             "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "1"
    with pytest.raises(UsageError, match=f"pid {proc.pid}"):
        RunLock(tmp_path)
    proc.kill()
    proc.wait()
    RunLock(tmp_path).release()


def test_two_trainings_released_together_into_one_run_dir_never_both_proceed(tmp_path):
    rd = tmp_path / "run"
    procs = [_cli("train", "--total-steps", "2048", "--run-dir", str(rd), *FAST)
             for _ in range(3)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2, 2], results
    for rc, err in results:
        if rc == 2:
            # (the holder may not have written its pid yet: "in use by another process")
            assert ("is in use by" in err or "already holds a run" in err), err
            assert "Traceback" not in err
    recs = read_metrics(rd)
    assert [r["iteration"] for r in recs] == list(range(1, 9))  # one run, not a mixture


def test_default_run_dirs_are_unique_even_in_the_same_second(tmp_path):
    procs = [_cli("train", "--total-steps", "512", *FAST, cwd=tmp_path) for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    dirs = sorted((tmp_path / "runs").iterdir())
    assert len(dirs) == 2
    for d in dirs:
        assert [r["iteration"] for r in read_metrics(d)] == [1, 2]
    a = unique_run_dir(tmp_path / "u", "x")
    b = unique_run_dir(tmp_path / "u", "x")
    assert a != b and a.is_dir() and b.is_dir()


def test_resume_while_the_run_is_alive_is_refused_and_the_run_is_intact(tmp_path):
    rd = tmp_path / "run"
    proc = _cli("train", "--total-steps", str(256 * 20_000), "--run-dir", str(rd),
                "--set", "checkpoint_every=20", *FAST)
    deadline = time.time() + 120
    while latest_checkpoint(rd / "checkpoints") is None:
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.01)
    second = [_cli("train", "--resume", str(rd), *FAST[2:]) for _ in range(2)]
    for p in second:
        assert p.wait(timeout=120) == 2
        err = p.stderr.read()
        assert f"in use by pid {proc.pid}" in err and "Traceback" not in err
    assert proc.poll() is None  # the refusals came while it was training (it outlives them:
    # SIGTERM ends it, so its budget only has to be long enough)
    proc.send_signal(signal.SIGTERM)  # then the run itself stops as usual, intact
    assert proc.wait(timeout=120) == 143
    n = len(read_metrics(rd))
    assert [r["iteration"] for r in read_metrics(rd)] == list(range(1, n + 1))
    assert latest_checkpoint(rd / "checkpoints").name == f"iter_{n:09d}"


# ---------------------------------------------------------------- signals


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_finishes_the_iteration_checkpoints_and_says_how_to_resume(tmp_path, sig,
                                                                            code):
    rd = tmp_path / "run"
    total = 256 * 40
    proc = _cli("train", "--total-steps", str(total), "--run-dir", str(rd),
                "--set", "checkpoint_every=25", *FAST)
    deadline = time.time() + 120
    while len(read_metrics(rd)) < 2:
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.01)
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == code
    err = proc.stderr.read()
    assert f"resume with: ppokit train --resume {rd}" in err and "Traceback" not in err
    n = len(read_metrics(rd))
    assert 2 <= n < 40
    assert latest_checkpoint(rd / "checkpoints").name == f"iter_{n:09d}"  # nothing lost
    assert main(["train", "--resume", str(rd), *FAST[2:]]) == 0
    assert [r["iteration"] for r in read_metrics(rd)] == list(range(1, 41))


def test_second_signal_stops_at_once(tmp_path):
    stop = GracefulStop(log=lambda m: None)
    with stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and stop.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_in_process_stop_raises_interrupted_after_a_checkpoint(tmp_path):
    cfg = resolve_config(overrides={"tensorboard": False, "total_timesteps": 256 * 10,
                                    "checkpoint_every": 100})
    tr = Trainer(cfg, tmp_path / "r", log=lambda m: None)
    stop = GracefulStop()
    stop.signum = signal.SIGTERM  # as the handler would set it
    with pytest.raises(Interrupted) as exc:
        tr.train(stop=stop)
    tr.close()
    assert exc.value.exit_code == 143 and exc.value.iteration == 1
    assert exc.value.checkpoint.name == "iter_000000001"


# ---------------------------------------------------------------- refusing and falling back


def test_resume_without_an_intact_checkpoint_refuses_and_changes_nothing(tmp_path, capsys):
    rd = tmp_path / "run"
    _train_in_process(rd, steps=768)
    for ck in (rd / "checkpoints").iterdir():
        data = (ck / "model.safetensors").read_bytes()
        (ck / "model.safetensors").write_bytes(data[:-7])
    before = _snapshot(rd)
    capsys.readouterr()
    assert main(["train", "--resume", str(rd), *FAST[2:]]) == 2
    err = capsys.readouterr().err.strip()
    assert "no intact checkpoint" in err and "model.safetensors" in err
    assert "nothing was changed" in err and len(err.splitlines()) == 1
    assert _snapshot(rd) == before
    # a run stopped before its first checkpoint: said plainly, nothing changed either
    rd2 = tmp_path / "early"
    _train_in_process(rd2, steps=512, every=100)
    for p in (rd2 / "checkpoints").iterdir():
        for f in p.iterdir():
            f.unlink()
        p.rmdir()
    before = _snapshot(rd2)
    assert main(["train", "--resume", str(rd2), *FAST[2:]]) == 2
    assert "no checkpoint yet" in capsys.readouterr().err
    assert _snapshot(rd2) == before


def test_damaged_newest_checkpoint_falls_back_and_is_kept_aside(tmp_path, capsys):
    rd = tmp_path / "run"
    assert main(["train", "--total-steps", str(256 * 4), "--run-dir", str(rd),
                 "--set", "checkpoint_every=2", "--set", "keep_checkpoints=2", *FAST]) == 0
    newest = rd / "checkpoints" / "iter_000000004"
    state = json.loads((newest / "state.json").read_text())
    state["global_step"] = -5  # an edit of state.json: outside nothing any more
    (newest / "state.json").write_text(json.dumps(state))
    reference = read_metrics(rd)
    capsys.readouterr()
    assert main(["train", "--resume", str(rd), *FAST[2:]]) == 0
    err = capsys.readouterr().err
    assert "iter_000000004 is damaged" in err and "resumed from iter_000000002" in err
    assert (rd / "checkpoints" / "damaged-iter_000000004").is_dir()
    got = read_metrics(rd)
    assert [r["iteration"] for r in got] == [1, 2, 3, 4]
    for a, b in zip(got, reference):  # iterations 3-4 again, bit for bit
        assert {k: v for k, v in a.items() if k not in ("sps", "time")} == \
               {k: v for k, v in b.items() if k not in ("sps", "time")}


def test_evaluation_uses_the_checkpoints_config_not_an_edited_config_json(tmp_path, capsys):
    rd = tmp_path / "run"
    _train_in_process(rd)
    assert main(["eval", str(rd), "--episodes", "2"]) == 0
    first = json.loads((rd / "eval.json").read_text())
    cfg = json.loads((rd / "config.json").read_text())
    cfg.update(env_id="Acrobot-v1", net_arch=[3], n_envs=99)
    (rd / "config.json").write_text(json.dumps(cfg))
    assert main(["eval", str(rd), "--episodes", "2"]) == 0
    again = json.loads((rd / "eval.json").read_text())
    assert again["env_id"] == "CartPole-v1" and again["returns"] == first["returns"]


# ---------------------------------------------------------------- crash inside a write


def test_env_run_crashed_at_every_step_of_a_checkpoint_write_resumes(tmp_path, monkeypatch):
    cfg = resolve_config(overrides={"tensorboard": False, "total_timesteps": 256 * 3,
                                    "checkpoint_every": 1, "keep_checkpoints": 1})
    ref = Trainer(cfg, tmp_path / "ref", log=lambda m: None)
    ref.train()
    ref.close()
    want = [{k: v for k, v in r.items() if k not in ("sps", "time")}
            for r in read_metrics(tmp_path / "ref")]
    # how many file-system steps one checkpoint write takes (replacing an older one)
    probe = Trainer(cfg, tmp_path / "probe", log=lambda m: None)
    probe.iterate()
    steps = count_write_steps(monkeypatch, probe.iterate)
    probe.close()
    assert steps >= 8
    for k in range(1, steps + 1):
        rd = tmp_path / f"crash{k}"
        tr = Trainer(cfg, rd, log=lambda m: None)
        tr.iterate()  # checkpoint 1 written normally
        _count_and_crash(monkeypatch, k)
        with pytest.raises(_Crash):
            tr.iterate()  # dies inside checkpoint 2
        monkeypatch.undo()
        tr.metrics.close()
        tr.close()
        again = Trainer(cfg, rd, resume=True, log=lambda m: None)
        assert again.iteration in (1, 2), k
        again.train()
        again.close()
        got = [{k2: v for k2, v in r.items() if k2 not in ("sps", "time")}
               for r in read_metrics(rd)]
        assert got == want, k
        assert not [p for p in (rd / "checkpoints").iterdir() if p.name.startswith(".")]


# ---------------------------------------------------------------- hostile run directories


def _hostile_checkpoint(root: Path, mutate) -> Path:
    ck = save_checkpoint(root, 1, tensors={"model": {"w": torch.arange(3.0)}}, arrays={},
                         state={"config": {}})
    mutate(ck)
    return ck


def _rewrite_manifest(ck: Path, fn) -> None:
    m = json.loads((ck / "manifest.json").read_text())
    fn(m)
    (ck / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("case", ["dotdot", "absolute", "dev_zero_link", "fifo",
                                  "extra_file", "wrong_iteration", "huge_size",
                                  "manifest_link", "not_json", "nested"])
def test_a_hostile_checkpoint_reads_nothing_outside_and_is_refused(tmp_path, case):
    outside = tmp_path / "secret.json"
    outside.write_text('{"x": 1}')
    root = tmp_path / "run" / "checkpoints"

    def mutate(ck: Path):
        if case == "dotdot":
            _rewrite_manifest(ck, lambda m: m["files"].update(
                {"../../secret.json": {"size": 8, "sha256": "0" * 64}}))
        elif case == "absolute":
            _rewrite_manifest(ck, lambda m: m["files"].update(
                {str(outside): {"size": 8, "sha256": "0" * 64}}))
        elif case == "dev_zero_link":
            (ck / "model.safetensors").unlink()
            (ck / "model.safetensors").symlink_to("/dev/zero")
        elif case == "fifo":
            (ck / "model.safetensors").unlink()
            os.mkfifo(ck / "model.safetensors")
        elif case == "extra_file":
            (ck / "evil.json").write_text("{}")
        elif case == "wrong_iteration":
            _rewrite_manifest(ck, lambda m: m.update(iteration=-5))
        elif case == "huge_size":
            _rewrite_manifest(ck, lambda m: m["files"]["model.safetensors"].update(
                size=2**50))
        elif case == "manifest_link":
            (ck / "manifest.json").unlink()
            (ck / "manifest.json").symlink_to(outside)
        elif case == "not_json":
            (ck / "manifest.json").write_bytes(b"\xff\xfe garbage")
        elif case == "nested":
            (ck / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)

    ck = _hostile_checkpoint(root, mutate)
    t0 = time.time()
    assert latest_checkpoint(root) is None
    with pytest.raises(ValueError):
        load_checkpoint(ck)
    assert time.time() - t0 < 5  # no unbounded read, no hang on a FIFO
    assert outside.read_text() == '{"x": 1}'


def test_links_in_a_run_directory_are_replaced_never_written_through(tmp_path, capsys):
    rd = tmp_path / "run"
    _train_in_process(rd)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for name in ("learning_curve.png", "eval.json"):
        (rd / name).unlink(missing_ok=True)
        (rd / name).symlink_to(victim)
    from ppokit.io.plots import plot_learning_curve

    plot_learning_curve(rd)
    assert main(["eval", str(rd), "--episodes", "1"]) == 0
    assert victim.read_text() == "keep me"
    for name in ("learning_curve.png", "eval.json"):
        assert not (rd / name).is_symlink() and (rd / name).stat().st_size > 0
    # metrics.jsonl as a link: resume refuses it instead of appending to the target
    (rd / "metrics.jsonl").unlink()
    (rd / "metrics.jsonl").symlink_to(victim)
    capsys.readouterr()
    assert main(["train", "--resume", str(rd), *FAST[2:]]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert victim.read_text() == "keep me"


def test_metrics_reader_skips_and_reports_garbage_and_refuses_a_fifo(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"iteration": 1}\nnot json\n' + "[" * 50_000 + "\n[1, 2]\n"
                 '{"iteration": 2}\n{"iteration": 3, "glob')
    skipped: list[int] = []
    assert read_metrics(p, skipped) == [{"iteration": 1}, {"iteration": 2}]
    assert skipped == [2, 3, 4, 6]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):
        read_metrics(fifo)


def test_failed_start_leaves_no_directory_behind(tmp_path, capsys):
    rd = tmp_path / "new"
    assert main(["train", "--run-dir", str(rd), "--env", "NoSuchEnv-v9", *FAST]) == 2
    assert not rd.exists()
    # a start that fails after the lock (the environment cannot be built) leaves nothing
    cfg = resolve_config(overrides={"tensorboard": False})
    object.__setattr__(cfg, "env_id", "NoSuchEnv-v9")
    with pytest.raises(Exception):  # noqa: B017 - whatever the env registry raises
        Trainer(cfg, rd, log=lambda m: None)
    assert not rd.exists()
    # ... and the same --run-dir works next time
    _train_in_process(rd)
    assert (rd / "checkpoints").is_dir()
    # a pre-existing directory keeps what it held; only the failed start's files go
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("x")
    with pytest.raises(Exception):  # noqa: B017
        Trainer(cfg, keep, log=lambda m: None)
    assert sorted(p.name for p in keep.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("target", ["file", "unwritable"])
def test_run_dir_that_is_a_file_or_cannot_be_created(tmp_path, capsys, target):
    if target == "file":
        rd = tmp_path / "f"
        rd.write_text("data")
    else:  # sysfs refuses new directories, even to root
        rd = Path("/sys/ppokit-run")
    before = _snapshot(tmp_path)
    assert main(["train", "--run-dir", str(rd), *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert "--run-dir" in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert _snapshot(tmp_path) == before


def test_parent_run_dir_of_seeds_and_searches(tmp_path, capsys):
    """--seeds and ppokit tune share one rule for the directory holding their runs."""
    from ppokit.cli import main
    from ppokit.io.rundir import parent_run_dir

    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="file exists and is not a directory"):
        parent_run_dir(str(tmp_path / "file"), "x", lambda r: None)
    with pytest.raises(UsageError, match="--run-dir: busy; choose another directory"):
        parent_run_dir(str(tmp_path / "new"), "x", lambda r: "busy")
    assert parent_run_dir(str(tmp_path / "new"), "x", lambda r: None).is_dir()
    (tmp_path / "seeds" / "s1").mkdir(parents=True)
    (tmp_path / "seeds" / "s1" / "config.json").write_text("{}")
    assert main(["train", "--seeds", "0-1", "--run-dir", str(tmp_path / "seeds")]) == 2
    assert "s1 already holds a run; choose another directory" in capsys.readouterr().err
