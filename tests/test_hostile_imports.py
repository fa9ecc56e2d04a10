"""The user's code imported in one place, links inside run directories, and the remaining
hostile files: each case ends with status 2 and one line ``ppokit CMD: error: ...`` naming
the flag, module or file and what was expected (no traceback), and nothing outside the run
directory, nor anything already saved, changes.

* Every module of the user's (``--env module:Id`` of both trainers, ``--reward``,
  ``tools=``, ``--import``, ``--env verifiers:NAME``) is found in the current directory,
  and whatever it raises while it is imported or its environment made — ``SystemExit``
  included — is one line naming it.
* A directory ppokit writes into inside a run directory (``tb/``, ``checkpoints/``) or a
  file it reads there (``config.json``, ``tune.json``) that is a symbolic link is refused.
* A study journal Optuna cannot replay, a model's oversized ``config.json``, a truncated
  GGUF file and a mismatch-correction setting without its correction are named.
* A SIGTERM that arrives while the process runs its exit finalizers ends it quietly.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _faults import _snapshot
from ppokit.cli import main

LINK = "is a symbolic link; ppokit does not follow links inside a run directory"
LLM_FAST = ["--no-progress", "--no-eval", "--iterations", "1", "--set", "prompts_per_iter=2",
            "samples_per_prompt=2", "--max-turns", "3"]

MODULES = {
    "importraise.py": 'raise RuntimeError("module boom at import")\n',
    "exitmod.py": "raise SystemExit(3)\n",
    "vf_exit.py": "def load_environment(**kw):\n    raise SystemExit(4)\n",
    # a text environment class registered with Gymnasium that is not a gymnasium.Env
    "plainenvs.py": '''
import gymnasium as gym


class Plain:
    def reset(self, seed=None, options=None):
        return "say 1:", {}

    def step(self, text):
        return "ok", 1.0, True, False, {}


gym.register(id="Plain-v0", entry_point=Plain, disable_env_checker=True)
''',
    # a proper text environment, found in the current directory
    "mytextenv.py": '''
import gymnasium as gym
from gymnasium import spaces


class Say(gym.Env):
    observation_space = spaces.Text(64)
    action_space = spaces.Text(64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return "say 1:", {}

    def step(self, text):
        self.t += 1
        return "ok", float("1" in text), self.t >= 2, False, {}


gym.register(id="MyTextEnv-v0", entry_point=Say, disable_env_checker=True)
''',
}

SEARCH = """
[search]
n_epochs = {low = 1, high = 3}
[fixed]
n_envs = 4
n_steps = 32
batch_size = 64
[tune]
eval_every = 1
eval_episodes = 2
startup_trials = 1
warmup_evals = 1
sampler = "random"
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """An environment run ``r0`` (with TensorBoard), a language-model run ``L0``, a
    finished search ``tunek`` and the saved built-in model ``tiny``."""
    from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model, save_policy

    root = tmp_path_factory.mktemp("imports")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert main(["train", "--no-progress", "--eval-episodes", "0", "--total-steps",
                     "512", "--run-dir", "r0"]) == 0
        assert main(["llm", "train", "--no-progress", "--no-eval", "--iterations", "2",
                     "--set", "sft_steps=5", "--run-dir", "L0"]) == 0
        (root / "s.toml").write_text(SEARCH)
        assert main(["tune", "--search", "s.toml", "--trials", "1", "--total-steps", "256",
                     "--eval-episodes", "2", "--run-dir", "tunek"]) == 0
        tok = build_char_tokenizer()
        save_policy(build_tiny_model(tok), tok, "tiny")
    finally:
        os.chdir(cwd)
    return root


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    """A fresh working directory holding the user's modules (none of them on the module
    search path, none imported yet)."""
    for name, text in MODULES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    for name in MODULES:
        monkeypatch.delitem(sys.modules, name[:-3], raising=False)
    return tmp_path


def one_line(argv: list[str], capsys, *names: str, rc: int = 2) -> str:
    """``ppokit ARGV`` ends with ``rc`` and its last stderr line is its one error line,
    containing every string of ``names``; no traceback. Returns the line."""
    capsys.readouterr()
    got = main(argv)
    err = capsys.readouterr().err
    assert got == rc, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    line = err.rstrip("\n").split("\n")[-1]
    errors = [ln for ln in err.split("\n") if ": error: " in ln]
    assert errors == [line] and line.startswith(f"ppokit {argv[0]}: error: "), err[-3000:]
    for n in names:
        assert n in line, (n, line)
    return line


