"""Hostile tools and observations in an agent run (ppokit/llm/agents/): a user's tool runs
in a worker process that is killed when it overruns, its reply is bounded before it is
tokenised and cut with a marker the model reads; an observation longer than the model's
context fails at reset (one line) or truncates the episode at step; whatever the tool or
the environment raises or returns is an error reply or one line, never a crash, a leaked
thread or process, or a multi-gigabyte allocation."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from ppokit.cli import main  # noqa: E402
from ppokit.errors import UserCodeError  # noqa: E402
from ppokit.io import read_metrics  # noqa: E402
from ppokit.llm.agents import CheckedTextEnv, Renderer, ToolSet, play, to_rollout  # noqa: E402
from ppokit.llm.agents.rollout import episode_stats  # noqa: E402
from ppokit.llm.modeling.models import build_char_tokenizer  # noqa: E402

# each module's calc is a tool that misbehaves one way (the compact format calls "calc")
TOOLS = {
    "tool_huge": 'return "9" * 20_000_000',
    "tool_bytes": 'return b"\\xff\\xfe" * 1000',
    "tool_obj": "return Bad()",
    "tool_none": "return None",
    "tool_raise": 'raise RuntimeError("tool exploded")',
    "tool_exit": "raise SystemExit(7)",
    "tool_osexit": "os._exit(3)",
    "tool_hang": "time.sleep(3600)",
    "tool_busy": "x = 0\n    while True:\n        x += 1",
}
TOOL_HEAD = '''import os
import time


class Bad:
    def __str__(self):
        raise RuntimeError("str of tool result exploded")


def calc(expression: str):
    """Calculator."""
    '''

TEXT_ENVS = '''
import gymnasium as gym


class Base(gym.Env):
    metadata = {}
    mode = "ok"

    def reset(self, seed=None, options=None):
        self.t = 0
        if self.mode == "huge_obs":
            return "a" * 5_000_000, {}
        if self.mode == "reset_exit":
            raise SystemExit(4)
        return "say 1:", {}

    def step(self, text):
        self.t += 1
        if self.mode == "step_exit":
            raise SystemExit(5)
        if self.mode == "huge_step_obs":
            return "b" * 5_000_000, 0.0, False, False, {}
        return "ok", 1.0, self.t >= 2, False, {}


for mode in ["ok", "huge_obs", "reset_exit", "step_exit", "huge_step_obs"]:
    gym.register(id=f"B{mode}-v0", entry_point=type("Env_" + mode, (Base,), {"mode": mode}),
                 disable_env_checker=True)
'''

AGENT_RUN = ["--no-progress", "--no-eval", "--iterations", "1", "--set", "prompts_per_iter=2",
             "--set", "samples_per_prompt=2", "--set", "time_limit=0"]
TOOL_RUN = [*AGENT_RUN, "--env", "ppokit/ToolArithmetic-v0", "--set", "sft_steps=1",
            "--set", "tool_format=compact", "--set", "max_turns=3", "--max-new-tokens", "12"]


@pytest.fixture
def fixtures(tmp_path, monkeypatch) -> Path:
    """The hostile tool modules and text environments, importable, in the cwd."""
    for name, body in TOOLS.items():
        (tmp_path / f"{name}.py").write_text(TOOL_HEAD + body + "\n")
    (tmp_path / "textenvs_b.py").write_text(TEXT_ENVS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _tool(name: str):
    import importlib

    return importlib.import_module(name).calc


def _children() -> list[int]:
    """This process's live child processes (from /proc)."""
    me, out = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != b"Z":
            out.append(int(pid))
    return out


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


# ------------------------------------------------------------------ the tool supervisor


