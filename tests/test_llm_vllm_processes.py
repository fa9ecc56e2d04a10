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


PLUGIN_CHILD = r"""
import os, sys
import ppokit_vllm_plugin
before = os.getpgid(0)
ppokit_vllm_plugin.register()
now = os.getpgid(0)
print(ppokit_vllm_plugin.started_by_trainer(), before == now, now == os.getpid())
"""


def test_the_vllm_plugin_moves_only_the_trainers_direct_child_into_a_group_of_its_own():
    """``ppokit_vllm_plugin.register`` (vLLM runs it in each of its processes): in a
    process the trainer started directly (vLLM's engine core) it makes a process group of
    its own, out of reach of a terminal's Ctrl-C; anywhere else it does nothing."""
    import ppokit_vllm_plugin
    from ppokit.llm.engines.vllm_worker import OWNER_ENV

    assert ppokit_vllm_plugin.OWNER_ENV == OWNER_ENV

    def child(owner):
        env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
        if owner is not None:
            env[OWNER_ENV] = owner
        run = subprocess.run([sys.executable, "-c", PLUGIN_CHILD], text=True, timeout=60,
                             env=dict(env, PYTHONPATH=SRC), capture_output=True)
        return run.stdout.split() or run.stderr

    # this test stands for the trainer: its child moves to a group of its own
    assert child(str(os.getpid())) == ["True", "False", "True"]
    for owner in (None, "", "1", "not-a-pid"):  # not started by the owner: left as it is
        assert child(owner) == ["False", "True", "False"]


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


# an engine's owner that, after a Ctrl-C to its whole process group, still generates
ENGINE_AFTER_CTRL_C = r"""
import signal, sys, time
import torch
from transformers import AutoTokenizer
from ppokit.llm.engines.vllm_engine import VllmEngine

def main():
    got = []
    signal.signal(signal.SIGINT, lambda s, f: got.append(s))
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    engine = VllmEngine(sys.argv[1], precision="fp32", seed=0, tokenizer=tok)
    print("ready", flush=True)
    sys.stdin.readline()  # (the test has sent SIGINT to the group meanwhile)
    time.sleep(3.0)  # vLLM would have shut its engine down by now
    ids = torch.tensor([[tok.bos_token_id or 1, 5, 6, 7]])
    roll = engine.generate(ids, torch.ones_like(ids), max_new_tokens=4,
                           eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                           temperature=1.0)
    print(f"signals {got} generated {int(roll.action_mask.sum())}", flush=True)
    engine.close()

if __name__ == "__main__":
    main()
"""


@needs_vllm
@pytest.mark.slow
def test_vllm_processes_do_not_take_the_terminal_s_sigint(tiny_model, tmp_path):
    """SIGINT to the whole process group (a terminal's Ctrl-C) while vLLM serves: the
    owner receives it, vLLM's processes (in a process group of their own since their
    engine core started: ``ppokit_vllm_plugin``) keep serving, and a generation after it
    succeeds."""
    script = tmp_path / "owner.py"
    script.write_text(ENGINE_AFTER_CTRL_C)
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    log = open(tmp_path / "stderr.txt", "w+")  # (vLLM's log would fill a pipe)
    p = subprocess.Popen([sys.executable, str(script), tiny_model], env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                         start_new_session=True)
    kids = []
    try:
        line = ""
        while line.strip() != "ready" and p.poll() is None:
            line = p.stdout.readline()
        assert p.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
        kids = descendants(p.pid)
        os.killpg(p.pid, signal.SIGINT)
        out, _ = p.communicate("go\n", timeout=300)
        err = (tmp_path / "stderr.txt").read_text()
        assert p.returncode == 0, err[-3000:]
        assert f"signals [{int(signal.SIGINT)}] generated" in out, out + err[-2000:]
        assert wait_gone(kids, 10.0) == []
    finally:
        cleanup(p, kids)
        log.close()


@needs_vllm
@pytest.mark.slow
def test_ctrl_c_reaches_the_trainer_alone_which_writes_its_checkpoint(tiny_model, tmp_path):
    """Ctrl-C, as a terminal sends it: SIGINT to every process of the foreground group.
    vLLM's processes are in a group of their own, so the engine goes on serving; the
    trainer finishes its iteration, writes the checkpoint, shuts vLLM down and ends with
    130; nothing of vLLM is left."""
    rd = str(tmp_path / "run")
    p, kids = train_until_generating(tiny_model, rd)
    try:
        os.killpg(p.pid, signal.SIGINT)
        assert p.wait(timeout=120) == 128 + signal.SIGINT, p.stderr.read()[-3000:]
        err = p.stderr.read()
        assert "received SIGINT" in err and "Traceback" not in err, err[-3000:]
        assert os.listdir(os.path.join(rd, "checkpoints"))
        assert wait_gone(kids, 10.0) == []
    finally:
        cleanup(p, kids)


@needs_vllm
@pytest.mark.slow
def test_sigkill_of_the_trainer_leaves_no_vllm_process(tiny_model, tmp_path):
    """Nor shared memory: the trainer's weight block (and vLLM's own) are removed once
    the processes holding them are gone."""
    shm_before = set(os.listdir("/dev/shm"))
    p, kids = train_until_generating(tiny_model, str(tmp_path / "run"))
    try:
        p.kill()
        p.wait()
        assert wait_gone(kids, 10.0) == []
        end = time.monotonic() + 10.0
        while (left := set(os.listdir("/dev/shm")) - shm_before) and time.monotonic() < end:
            time.sleep(0.2)
        assert not left, left
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
        assert "LoRA rank 4 served as an adapter" in out + err
        rows = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines() if x]
        assert [r["ranks"] for r in rows] == [2, 2]
        assert all(r["engine_probe_abs_max"] <= 0.1 for r in rows)
        assert [k for k in descendants(p.pid) if alive(k)] == []
    finally:
        cleanup(p, descendants(p.pid))