def copy_run(work: Path, src: str, dst: Path) -> Path:
    shutil.copytree(work / src, dst, symlinks=True)
    return dst


# ------------------------------------------------------------------- the user's modules


def test_n30_llm_env_module_raising_at_import_is_one_line(here, capsys):
    one_line(["llm", "train", *LLM_FAST, "--env", "importraise:Foo-v0", "--run-dir", "v30"],
             capsys, "env", "'importraise'", "RuntimeError: module boom at import")
    assert not (here / "v30").exists()


def test_n31_llm_env_module_raising_system_exit_is_one_line(here, capsys):
    one_line(["llm", "train", *LLM_FAST, "--env", "exitmod:Foo-v0", "--run-dir", "v31"],
             capsys, "env", "'exitmod'", "SystemExit: 3")
    assert not (here / "v31").exists()


@pytest.mark.parametrize("argv, names", [
    (["train", "--no-progress", "--total-steps", "4096", "--env", "exitmod:Foo-v0"],
     ["--env", "'exitmod'", "SystemExit: 3"]),
    (["train", "--no-progress", "--total-steps", "4096", "--import", "exitmod"],
     ["--import", "'exitmod'", "SystemExit: 3"]),
    (["llm", "train", *LLM_FAST[:4], "--reward", "importraise:f", "--prompts", "p.jsonl"],
     ["--reward", "'importraise'", "RuntimeError: module boom at import"]),
    (["llm", "train", *LLM_FAST, "--env", "ppokit/ToolArithmetic-v0", "--set",
      "tools=exitmod:calc"], ["tools", "'exitmod'", "SystemExit: 3"]),
], ids=["train-env", "import", "reward", "tools"])
def test_every_flag_naming_a_module_imports_it_the_same_way(here, capsys, argv, names):
    (here / "p.jsonl").write_text('{"prompt": "12>"}\n' * 4)
    one_line([*argv, "--run-dir", "x"], capsys, *names)
    assert not (here / "x").exists()


def test_n59_llm_env_module_in_the_working_directory(here, capsys):
    assert main(["llm", "train", *LLM_FAST, "--env", "mytextenv:MyTextEnv-v0",
                 "--run-dir", "t59"]) == 0, capsys.readouterr().err[-3000:]
    assert (here / "t59" / "checkpoints").is_dir()


def test_n60_registered_text_env_class_that_is_not_a_gymnasium_env(here, capsys):
    one_line(["llm", "train", *LLM_FAST, "--env", "plainenvs:Plain-v0", "--run-dir", "t60"],
             capsys, "env 'plainenvs:Plain-v0'", "Plain", "does not subclass gymnasium.Env")


def test_v2_verifiers_load_environment_raising_system_exit(here, capsys):
    pytest.importorskip("verifiers")
    one_line(["llm", "train", *LLM_FAST[:4], "--env", "verifiers:vf-exit",
              "--run-dir", "vv2"], capsys, "verifiers:vf-exit", "load_environment",
             "SystemExit: 4")
    assert not (here / "vv2").exists()


# ------------------------------------------------------------ links in a run directory


@pytest.mark.parametrize("src, argv", [
    ("r0", ["train", "--no-progress", "--total-steps", "1024", "--resume"]),
    ("L0", ["llm", "train", "--no-progress", "--no-eval", "--iterations", "3", "--resume"]),
], ids=["env", "llm"])
def test_s11_a_linked_tb_dir_is_refused_and_nothing_is_written_through_it(
        work, tmp_path, monkeypatch, capsys, src, argv):
    monkeypatch.chdir(tmp_path)
    run = copy_run(work, src, tmp_path / "s11")
    shutil.rmtree(run / "tb")
    (tmp_path / "outside_tb").mkdir()
    (run / "tb").symlink_to("../outside_tb")
    before = _snapshot(run)
    one_line([*argv, "s11"], capsys, "s11/tb", LINK)
    assert list((tmp_path / "outside_tb").iterdir()) == []
    assert _snapshot(run) == before