def test_every_hostile_tool_result_is_a_bounded_reply(fixtures):
    # 20 MB, bytes, an object whose str() raises, None, raise, SystemExit, os._exit: a
    # bounded reply each
    expected = {
        "tool_huge": ("ok", "9" * 100 + "…[cut: 19999900 chars]"),
        "tool_bytes": ("ok", "\ufffd" * 100 + "…[cut: 1900 bytes]"),
        "tool_obj": ("error", "error: calc returned a Bad whose text cannot be made: "
                              "RuntimeError: str of tool result exploded"),
        "tool_none": ("error", "error: calc returned None"),
        "tool_raise": ("error", "error: calc raised RuntimeError: tool exploded"),
        "tool_exit": ("error", "error: calc raised SystemExit: 7"),
        "tool_osexit": ("error", "error: calc ended its process (exit status 3)"),
    }
    for name, (status, text) in expected.items():
        tools = ToolSet([_tool(name)], fmt="compact", time_limit=5)
        try:
            [reply] = tools.answer(tools.calls("calc:1x2"), limits=100)
            assert reply.status == status and reply.shown().startswith(text), (name, reply)
            assert len(reply.shown()) <= 100 + 40
            assert tools.run("calc", ["3"], limit=100) == (reply.shown(), reply.ok)
        finally:
            tools.close()
    assert _children() == []


@pytest.mark.parametrize("name", ["tool_hang", "tool_busy"])
def test_a_tool_past_its_time_limit_is_killed_with_nothing_left(fixtures, name):
    # a sleeping or spinning tool: each overrun's worker is killed; threads and processes
    # stay put
    tools = ToolSet([_tool(name)], fmt="compact", time_limit=0.2)
    threads = _threads()
    t0 = time.monotonic()
    for _ in range(6):
        replies = tools.answer([("calc", ["1"])] * 3)
        assert [r.status for r in replies] == ["timeout"] * 3
        assert replies[0].shown() == "error: calc took longer than 0.2 s"
        assert len(_children()) <= 2 and _threads() == threads  # at most the pool
    assert time.monotonic() - t0 < 6 * 2 * 0.2 + 20  # the 3 calls of a turn: 2 at a time
    assert _children() == []  # every overrun's worker killed and reaped
    tools.close()
    assert _children() == [] and _threads() == threads


def test_the_cheap_in_process_path_for_ppokits_own_tools():
    from ppokit.llm.agents.env import calc

    tools = ToolSet([calc], fmt="compact")
    assert tools.run("calc", ["6x7"]) == ("42", True)
    assert tools.run("calc", ["6/7"])[0].startswith("error: calc raised ValueError")
    assert _children() == [] and tools._workers is None  # no worker process


TREE_KILL = r'''
import sys, time
from ppokit.llm.agents import ToolSet


def calc(expression: str):
    """Calculator."""
    time.sleep(3600)


tools = ToolSet([calc], fmt="compact", time_limit=600)
print("calling", flush=True)
tools.answer([("calc", ["1"]), ("calc", ["2"])])
'''


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_tool_workers_end_when_the_trainer_is_killed(tmp_path, sig):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-c", TREE_KILL], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "calling"
    workers = []
    for _ in range(200):
        workers = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(p) == proc.pid]
        if len(workers) == 2:
            break
        time.sleep(0.05)
    assert len(workers) == 2
    proc.send_signal(sig)
    proc.wait(timeout=30)
    end = time.monotonic() + 10
    while any(_alive(p) for p in workers) and time.monotonic() < end:
        time.sleep(0.05)
    assert not any(_alive(p) for p in workers)


def _ppid(pid) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False


# ------------------------------------------------------------------ the trainer, end to end


def _error_lines(capsys) -> list[str]:
    """The error lines on stderr (``ppokit ...``), or every line when it holds a
    traceback."""
    err = capsys.readouterr().err
    if "Traceback" in err:
        return err.splitlines()
    return [line for line in err.splitlines() if line.startswith("ppokit ")]


def _metrics(run: Path) -> dict:
    return read_metrics(run)[-1]


@pytest.mark.parametrize("tool", ["tool_obj", "tool_hang", "tool_busy", "tool_bytes",
                                  "tool_exit"])
