"""Checkpoints: atomic writes, pickle-free loading, exact resume after SIGKILL, and a run
killed at arbitrary moments (checkpoint writes included) that still completes."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import safetensors.torch
import torch

from ppokit.algos import Trainer, resolve_config
from ppokit.errors import UsageError
from ppokit.io import (
    WALL_CLOCK_FIELDS,
    latest_checkpoint,
    load_checkpoint,
    optimizer_from_flat,
    optimizer_to_flat,
    read_metrics,
    save_checkpoint,
)

ITERS = 20  # CartPole preset: 256 steps per iteration
ARGS = ["--total-steps", str(256 * ITERS), "--set", "tensorboard=false", "--eval-episodes",
        "0", "--no-progress", "--seed", "3"]


def _cmd(*extra):
    return [sys.executable, "-m", "ppokit.cli", "train", *ARGS, *extra]


def _env():
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "0"
    return env


def _strip(recs):
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_FIELDS} for r in recs]


def _run(*cmd):
    subprocess.run(list(cmd), check=True, env=_env(), capture_output=True, timeout=300)


def _reference(tmp_path):
    # in-process (same code, one thread, same seed) to save a interpreter start
    cfg = resolve_config(overrides={"tensorboard": False, "checkpoint_every": 100, "seed": 3,
                                    "total_timesteps": 256 * ITERS})
    tr = Trainer(cfg, tmp_path / "ref", log=lambda m: None)
    tr.train()
    tr.close()
    recs = _strip(read_metrics(tmp_path / "ref"))
    assert len(recs) == ITERS
    return recs


def test_resume_after_sigkill_is_exact_and_kill_at_any_moment_completes(tmp_path):
    ref = _reference(tmp_path)

    # 1. SIGKILL right after the checkpoint of iteration 8, then --resume.
    run = tmp_path / "killed"
    proc = subprocess.Popen(_cmd("--run-dir", str(run), "--set", "checkpoint_every=8"),
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (run / "checkpoints" / "iter_000000008").exists():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(read_metrics(run)) < ITERS
    out = subprocess.run([sys.executable, "-m", "ppokit.cli", "train", "--resume", str(run),
                          "--eval-episodes", "0", "--no-progress"], env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "environment state restored" in out.stderr
    got = _strip(read_metrics(run))
    assert got == ref  # every later line equals the uninterrupted run's

    # 2. Checkpoint every iteration and kill just after a metrics line lands, i.e. while
    #    that iteration's checkpoint is being written (or just before/after), resuming
    #    after each kill; the run must complete with a readable metrics.jsonl equal to
    #    the uninterrupted run's.
    run2 = tmp_path / "chaos"
    for k, (lines, delay) in enumerate(((3, 0.0), (9, 0.004), (14, 0.012))):
        cmd = (_cmd("--run-dir", str(run2), "--set", "checkpoint_every=1") if k == 0 else
               [sys.executable, "-m", "ppokit.cli", "train", "--resume", str(run2),
                "--eval-episodes", "0", "--no-progress"])
        proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while len(read_metrics(run2)) < lines:
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.001)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert len(read_metrics(run2)) < ITERS  # readable, and really interrupted
    out = subprocess.run([sys.executable, "-m", "ppokit.cli", "train", "--resume", str(run2),
                          "--eval-episodes", "0", "--no-progress"], env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert _strip(read_metrics(run2)) == ref
    leftovers = [p.name for p in (run2 / "checkpoints").iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_latest_checkpoint_skips_partial_and_corrupt_writes(tmp_path):
    root = tmp_path / "checkpoints"
    good = save_checkpoint(root, 3, tensors={"model": {"w": torch.arange(4.0)}},
                           arrays={}, state={"x": 1})
    # a newer checkpoint whose weights file was cut short (e.g. a torn copy)
    bad = save_checkpoint(root, 4, tensors={"model": {"w": torch.arange(4.0)}},
                          arrays={}, state={"x": 2})
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    # an interrupted write: temp dir with a lone file, no state.json
    tmp = root / ".tmp-iter_000000005-999"
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(b"partial")
    assert latest_checkpoint(root) == good
    tensors, _, state = load_checkpoint(good)
    assert state["x"] == 1 and state["iteration"] == 3
    assert torch.equal(tensors["model"]["w"], torch.arange(4.0))
    latest_checkpoint(root, cleanup=True)
    assert not tmp.exists()


def test_keep_only_the_newest_checkpoints(tmp_path):
    root = tmp_path / "c"
    for i in range(1, 6):
        save_checkpoint(root, i, tensors={"m": {"w": torch.zeros(1)}}, arrays={}, state={},
                        keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["iter_000000004", "iter_000000005"]


def test_optimizer_state_round_trips_without_pickle():
    p = torch.nn.Parameter(torch.randn(5))
    opt = torch.optim.Adam([p], lr=1e-3, betas=(0.8, 0.9))
    for _ in range(3):
        opt.zero_grad()
        (p**2).sum().backward()
        opt.step()
    tensors, meta = optimizer_to_flat(opt.state_dict())
    tensors = safetensors.torch.load(safetensors.torch.save(tensors))  # as on disk
    p2 = torch.nn.Parameter(p.detach().clone())
    opt2 = torch.optim.Adam([p2], lr=5.0)
    opt2.load_state_dict(optimizer_from_flat(tensors, json.loads(json.dumps(meta))))
    assert opt2.param_groups[0]["betas"] == (0.8, 0.9)
    for o, q in ((opt, p), (opt2, p2)):
        o.zero_grad()
        (q**2).sum().backward()
        o.step()
    assert torch.equal(p, p2)


def test_metrics_reader_skips_a_partial_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iteration": 1, "global_step": 8}\n{"iteration": 2, "glob')
    assert read_metrics(path) == [{"iteration": 1, "global_step": 8}]


def test_in_process_resume_is_exact_with_normalisers_on_a_sync_env(tmp_path):
    """Pendulum through SyncVectorEnv (SAME_STEP) with observation normalisation and reward
    scaling: resuming from the checkpoint of iteration 3 reproduces iterations 4-6."""
    over = dict(env_id="Pendulum-v1", n_envs=2, n_steps=64, batch_size=32, n_epochs=2,
                total_timesteps=128 * 6, tensorboard=False, checkpoint_every=3, seed=11)
    cfg = resolve_config(overrides=over)
    full = Trainer(cfg, tmp_path / "full", log=lambda m: None)
    full.train()
    full.close()
    part = Trainer(cfg, tmp_path / "part", log=lambda m: None)
    for _ in range(4):  # one iteration past the checkpoint, then "crash"
        part.iterate()
    part.metrics.close()
    part.close()
    msgs = []
    resumed = Trainer(cfg, tmp_path / "part", resume=True, log=msgs.append)
    assert resumed.iteration == 3 and "environment state restored" in msgs[0]
    resumed.train()
    resumed.close()
    assert _strip(read_metrics(tmp_path / "part")) == _strip(read_metrics(tmp_path / "full"))
    with pytest.raises(UsageError, match="already holds a run"):
        Trainer(cfg, tmp_path / "part", log=lambda m: None)  # a fresh start would mix runs


def test_masked_run_resumes_exactly_after_sigkill(tmp_path):
    """An env that gives action masks in its infos (ppokit/MaskedChoice-v0): killed with
    SIGKILL after a checkpoint and resumed, the run's metrics equal the uninterrupted run's
    (the current observation's mask is part of the checkpoint, the env's state too)."""
    iters, kw = 24, '{"masks": "info"}'
    over = dict(env_id="ppokit/MaskedChoice-v0", env_kwargs={"masks": "info"}, n_envs=8,
                n_steps=32, total_timesteps=256 * iters, tensorboard=False,
                checkpoint_every=100, seed=4)
    ref = Trainer(resolve_config(overrides=over), tmp_path / "ref", log=lambda m: None)
    ref.train()
    ref.close()
    want = _strip(read_metrics(tmp_path / "ref"))
    assert len(want) == iters and want[-1]["episode_return_mean"] > want[0][
        "episode_return_mean"]
    run = tmp_path / "killed"
    cmd = [sys.executable, "-m", "ppokit.cli", "train", "--env", "ppokit/MaskedChoice-v0",
           "--env-kwargs", kw, "--num-envs", "8", "--set", "n_steps=32", "--total-steps",
           str(256 * iters), "--seed", "4", "--set", "tensorboard=false", "--eval-episodes",
           "0", "--no-progress", "--run-dir", str(run), "--set", "checkpoint_every=5"]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (run / "checkpoints" / "iter_000000005").exists():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(read_metrics(run)) < iters
    out = subprocess.run([sys.executable, "-m", "ppokit.cli", "train", "--resume", str(run),
                          "--eval-episodes", "0", "--no-progress"], env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "environment state restored" in out.stderr
    assert _strip(read_metrics(run)) == want


_MA_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import ppokit
from _ma_envs import {make}
ppokit.train({make}, run_dir={run!r}, resume={resume}, **{kw!r})
"""


