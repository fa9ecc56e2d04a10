"""No vLLM process outlives the run (ppokit.llm.engines.vllm_worker.watch_owner,
vllm_engine.owned_processes).

Without vLLM: the watch itself, on a chain of plain processes standing for the trainer,
vLLM's engine core and its worker. With vLLM (slow): ``ppokit llm train --rollout-engine
vllm`` on a tiny Llama, stopped by SIGTERM (a checkpoint, status 143, no process of vLLM
left) and killed by SIGKILL (none left after a few seconds)."""

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def descendants(root: int) -> list[int]:
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [root]
    while todo:
        top = todo.pop()
        kids = [p for p, q in parent.items() if q == top]
        out += kids
        todo += kids
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # (a zombie holds nothing)
    except OSError:
        return False


def wait_gone(pids, limit: float) -> list[int]:
    end = time.monotonic() + limit
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < end:
        time.sleep(0.1)
    return left


# the trainer: starts "the engine core", which starts "the worker" with OWNER_ENV set
CHAIN = r"""
import os, subprocess, sys, time
if sys.argv[1] == "owner":
    subprocess.Popen([sys.executable, "-c", sys.argv[2], "core",
                      sys.argv[2]], env=dict(os.environ, PPOKIT_VLLM_OWNER=str(os.getpid())))
elif sys.argv[1] == "core":
    subprocess.Popen([sys.executable, "-c", sys.argv[2], "worker", sys.argv[2]])
else:
    import ppokit.llm.engines.vllm_worker  # noqa: F401 (the watch starts on import)
    print("watching", flush=True)
time.sleep(600)
"""


def test_chain_to_finds_the_owner_among_the_ancestors():
    from ppokit.llm.engines.vllm_worker import chain_to

    assert chain_to(os.getppid()) == [os.getpid()]
    assert chain_to(os.getpid()) is None  # the trainer itself watches nothing
    assert chain_to(10**9) is None


def test_a_worker_kills_its_engine_core_and_itself_once_the_trainer_is_killed():
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    env.pop("PPOKIT_VLLM_OWNER", None)
    owner = subprocess.Popen([sys.executable, "-c", CHAIN, "owner", CHAIN], env=env,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert owner.stdout.readline().strip() == "watching"  # (the worker's, inherited)
        kids = descendants(owner.pid)
        assert len(kids) == 2 and all(alive(p) for p in kids)
        owner.kill()
        owner.wait()
        assert wait_gone(kids, 5.0) == []
    finally:
        for p in descendants(owner.pid) + [owner.pid]:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


# ---------------------------------------------------------------- with vLLM
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (make vllm)")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model, save_policy

    tok = build_char_tokenizer()
    d = str(tmp_path_factory.mktemp("vllm-procs") / "m")
    # vLLM's CPU attention takes heads of 32 dimensions or more
    save_policy(build_tiny_model(tok, hidden=128, heads=2, layers=2, intermediate=256,
                                 max_positions=128, seed=0), tok, d)
    return d


def train_until_generating(model: str, run_dir: str, iterations: int = 2):
    """``ppokit llm train --rollout-engine vllm`` in a session of its own, once it has
    written ``iterations`` iterations; with the pids of its descendants."""
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "ppokit.cli", "llm", "train", "--model", model, "--task",
           "reverse", "--rollout-engine", "vllm", "--algo", "grpo", "--iterations",
           "100000", "--prompts-per-iter", "2", "--samples-per-prompt", "2",
           "--max-new-tokens", "8", "--lora-r", "0", "--time-limit", "0",
           "--checkpoint-every", "100000", "--no-progress", "--no-eval", "--run-dir", run_dir]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    end = time.monotonic() + 400
    while time.monotonic() < end and p.poll() is None:
        if os.path.exists(metrics) and len(open(metrics).read().splitlines()) >= iterations:
            break
        time.sleep(0.5)
    assert p.poll() is None, p.stderr.read()[-3000:]
    kids = descendants(p.pid)
    assert any(open(f"/proc/{k}/comm").read().startswith("VLLM::") for k in kids), kids
    return p, kids


def cleanup(p, kids):
    for pid in kids + [p.pid]:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@needs_vllm
@pytest.mark.slow
def test_sigterm_writes_a_checkpoint_and_leaves_no_vllm_process(tiny_model, tmp_path):
    rd = str(tmp_path / "run")
    p, kids = train_until_generating(tiny_model, rd)
    try:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=120) == 128 + signal.SIGTERM
        assert os.listdir(os.path.join(rd, "checkpoints"))
        assert wait_gone(kids, 5.0) == []
    finally:
        cleanup(p, kids)


@needs_vllm
@pytest.mark.slow
def test_sigkill_of_the_trainer_leaves_no_vllm_process(tiny_model, tmp_path):
    p, kids = train_until_generating(tiny_model, str(tmp_path / "run"))
    try:
        p.kill()
        p.wait()
        assert wait_gone(kids, 10.0) == []
    finally:
        cleanup(p, kids)


@needs_vllm
@pytest.mark.slow
def test_two_ranks_each_sample_with_an_engine_of_their_own(tiny_model, tmp_path):
    """``--nproc 2 --rollout-engine vllm``: each rank starts vLLM (the launcher's variables
    hidden from it), serves its policy's LoRA adapters, passes the probe every iteration;
    the run ends normally and leaves no process of vLLM behind."""
    import json

    rd = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "ppokit.cli", "llm", "train", "--model", tiny_model,
           "--task", "reverse", "--rollout-engine", "vllm", "--algo", "grpo",
           "--iterations", "2", "--prompts-per-iter", "2", "--samples-per-prompt", "2",
           "--max-new-tokens", "8", "--lora-r", "4", "--set", "engine_lora=adapter",
           "--time-limit", "0", "--no-progress",
           "--no-eval", "--nproc", "2", "--run-dir", str(rd)]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
        assert f"run dir: {rd} (2 ranks)" in out
        assert "LoRA rank 4 served as an adapter" in out
        rows = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines() if x]
        assert [r["ranks"] for r in rows] == [2, 2]
        assert all(r["engine_probe_abs_max"] <= 0.1 for r in rows)
        assert [k for k in descendants(p.pid) if alive(k)] == []
    finally:
        cleanup(p, descendants(p.pid))