def test_a_hostile_tool_in_the_warm_start_and_training_is_no_crash(fixtures, capsys, tool):
    # an unprintable result, a sleeping or spinning tool, a reply longer than the context,
    # SystemExit: the warm start's 32 demonstrations call the tool, then training
    threads = threading.active_count()
    rc = main(["llm", "train", *TOOL_RUN, "--set", f"tools={tool}:calc",
               "--set", "tool_time_limit=0.2", "--run-dir", "run"])
    assert rc == 0, capsys.readouterr().err[-2000:]
    assert _children() == [] and threading.active_count() == threads
    assert set(_metrics(fixtures / "run")) >= {"tool/error_frac", "tool/timeout_frac",
                                               "tool/truncated_frac"}


def test_the_tool_metrics_of_played_episodes(fixtures):
    tok = build_char_tokenizer()
    for name, key, limit in (("tool_obj", "tool/error_frac", 10),
                             ("tool_hang", "tool/timeout_frac", 0.2),
                             ("tool_huge", "tool/truncated_frac", 10)):
        tools = ToolSet([_tool(name)], fmt="compact", time_limit=limit)
        envs = [CheckedTextEnv(Echo(1), "echo") for _ in range(4)]
        try:
            eps = play(envs, [0, 1, 2, 3], Renderer(tok), _fixed_turn(tok, "calc:1x2"),
                       max_turns=2, max_new_tokens=8, context=128, tools=tools)
        finally:
            tools.close()
        stats = episode_stats(eps)
        assert stats[key] == 1.0 and stats["tool/calls_per_episode"] == 2.0, (name, stats)
        assert all(len(ep.ids) <= 128 for ep in eps)


def test_a_tool_returning_twenty_megabytes_trains_in_bounded_memory(fixtures):
    # the reply is cut before it is tokenised (a 20 MB reply once took gigabytes)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in [str(fixtures), *sys.path] if p)}
    cmd = [sys.executable, "-m", "ppokit", "llm", "train", *TOOL_RUN,
           "--set", "tools=tool_huge:calc", "--run-dir", "huge"]
    proc = subprocess.run(cmd, env=env, cwd=fixtures, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tool/truncated_frac" in _metrics(fixtures / "huge")
    # the trainer's peak: the 20 MB string lives in the worker, and at most its first
    # (room x 16) characters come back
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert peak_mb < 1500, peak_mb


def test_an_observation_longer_than_the_context_at_reset_fails_in_one_line(fixtures, capsys):
    # said at once, before the observation is tokenised
    t0 = time.monotonic()
    rc = main(["llm", "train", *AGENT_RUN, "--set", "max_turns=3",
               "--env", "textenvs_b:Bhuge_obs-v0", "--run-dir", "t48"])
    err = _error_lines(capsys)
    assert rc == 2 and len(err) == 1, err
    assert "env textenvs_b:Bhuge_obs-v0: reset(seed=" in err[0]
    assert "5,000,000 characters" in err[0] and "context of 512 tokens" in err[0]
    assert time.monotonic() - t0 < 60 and not (fixtures / "t48").exists()


def test_an_observation_longer_than_the_context_at_step_truncates_the_episode(fixtures,
                                                                               capsys):
    # the episode ends there, truncated, counted in env/obs_truncated_frac
    rc = main(["llm", "train", *AGENT_RUN, "--set", "max_turns=3",
               "--env", "textenvs_b:Bhuge_step_obs-v0", "--run-dir", "t49"])
    assert rc == 0, capsys.readouterr().err[-2000:]
    rec = _metrics(fixtures / "t49")
    assert rec["env/obs_truncated_frac"] == 1.0 and rec["episode/truncated_frac"] == 1.0
    assert rec["episode/turns_mean"] == 1.0


@pytest.mark.parametrize("env,said", [("Bstep_exit-v0", "step() raised SystemExit: 5"),
                                      ("Breset_exit-v0", "reset(seed=")])
def test_an_env_raising_system_exit_is_named_in_one_line(fixtures, capsys, env, said):
    # not the env's own exit status: status 2 and a line naming the env
    rc = main(["llm", "train", *AGENT_RUN, "--set", "max_turns=3",
               "--env", f"textenvs_b:{env}", "--run-dir", "t45"])
    err = _error_lines(capsys)
    assert rc == 2 and len(err) == 1, err
    assert f"env textenvs_b:{env}: {said}" in err[0] and "SystemExit" in err[0]


def test_sigterm_during_the_warm_start_is_said(tmp_path):
    # 143, and a line saying what was stopped
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-m", "ppokit", "llm", "train", "--no-progress",
                             "--no-eval", "--iterations", "3", "--set", "sft_steps=100000",
                             "--run-dir", "nb3"], env=env, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    end = time.monotonic() + 120
    while not any(line.startswith("warm start:") for line in lines):
        assert proc.poll() is None and time.monotonic() < end, lines
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    reader.join(10)
    assert any("stopped by SIGTERM during the warm start" in line for line in lines), lines
    assert not (tmp_path / "nb3").exists()