@pytest.mark.parametrize("central", [False, True], ids=["shared", "centralised-critic"])
def test_multiagent_run_resumes_exactly_after_sigkill(tmp_path, central):
    """A PettingZoo ParallelEnv (two agents, one finishing early; action masks in its
    infos) trained as agent rows: killed with SIGKILL after a checkpoint and resumed, the
    run's metrics equal the uninterrupted run's (the rows' and the envs' state restored).
    ``central``: with a centralised critic, which reads the env's global state (the
    collector's current state is part of the checkpoint)."""
    import _ma_envs
    import ppokit

    make = "make_state_pair_masked" if central else "make_pair_masked"
    iters = 20
    kw = dict(total_steps=64 * iters, n_envs=4, n_steps=16, seed=6, tensorboard=False,
              agent_id=True, eval_episodes=1, progress=False, centralised_critic=central)
    ppokit.train(getattr(_ma_envs, make), run_dir=tmp_path / "ref", checkpoint_every=100,
                 **kw)
    want = _strip(read_metrics(tmp_path / "ref"))
    assert len(want) == iters
    run = tmp_path / "killed"
    tests = os.path.dirname(os.path.abspath(__file__))

    def script(resume, **more):
        text = _MA_SCRIPT.format(tests=tests, run=str(run), resume=resume, make=make,
                                 kw={} if resume else {**kw, **more})
        return [sys.executable, "-c", text]

    proc = subprocess.Popen(script(False, checkpoint_every=5), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (run / "checkpoints" / "iter_000000005").exists():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(read_metrics(run)) < iters
    out = subprocess.run(script(True), env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "environment state restored" in out.stderr + out.stdout
    assert _strip(read_metrics(run)) == want