def test_s9_a_linked_config_json_is_said_to_be_a_link(work, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run = copy_run(work, "r0", tmp_path / "s9")
    shutil.copy(run / "config.json", tmp_path / "cfg_outside.json")
    (run / "config.json").unlink()
    (run / "config.json").symlink_to("../cfg_outside.json")
    before = _snapshot(tmp_path)
    one_line(["eval", "s9", "--episodes", "2"], capsys, "s9/config.json", LINK)
    assert _snapshot(tmp_path) == before


def test_s19_a_linked_checkpoints_dir_is_said_to_be_a_link(work, tmp_path, monkeypatch,
                                                           capsys):
    monkeypatch.chdir(tmp_path)
    copy_run(work, "r0", tmp_path / "other")
    run = copy_run(work, "r0", tmp_path / "s19")
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").symlink_to("../other/checkpoints")
    before = _snapshot(tmp_path)
    one_line(["train", "--no-progress", "--resume", "s19", "--total-steps", "1024"], capsys,
             "s19/checkpoints", LINK)
    assert _snapshot(tmp_path) == before


def test_u5_a_linked_tune_json_is_said_to_be_a_link(work, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run = copy_run(work, "tunek", tmp_path / "tu5")
    (run / "tune.json").rename(tmp_path / "tune_outside.json")
    (run / "tune.json").symlink_to("../tune_outside.json")
    before = _snapshot(tmp_path)
    one_line(["tune", "--resume", "tu5"], capsys, "--resume", "tu5/tune.json", LINK)
    assert _snapshot(tmp_path) == before


# ------------------------------------------------------------------ other hostile files


_NOISE = random.Random(8).randbytes(1000)


@pytest.mark.parametrize("keep, added", [
    (False, _NOISE),
    # no newline at all: Optuna reads such a file as an empty journal and appends to it
    (False, _NOISE.replace(b"\n", b"x")),
    (False, b'{"op_code": 4, "worker_id": "x"}\n'),  # a study never created
    (True, b'{"op_code": 99999, "worker_id": "x"}\n'),
    (True, b'not json\n')],
    ids=["u8-random-bytes", "u8b-bytes-without-a-newline", "u8d-no-study", "u8c-unknown-op-code",
         "u8e-a-line-not-json"])
def test_u8_a_study_journal_optuna_cannot_replay(work, tmp_path, monkeypatch, capsys, keep,
                                                 added):
    monkeypatch.chdir(tmp_path)
    run = copy_run(work, "tunek", tmp_path / "tu8")
    journal = run / "study.journal"
    journal.write_bytes((journal.read_bytes() if keep else b"") + added)
    before = _snapshot(tmp_path)
    one_line(["tune", "--resume", "tu8"], capsys, "tu8/study.journal",
             "not a study journal ppokit wrote")
    assert _snapshot(tmp_path) == before


def test_d13_an_oversized_model_config_is_refused_before_it_is_read(work, tmp_path,
                                                                    monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    model = copy_run(work, "tiny", tmp_path / "d13m")
    size = 64 * 2**20
    with open(model / "config.json", "r+b") as fh:  # sparse: no disk used
        fh.truncate(size)
    one_line(["llm", "train", "--no-progress", "--no-eval", "--iterations", "1", "--model",
              "d13m", "--run-dir", "dd13"], capsys, "--model", "d13m/config.json",
             f"{size} bytes", "more than")
    assert not (tmp_path / "dd13").exists()


def _gguf(path: Path) -> int:
    """A small GGUF file (a vocabulary and two float32 tensors); returns its size."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_token_list(["a", "b", "c"] * 500)
    w.add_tensor("token_embd.weight", np.zeros((100, 64), np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones((64,), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.stat().st_size


@pytest.mark.parametrize("cut, says", [(4000, "end inside its header"),
                                       (20000, "its header describes")],
                         ids=["n04-header", "n05-data"])
def test_n04_n05_a_truncated_gguf_is_named_as_truncated(tmp_path, monkeypatch, capsys, cut,
                                                        says):
    from ppokit.llm.modeling.gguf_size import gguf_needed_size

    monkeypatch.chdir(tmp_path)
    full = _gguf(tmp_path / "full.gguf")
    assert gguf_needed_size((tmp_path / "full.gguf").read_bytes()) == full
    (tmp_path / "trunc.gguf").write_bytes((tmp_path / "full.gguf").read_bytes()[:cut])
    one_line(["llm", "train", "--no-progress", "--no-eval", "--iterations", "1", "--model",
              "trunc.gguf", "--run-dir", "g4"], capsys, "--model", "'trunc.gguf'",
             "is truncated", f"{cut} bytes", says)


def test_n26_rollout_is_threshold_without_rollout_is(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    one_line(["llm", "train", "--no-progress", "--no-eval", "--iterations", "1",
              "--rollout-is-threshold", "3", "--run-dir", "d26"], capsys,
             "rollout_is_threshold", "applies only with rollout_is")
    assert not (tmp_path / "d26").exists()


# ------------------------------------------------------------------- signals at the exit


def test_nb1_sigterm_during_the_exit_finalizers_ends_quietly(tmp_path):
    """A SIGTERM delivered inside an atexit callback, after ``main`` returned (torchrun's,
    while a rank finishes): status 143, no traceback of an ignored exception."""
    script = tmp_path / "late_term.py"
    script.write_text("import atexit, os, signal, sys\n"
                      "from ppokit.cli import main\n"
                      "atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))\n"
                      "sys.argv = ['ppokit']\n"
                      "sys.exit(main())\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              p for p in sys.path if p)})
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, \
        proc.stderr[-2000:]


def test_nb1_the_signal_handler_raises_only_while_a_command_runs(monkeypatch):
    from ppokit import supervise

    monkeypatch.setattr(supervise, "ENDING", type(supervise.ENDING)())
    with pytest.raises(SystemExit) as exc:
        supervise.stop_by_signal(signal.SIGTERM)
    assert exc.value.code == 143
    exits = []
    monkeypatch.setattr(supervise.os, "_exit", exits.append)
    supervise.ENDING.set()
    supervise.stop_by_signal(signal.SIGTERM)  # no exception: the process ends at once
    assert exits == [143]


def test_s11_a_linked_wandb_dir_is_refused(tmp_path, monkeypatch, capsys):
    """W&B writes its offline run under RUN_DIR/wandb: a link there is refused before W&B
    starts (W&B itself is replaced by a recorder here)."""
    wandb = pytest.importorskip("wandb")
    inits = []

    class Recorder:
        def log(self, scalars, step):
            pass

        def finish(self):
            pass

    monkeypatch.setattr(wandb, "init", lambda **kw: inits.append(kw) or Recorder())
    monkeypatch.chdir(tmp_path)
    train = ["train", "--total-steps", "512", "--set", "n_envs=4", "--set", "n_steps=64",
             "--set", "tensorboard=false", "--eval-episodes", "0", "--no-progress"]
    assert main([*train, "--track", "wandb", "--run-dir", "w0"]) == 0
    assert (tmp_path / "w0" / "wandb").is_dir() and len(inits) == 1
    shutil.rmtree(tmp_path / "w0" / "wandb")
    (tmp_path / "outside_wandb").mkdir()
    (tmp_path / "w0" / "wandb").symlink_to("../outside_wandb")
    before = _snapshot(tmp_path)
    one_line(["train", "--resume", "w0", "--total-steps", "1024", "--no-progress",
              "--eval-episodes", "0"], capsys, "w0/wandb", LINK)
    assert len(inits) == 1 and _snapshot(tmp_path) == before


def test_a_checkpoint_is_never_written_through_a_linked_directory(tmp_path):
    import numpy as np

    from ppokit.errors import UsageError
    from ppokit.io.checkpoint import save_checkpoint

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "best").symlink_to("elsewhere")
    with pytest.raises(UsageError, match=LINK):
        save_checkpoint(tmp_path / "best", 1, tensors={}, arrays={"a": np.zeros(2)},
                        state={"iteration": 1})
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_u8f_a_journal_line_cut_short_by_a_kill_is_dropped_before_the_next_append(tmp_path):
    from ppokit.commands.tune_study import _check_journal

    journal = tmp_path / "study.journal"
    whole = b'{"op_code": 0, "worker_id": "a"}\n{"op_code": 4, "worker_id": "a"}\n'
    journal.write_bytes(whole + b'{"op_code": 6, "work')
    _check_journal(journal)
    assert journal.read_bytes() == whole
    _check_journal(journal)  # a whole journal is left as it is
    assert journal.read_bytes() == whole