# ------------------------------------------------------------------ episodes in the context


class Echo:
    """Replies with ``n`` characters: what fits, and what does not."""

    def __init__(self, n: int):
        self.n = n

    def reset(self, seed=None, options=None):
        return "go:", {}

    def step(self, text):
        return "x" * self.n + ":", 0.5, False, False, {}


def _play(n: int, context: int = 40, tools=None, turns: int = 4):
    tok = build_char_tokenizer()
    envs = [CheckedTextEnv(Echo(n), "echo") for _ in range(3)]
    eps = play(envs, [0, 1, 2], Renderer(tok), _fixed_turn(tok), max_turns=turns,
               max_new_tokens=4, context=context, tools=tools)
    return eps, tok


def test_a_reply_that_fits_but_leaves_no_turn_ends_the_episode_after_it():
    # prompt "go:" (BOS + 3) + the turn "7" and EOS + a reply of 33 tokens: 39, it fits in
    # 40, and no turn of 4 fits after it
    eps, tok = _play(32)
    for ep in eps:
        assert ep.truncated and not ep.obs_truncated and ep.turns == 1
        assert len(ep.ids) <= 40 and not ep.action[-1]  # the reply is the last token
    # a reply that does not fit at all is not added: the model's turn is the last token
    eps, _ = _play(60)
    for ep in eps:
        assert ep.truncated and ep.obs_truncated and ep.action[-1] and ep.turns == 1


def test_a_cut_episode_bootstraps_after_the_last_token_in_the_sequence():
    from ppokit.core import token_gae_reference
    from ppokit.llm.labelling.labels import compute_labels
    from ppokit.llm.modeling.rollout import shift_to_tokens
    from ppokit.llm.training.config import LLMConfig

    eps, tok = _play(32)
    eps += _play(60)[0]  # the reply in (rows 0-2), the reply left out (rows 3-5)
    batch = to_rollout(eps, tok.pad_token_id)
    r = batch.roll
    cfg = LLMConfig(algo="ppo", samples_per_prompt=3, prompts_per_iter=2, gamma=0.9,
                    gae_lambda=0.8, kl_coef=0.0).resolved()
    values_after = torch.randn(r.input_ids.shape)
    lab = compute_labels(cfg, r, batch.scores, r.logp, r.logp, 0.0, values_after,
                         turn_rewards=batch.turn_rewards)
    last_token = r.last_token_index()
    last_action = r.last_action_index()
    assert (last_token[:3] > last_action[:3]).all() and (last_token[3:] == last_action[3:]).all()
    rows = torch.arange(6)
    rewards = torch.where(r.action_mask, batch.turn_rewards, 0.0)
    values = shift_to_tokens(values_after[:, :-1])

    def adv(at):
        a, _ = token_gae_reference(rewards, values, r.action_mask, 0.9, 0.8,
                                   bootstrap_values=values_after[rows, at])
        return torch.where(r.action_mask, a, 0.0)

    torch.testing.assert_close(lab.advantages, adv(last_token))
    assert not torch.allclose(lab.advantages[:3], adv(last_action)[:3])


def test_a_tool_reply_is_cut_to_its_share_of_the_room_with_a_marker(fixtures):
    tools = ToolSet([_tool("tool_huge")], fmt="compact", time_limit=5)
    try:
        tok = build_char_tokenizer()
        renderer = Renderer(tok)
        from ppokit.llm.agents.bounds import first_episode, tool_replies

        ep = first_episode(CheckedTextEnv(Echo(1), "echo"), renderer, 0, context=200,
                           reserve=8)
        ep.add([5, 6, tok.eos_token_id], action=True)
        room = 200 - len(ep.ids) - 8
        [reply] = tool_replies(tools, {0: (ep, [("calc", ["1"])])}, renderer, context=200,
                               reserve=8)[0]
        n = len(renderer.encode(reply["content"]))
        assert n <= room // 2 and reply["content"].endswith(" chars]")
        assert "…[cut: " in reply["content"] and ep.tool_cut == 1 and ep.tool_calls == 1
    finally:
        tools.close()


# ------------------------------------------------------------------ property


HOSTILE = ("str", "bytes", "obj", "none", "raise", "exit", "hang", "osexit", "int")


def _hostile_tool(kind: str, size: int):
    def calc(expression: str):
        """Calculator."""
        if kind == "str":
            return "z" * size
        if kind == "bytes":
            return b"\xff" * size
        if kind == "obj":
            class Bad:
                def __str__(self):
                    raise ValueError("no")
            return Bad()
        if kind == "none":
            return None
        if kind == "raise":
            raise RuntimeError("r" * size)
        if kind == "exit":
            raise SystemExit(size)
        if kind == "hang":
            time.sleep(3600)
        if kind == "osexit":
            os._exit(size % 256)
        return size

    return calc


class HostileEnv:
    """Observations of every kind an environment must not return, at reset or step."""

    def __init__(self, kind: str, size: int, at_reset: bool):
        self.kind, self.size, self.at_reset = kind, size, at_reset

    def _obs(self):
        k, n = self.kind, self.size
        if k == "raise":
            raise RuntimeError("boom")
        if k == "exit":
            raise SystemExit(3)
        return {"str": "s" * n, "bytes": b"\xff" * n, "obj": object(), "none": None,
                "int": n, "list": [{"role": "user", "content": "c" * n}]}.get(k, "ok")

    def reset(self, seed=None, options=None):
        return (self._obs() if self.at_reset else "go:"), {}

    def step(self, text):
        return self._obs(), 0.0, False, False, {}


def _peak_reset() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # the peak resident size starts again from now (Linux 4.0+)
        return True
    except OSError:
        return False


def _peak_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_property_hostile_tools_and_observations_stay_bounded():
    """Random hostile tool results (up to 50 MB strings or bytes, objects, None,
    exceptions, SystemExit, hangs, os._exit) and observations (up to 50 MB, bytes,
    objects, None, exceptions): each is a bounded reply, a truncated episode or a
    UserCodeError naming the environment. After each: no thread or child process more;
    the episode within the context; the trainer's peak resident memory at most 64 MB
    above its start plus the observation's own string (a tool's result never reaches
    the trainer whole)."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    tok = build_char_tokenizer()
    renderer = Renderer(tok)
    play([CheckedTextEnv(Echo(1), "echo")], [0], renderer, _fixed_turn(tok), max_turns=2,
         max_new_tokens=4, context=64)  # (torch's own threads started)
    threads = _threads()
    can_peak = _peak_reset()
    sizes = st.sampled_from([0, 1, 5000, 1 << 20, 50 << 20])

    @hypothesis.settings(max_examples=12, deadline=None, derandomize=True, database=None)
    @hypothesis.given(kind=st.sampled_from(HOSTILE), size=sizes, limit=st.integers(0, 500))
    @hypothesis.example(kind="str", size=50 << 20, limit=500)
    @hypothesis.example(kind="bytes", size=50 << 20, limit=0)
    @hypothesis.example(kind="raise", size=50 << 20, limit=100)
    @hypothesis.example(kind="hang", size=0, limit=100)
    def tools_case(kind, size, limit):
        tools = ToolSet([_hostile_tool(kind, size)], fmt="compact",
                        time_limit=0.2 if kind == "hang" else 20)
        try:
            base = _peak_mb() if _peak_reset() else 0.0
            [reply] = tools.answer([("calc", ["1"])], limits=limit)
            assert len(reply.body) <= max(limit, 400) and len(reply.shown()) <= limit + 400
            assert reply.ok == (kind in ("str", "bytes", "int"))
            if can_peak:
                assert _peak_mb() - base < 64, (kind, size)
        finally:
            tools.close()
        assert _children() == [] and _threads() == threads

    @hypothesis.settings(max_examples=12, deadline=None, derandomize=True, database=None)
    @hypothesis.given(kind=st.sampled_from(("str", "bytes", "obj", "none", "int", "list",
                                            "raise", "exit")), size=sizes,
                      at_reset=st.booleans())
    @hypothesis.example(kind="str", size=50 << 20, at_reset=True)
    @hypothesis.example(kind="str", size=50 << 20, at_reset=False)
    @hypothesis.example(kind="list", size=50 << 20, at_reset=False)
    def env_case(kind, size, at_reset):
        env = CheckedTextEnv(HostileEnv(kind, size, at_reset), "hostile")
        base = _peak_mb() if _peak_reset() else 0.0
        try:
            eps = play([env], [0], renderer, _fixed_turn(tok), max_turns=2, max_new_tokens=4,
                       context=64)
        except UserCodeError as exc:
            assert str(exc).startswith("env hostile: "), exc
            assert len(str(exc)) < 600
        else:
            assert len(eps[0].ids) <= 64
        if can_peak:
            assert _peak_mb() - base < 64 + 2 * size / 2**20, (kind, size)
        assert _children() == [] and _threads() == threads

    t0 = time.monotonic()
    tools_case()
    env_case()
    assert time.monotonic() - t0 < 60


def _fixed_turn(tok, text: str = "7"):
    """A sampler that always answers ``text`` (its EOS included)."""
    from ppokit.llm.modeling.rollout import TokenRollout

    turn = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    def sample(ids, mask):
        B, W = ids.shape
        new = torch.tensor([turn] * B)
        full = torch.cat([ids, new], 1)
        act = torch.zeros_like(full, dtype=torch.bool)
        act[:, W:] = True
        return TokenRollout(full, torch.cat([mask, torch.ones_like(new)], 1), act, W,
                            torch.zeros(B, dtype=torch.bool), [turn] * B,
                            torch.zeros(full.shape))

    return sample


def test_the_metrics_of_a_batch_count_cut_failed_and_slow_calls():
    from ppokit.llm.agents.conversation import Episode

    a = Episode(0, [], tool_calls=4, tool_failures=3, tool_errors=1, tool_timeouts=1,
                tool_cut=2)
    b = Episode(1, [], obs_truncated=True, truncated=True)
    s = episode_stats([a, b])
    assert s["tool/error_frac"] == 0.25 and s["tool/timeout_frac"] == 0.25
    assert s["tool/truncated_frac"] == 0.5 and s["env/obs_truncated_frac"] == 0.5
    assert episode_stats([b])["tool/error_frac"] == 0.0
    assert json.dumps(s)  # plain numbers for metrics.jsonl
