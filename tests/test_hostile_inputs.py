"""Hostile inputs and faults, tried as users and operators would: every one ends with one
line and a status that says what happened, and nothing already saved changes.

* Bad input (a flag, a file, the user's own environment, reward function or chat
  template) ends with status 2 and one line ``ppokit CMD: error: ...`` naming the flag,
  file, environment or function, the call, and what was expected; no traceback (it is
  behind ``--debug``). From Python it is a :class:`ppokit.errors.UsageError`.
* A fault of the machine (a full disk, a file-size limit) ends with status 74 and one
  line naming the path; the checkpoints written before are intact and the run resumes.
* A run that fails before its first checkpoint leaves nothing behind; one that fails later
  keeps its checkpoints and names the command that resumes.

Each command case runs ``ppokit.cli.main`` in a scratch directory that holds an
environment run, a language-model run, saved models and data files, and checks that
every file there is byte-identical afterwards (a case that trains may add its own run
directory, nothing else).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import _hostile
from _faults import _snapshot
from ppokit.cli import main
from ppokit.errors import UsageError
from ppokit.io import find_checkpoint, read_metrics

PROMPTS_RUN = ["--no-progress", "--no-eval", "--iterations", "2"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The scratch directory: bad environments and rewards, data files, an environment
    run ``r0``, a language-model run ``L0``, the tiny model ``tiny`` (and copies without
    a tokenizer, with pickled weights, with a chat template that refuses a role)."""
    import torch
    from safetensors.torch import load_file

    from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model, save_policy

    root = tmp_path_factory.mktemp("hostile")
    _hostile.write_modules(root)
    _hostile.write_toml(root)
    _hostile.write_data(root)
    (root / "exitmod.py").write_text("raise SystemExit(3)\n")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert main(["train", "--no-progress", "--eval-episodes", "0", "--total-steps",
                     "512", "--run-dir", "r0", "--set", "tensorboard=false"]) == 0
        tok = build_char_tokenizer()
        model = build_tiny_model(tok)
        save_policy(model, tok, "tiny")
        tok.chat_template = _hostile.CHAT_TEMPLATE
        save_policy(model, tok, "chatmodel")
        shutil.copytree("tiny", "notok")
        for name in os.listdir("notok"):
            if "token" in name:
                os.remove(os.path.join("notok", name))
        shutil.copytree("tiny", "binmodel")
        state = load_file("binmodel/model.safetensors")
        os.remove("binmodel/model.safetensors")
        torch.save(state, "binmodel/pytorch_model.bin")
        assert main(["llm", "train", *PROMPTS_RUN, "--model", "tiny", "--prompts",
                     "p_ok.jsonl", "--reward", "rewards:good", "--run-dir", "L0"]) == 0
    finally:
        os.chdir(cwd)
    return root


@pytest.fixture
def inside(work, monkeypatch):
    """Run in the scratch directory, with the user's reward module imported afresh (its
    call counter starts at 0)."""
    monkeypatch.chdir(work)
    sys.modules.pop("rewards", None)
    return work


def _state(root: Path, skip: set[str]) -> dict:
    return {k: v for k, v in _snapshot(root).items()
            if k.split("/")[0] not in skip and "__pycache__" not in k}


def run_case(argv: list[str], root: Path, capsys, *, rc: int = 2, names=(),
             creates: set[str] = frozenset()) -> list[str]:
    """``ppokit ARGV`` in ``root``: status ``rc``; when it fails, its last stderr line is
    its one error line (``ppokit CMD: error: ...``, containing every string of ``names``),
    no traceback; every file in ``root`` unchanged except under ``creates``. Returns the
    stderr lines."""
    before = _state(root, set(creates))
    capsys.readouterr()
    got = main(argv)
    err = capsys.readouterr().err
    lines = err.rstrip("\n").split("\n") if err.strip() else []
    assert got == rc, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    if rc != 0:
        cmd = argv[0]
        errors = [ln for ln in lines if ln.startswith(f"ppokit {cmd}: error: ")]
        assert len(errors) == 1 and lines[-1] == errors[0], err[-3000:]
        for n in names:
            assert n in errors[0], (n, errors[0])
    assert _state(root, set(creates)) == before, "files changed"
    return lines


ENV = ["train", "--no-progress", "--eval-episodes", "0", "--total-steps", "256",
       "--num-envs", "2", "--set", "n_steps=64", "batch_size=64", "tensorboard=false",
       "--env"]

def _llm(case: str, model: str, prompts: str, reward: str, *names: str) -> tuple:
    """A case of ``ppokit llm train --model MODEL --prompts PROMPTS --reward
    rewards:REWARD`` (the run directory must never appear)."""
    return (case, ["llm", "train", *PROMPTS_RUN, "--model", model, "--prompts", prompts,
                   "--reward", f"rewards:{reward}", "--run-dir", "llm_run"], list(names))


def _data(case: str, cmd: str, path: str, *names: str) -> tuple:
    """A case of ``ppokit llm sft|rm|dpo --data PATH`` (the line names --data too)."""
    more = {"sft": ["--steps", "2"], "rm": ["--epochs", "1"], "dpo": ["--epochs", "1"]}[cmd]
    return (f"{case} llm {cmd} --data {path}",
            ["llm", cmd, "--data", path, "--out", f"out_{cmd}", *more], ["--data", *names])


# (id, argv, names the error line must contain)
REFUSED = [
    ("A46 env module raises SystemExit at import",
     ENV[:-1] + ["--env", "exitmod:Foo-v0", "--run-dir", "x46"], ["--env", "exitmod",
                                                                     "SystemExit"]),
    ("A61 5000-deep TOML --config",
     ["train", "--config", "toml/deep.toml", "--run-dir", "y14"], ["--config", "nested"]),
    ("A63 --config /dev/zero", ["train", "--config", "/dev/zero", "--run-dir", "y16"],
     ["--config", "not a regular file"]),
    ("A73 eval --episodes 10**12", ["eval", "r0", "--episodes", "1000000000000"],
     ["--episodes", "1000000"]),
    ("A79 check --seed -1", ["check", "--seed", "-1", "--no-labels"], ["--seed"]),
    ("A80 check --samples 10**9", ["check", "--samples", "1000000000", "--no-labels"],
     ["--samples", "1000000"]),
    ("A98 eval --seed 10**29", ["eval", "r0", "--seed", str(10**29)],
     ["--seed", str(10**29)]),
    ("A99 check --seed 10**29", ["check", "--seed", str(10**29), "--no-labels"],
     ["--seed"]),
    ("eval --seed 2**64", ["eval", "r0", "--seed", str(2**64)], ["--seed", str(2**64)]),
    ("eval of a directory that is not a run", ["eval", "toml"],
     ["RUN_DIR", "not a run directory"]),
    ("A118 tune --search 5000-deep TOML",
     ["tune", "--trials", "1", "--total-steps", "512", "--search", "toml/deep.toml",
      "--run-dir", "t18"], ["--search", "nested"]),
    ("A149 llm train --config 5000-deep TOML",
     ["llm", "train", *PROMPTS_RUN, "--config", "toml/deep.toml", "--run-dir", "l30"],
     ["--config", "nested"]),
    ("A170 env returns NaN observations", ENV + ["badenvs:BadNan-v0", "--run-dir", "e1"],
     ["env 'badenvs:BadNan-v0'", "reset()", "NaN", "expected finite values"]),
    ("A171 env returns inf observations", ENV + ["badenvs:BadInf-v0", "--run-dir", "e2"],
     ["env 'badenvs:BadInf-v0'", "reset()", "infinite"]),
    ("A172 env returns wrong-shape observations",
     ENV + ["badenvs:BadShape-v0", "--run-dir", "e3"],
     ["env 'badenvs:BadShape-v0'", "shape (7,)", "expected (4,)"]),
    ("env returns observations outside its space",
     ENV + ["badenvs:BadOutside-v0", "--run-dir", "e4"],
     ["env 'badenvs:BadOutside-v0'", "outside the observation space", "bounds [-10, 10]"]),
    ("A174 env returns string observations",
     ENV + ["badenvs:BadDtype-v0", "--run-dir", "e5"],
     ["env 'badenvs:BadDtype-v0'", "dtype <U1", "expected numbers"]),
    ("A176 env raises in reset", ENV + ["badenvs:BadRaiseReset-v0", "--run-dir", "e7"],
     ["env 'badenvs:BadRaiseReset-v0'", "reset() raised RuntimeError: boom in reset"]),
    ("A177 env reward is a string", ENV + ["badenvs:BadStrreward-v0", "--run-dir", "e8"],
     ["env 'badenvs:BadStrreward-v0'", "step() (step 1", "reward 'one'",
      "expected a finite real number", "e8 was removed"]),
    ("A184 env reward NaN in iteration 1: the run directory is removed",
     ENV + ["badenvs:BadNanReward-v0", "--run-dir", "e9"],
     ["reward nan", "no checkpoint had been written, so e9 was removed"]),
    ("A254 train --resume of a language-model run", ["train", "--resume", "L0"],
     ["--resume", "language-model run", "ppokit llm train --resume L0"]),
    ("A255 llm train --resume of an environment run", ["llm", "train", "--resume", "r0"],
     ["environment run", "ppokit train --resume r0"]),
    ("C08 report through a linked metrics.jsonl", ["report", "c08"],
     ["c08/metrics.jsonl", "symbolic link"]),
    ("C08 plot through a linked metrics.jsonl", ["plot", "c08"], ["symbolic link"]),
    ("C08 resume through a linked metrics.jsonl", ["train", "--resume", "c08"],
     ["symbolic link"]),
    ("C29 report of an oversized metrics.jsonl", ["report", "c29"],
     ["c29/metrics.jsonl", "more than"]),
    ("C29 plot of an oversized metrics.jsonl", ["plot", "c29"], ["more than"]),
    _llm("A145 chat template raises on a role", "chatmodel", "p_badrole.jsonl", "good",
         "chat template raised", "Unknown role: hacker", "row 0"),
    _llm("A148 prompts longer than the model's context", "tiny", "p_big.jsonl", "good",
         "prompts: row 0", "300000 characters", "64 positions"),
    _llm("A153 reward raises RuntimeError", "tiny", "p_ok.jsonl", "raises",
         "reward function 'raises'", "the check before training",
         "RuntimeError: reward exploded"),
    _llm("A154 reward raises ValueError", "tiny", "p_ok.jsonl", "raises_value",
         "reward function 'raises_value'", "ValueError: reward value error"),
    _llm("A155 reward raises KeyError", "tiny", "p_ok.jsonl", "raises_key",
         "reward function 'raises_key'", "KeyError: 'nonexistent_column'"),
    _llm("A162 reward 1e300 (beyond float32)", "tiny", "p_ok.jsonl", "huge",
         "reward function 'huge'", "1e+300", "float32"),
    _llm("reward returns one value for two completions", "tiny", "p_ok.jsonl",
         "wrong_count", "reward function 'wrong_count'", "returned 1 values, expected 2"),
    _llm("model directory saved without its tokenizer", "notok", "p_ok.jsonl", "good",
         "--model", "'notok'", "no tokenizer"),
    _llm("model directory with pickled weights only", "binmodel", "p_ok.jsonl", "good",
         "--model", "pytorch_model.bin", "safetensors"),
    _data("A223", "sft", "nofile.jsonl", "no such file"),
    _data("A224", "sft", "sft_badline.jsonl", "sft_badline.jsonl:1", "a JSON int",
          "prompt, completion"),
    _data("A225", "sft", "sft_badjson.jsonl", "sft_badjson.jsonl:1", "not valid JSON"),
    _data("A226", "sft", "sft_bytes.jsonl", "not UTF-8"),
    _data("A229", "rm", "pairs_bytes.jsonl", "not UTF-8"),
    _data("A230", "rm", "pairs_num.jsonl", "pairs_num.jsonl:1", "a JSON int"),
    _data("deep-pairs", "rm", "pairs_deep.jsonl", "pairs_deep.jsonl:1", "nested too deeply"),
    _data("zero-pairs", "dpo", "/dev/zero", "not a regular file"),
]


@pytest.fixture(scope="module")
def planted(work) -> Path:
    """Run directories whose metrics.jsonl is a link out of them (c08) or too large to
    read (c29: a sparse file), and a victim file the link points to."""
    (work / "victim.txt").write_text("not ppokit's\n")
    for name in ("c08", "c29"):
        if not (work / name).exists():
            shutil.copytree(work / "r0", work / name)
    (work / "c08" / "metrics.jsonl").unlink()
    (work / "c08" / "metrics.jsonl").symlink_to("../victim.txt")
    with open(work / "c29" / "metrics.jsonl", "r+b") as fh:
        fh.truncate(600 * 2**20)
    return work


@pytest.mark.parametrize("case, argv, names", REFUSED, ids=[c[0].split()[0] + "-" + str(i)
                                                            for i, c in enumerate(REFUSED)])
def test_refused_in_one_line_and_nothing_saved_changes(case, argv, names, planted, inside,
                                                        capsys):
    run_case(argv, inside, capsys, rc=2, names=names)
    assert (inside / "victim.txt").read_text() == "not ppokit's\n"


def test_a_fifo_config_is_refused_at_once(inside, capsys):
    os.mkfifo(inside / "cfg.fifo")
    try:
        run_case(["train", "--config", "cfg.fifo"], inside, capsys,
                 names=["--config", "not a regular file"])
    finally:
        (inside / "cfg.fifo").unlink()


def test_eval_of_a_run_whose_config_is_a_list(inside, capsys, tmp_path):
    bad = inside / "rlist"
    shutil.copytree(inside / "r0", bad)
    (bad / "config.json").write_text("[1, 2]\n")
    try:
        run_case(["eval", "rlist"], inside, capsys,
                 names=["RUN_DIR", "rlist/config.json", "a JSON list"])
    finally:
        shutil.rmtree(bad)


def test_debug_shows_the_users_traceback(inside, capsys, monkeypatch):
    """Behind --debug (or PPOKIT_DEBUG=1) the user's own traceback comes first, then the
    same one line."""
    monkeypatch.delenv("PPOKIT_DEBUG", raising=False)
    assert main(["--debug", *ENV, "badenvs:BadRaiseReset-v0", "--run-dir", "e7d"]) == 2
    assert "PPOKIT_DEBUG" not in os.environ
    err = capsys.readouterr().err
    assert "Traceback" in err and 'raise RuntimeError("boom in reset")' in err
    assert err.rstrip().split("\n")[-1].startswith("ppokit train: error: env 'badenvs:")
    assert not (inside / "e7d").exists()


def test_env_raising_mid_run_keeps_its_checkpoint(inside, capsys):
    """A175b: the env raises in step() after the first checkpoint: one line naming the env,
    the call and the step; the checkpoint stays and the line says how to resume."""
    lines = run_case(["train", "--no-progress", "--eval-episodes", "0", "--total-steps",
                      "1024", "--num-envs", "2", "--set", "n_steps=64", "batch_size=64",
                      "vectorization=sync", "checkpoint_every=1", "tensorboard=false",
                      "--env", "badenvs:BadRaiseLate-v0", "--run-dir", "e6b"],
                     inside, capsys, names=["env 'badenvs:BadRaiseLate-v0'",
                                            "raised RuntimeError: boom in step",
                                            "checkpoint iter_000000001 in e6b is intact",
                                            "ppokit train --resume e6b --env "
                                            "badenvs:BadRaiseLate-v0"],
                     creates={"e6b"})
    assert "step() (step 101 of this copy)" in lines[-1]
    ckpt, damaged = find_checkpoint(inside / "e6b" / "checkpoints")
    assert ckpt.name == "iter_000000001" and not damaged
    shutil.rmtree(inside / "e6b")


def test_a_run_failed_before_its_checkpoint_leaves_its_name_free(inside, capsys):
    """A184: after a failure in iteration 1 the same --run-dir starts a run again."""
    argv = ENV + ["badenvs:BadNanReward-v0", "--run-dir", "e9"]
    run_case(argv, inside, capsys, names=["e9 was removed"])
    run_case(argv, inside, capsys, names=["e9 was removed"])  # not "already holds a run"
    pre = inside / "pre"
    pre.mkdir()
    (pre / "notes.txt").write_text("mine\n")
    run_case(ENV + ["badenvs:BadNanReward-v0", "--run-dir", "pre"], inside, capsys,
             names=["what this run wrote in pre was removed"], creates={"pre"})
    assert sorted(os.listdir(pre)) == ["notes.txt"]  # what was there before stays
    shutil.rmtree(pre)


def test_reward_raising_mid_run_keeps_the_checkpoints(inside, capsys):
    """A169: the reward raises in iteration 3: one line naming the function and the call;
    checkpoints 1 and 2 stay; the run resumes with a good reward to the end."""
    run_case(["llm", "train", "--no-progress", "--no-eval", "--iterations", "4",
              "--set", "checkpoint_every=1", "--model", "tiny", "--prompts", "p_ok.jsonl",
              "--reward", "rewards:later_raises", "--run-dir", "m17"], inside, capsys,
             names=["reward function 'later_raises' (call 4, iteration 3)",
                    "RuntimeError: reward exploded on call 4",
                    "checkpoint iter_000000002 in m17 is intact",
                    "ppokit llm train --resume m17 --reward rewards:later_raises"],
             creates={"m17"})
    assert find_checkpoint(inside / "m17" / "checkpoints")[0].name == "iter_000000002"
    assert main(["llm", "train", "--resume", "m17", "--reward", "rewards:good",
                 "--no-progress", "--no-eval"]) == 0
    assert [r["iteration"] for r in read_metrics(inside / "m17")] == [1, 2, 3, 4]
    shutil.rmtree(inside / "m17")


def test_prompts_outside_the_vocabulary_warn(inside, capsys):
    """A147: prompts the tokenizer cannot read train, with a warning that says so."""
    lines = run_case(["llm", "train", *PROMPTS_RUN, "--model", "tiny", "--prompts",
                      "p_oov.jsonl", "--reward", "rewards:good", "--run-dir", "l28"],
                     inside, capsys, rc=0, creates={"l28"})
    assert any(ln.startswith("warning: ") and "unknown token" in ln for ln in lines)
    shutil.rmtree(inside / "l28")


def test_prompts_with_the_built_in_model(inside, capsys):
    """A152: --prompts and --reward without --model: the built-in tiny model, warm-started
    on the built-in task, trains on the user's prompts."""
    run_case(["llm", "train", "--no-progress", "--no-eval", "--iterations", "1", "--set",
              "sft_steps=5", "--prompts", "p_ok.jsonl", "--reward", "rewards:good",
              "--run-dir", "l33"], inside, capsys, rc=0, creates={"l33"})
    assert [r["iteration"] for r in read_metrics(inside / "l33")] == [1]
    shutil.rmtree(inside / "l33")


def test_resume_after_metrics_were_deleted_says_which_are_missing(inside, capsys):
    """B15: the resumed run names the iterations whose records are gone."""
    shutil.copytree(inside / "r0", inside / "nometrics")
    (inside / "nometrics" / "metrics.jsonl").unlink()
    lines = run_case(["train", "--no-progress", "--eval-episodes", "0", "--resume",
                      "nometrics"], inside, capsys, rc=0, creates={"nometrics"})
    assert any("no record of iteration(s) 1-2 of the 2 done" in ln for ln in lines), lines
    shutil.rmtree(inside / "nometrics")


# ------------------------------------------------------------------ from Python

def test_a_factory_returning_none_is_named(tmp_path):
    """A197b."""
    import ppokit

    with pytest.raises(UsageError, match="env factory .*expected the factory to return a "
                                         "gymnasium.Env, got NoneType"):
        ppokit.train(lambda: None, total_steps=2048, run_dir=tmp_path / "f")
    assert not (tmp_path / "f").exists()


def test_llm_callbacks_must_be_functions(tmp_path):
    """A248."""
    import ppokit.llm as L

    with pytest.raises(UsageError, match="callbacks: expected a sequence of functions"):
        L.train(None, reward_funcs=lambda prompts, completions, **k: [0.0] * len(prompts),
                train_dataset=["12>"], callbacks=5, run_dir=tmp_path / "c")
    assert not (tmp_path / "c").exists()


# ------------------------------------------------------------------ faults

def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def full_disk_at(monkeypatch, checkpoint: str) -> None:
    """The disk is full from the moment checkpoint ``checkpoint`` is written."""
    import ppokit.io.checkpoint as ck

    real = ck._write

    def write(path, data):
        if checkpoint in str(path):
            _enospc()
        return real(path, data)

    monkeypatch.setattr(ck, "_write", write)


def test_disk_full_while_checkpointing_then_resume(inside, capsys, monkeypatch):
    """B17 / B18: the disk fills while checkpoint 3 is written (status 74, one line naming
    the checkpoint and that checkpoint 2 is intact, no partial checkpoint left); resuming
    while it is still full changes nothing; once there is space the run resumes and ends
    as the uninterrupted run does."""
    import ppokit.io.atomic as atomic

    argv = ["train", "--no-progress", "--eval-episodes", "0", "--total-steps", "1280",
            "--set", "checkpoint_every=1", "tensorboard=false", "--run-dir"]
    full_disk_at(monkeypatch, "iter_000000003")
    run_case(argv + ["full"], inside, capsys, rc=74,
             names=["full/checkpoints/iter_000000003: no space left on the device",
                    "checkpoint iter_000000002 in full is intact",
                    "free space, then resume with `ppokit train --resume full`"],
             creates={"full"})
    ckpts = sorted(os.listdir(inside / "full" / "checkpoints"))
    assert ckpts == ["iter_000000001", "iter_000000002"]  # no .tmp- leftover
    monkeypatch.undo()
    monkeypatch.chdir(inside)
    monkeypatch.setattr(atomic, "_exclusive", _enospc)
    before = _snapshot(inside / "full")
    run_case(["train", "--resume", "full"], inside, capsys, rc=74,
             names=["no space left", "nothing in full was changed"], creates={"full"})
    assert _snapshot(inside / "full") == before
    monkeypatch.undo()
    monkeypatch.chdir(inside)
    assert main(["train", "--no-progress", "--eval-episodes", "0", "--resume", "full"]) == 0
    assert main(argv + ["whole"]) == 0
    strip = [{k: v for k, v in r.items() if k not in ("sps", "time")}
             for r in read_metrics(inside / "full")]
    assert strip == [{k: v for k, v in r.items() if k not in ("sps", "time")}
                     for r in read_metrics(inside / "whole")]
    shutil.rmtree(inside / "full")
    shutil.rmtree(inside / "whole")


def test_llm_disk_full_while_checkpointing(inside, capsys, monkeypatch):
    """B45: as B17, for a language-model run."""
    full_disk_at(monkeypatch, "iter_000000002")
    run_case(["llm", "train", "--no-progress", "--no-eval", "--iterations", "3", "--set",
              "checkpoint_every=1", "--model", "tiny", "--prompts", "p_ok.jsonl",
              "--reward", "rewards:good", "--run-dir", "lfull"], inside, capsys, rc=74,
             names=["lfull/checkpoints/iter_000000002: no space left",
                    "checkpoint iter_000000001 in lfull is intact"], creates={"lfull"})
    monkeypatch.undo()
    monkeypatch.chdir(inside)
    assert main(["llm", "train", "--resume", "lfull", "--reward", "rewards:good",
                 "--no-progress", "--no-eval"]) == 0
    assert [r["iteration"] for r in read_metrics(inside / "lfull")] == [1, 2, 3]
    shutil.rmtree(inside / "lfull")


@pytest.mark.slow  # 16 s; the full-disk faults stay in the default set
def test_file_size_limit_is_a_fault_and_the_run_resumes(inside):
    """B20: under a file-size limit (ulimit -f) the run stops with status 74 and one line
    naming the file; without the limit it resumes to the end."""
    resource = pytest.importorskip("resource")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

    def limit():  # above a checkpoint's largest file (74 KiB), below what TensorBoard's
        # event file reaches in about 60 iterations
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))

    cmd = [sys.executable, "-m", "ppokit", "train", "--no-progress", "--eval-episodes", "0",
           "--total-steps", "51200", "--set", "checkpoint_every=5", "--run-dir", "ulim"]
    proc = subprocess.run(cmd, cwd=inside, env=env, preexec_fn=limit, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 74, proc.stderr[-3000:]
    lines = proc.stderr.strip().split("\n")
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-3000:]
    assert "file too large" in lines[0] and "is intact" in lines[0], lines
    assert "raise the file-size limit, then resume" in lines[0]
    ckpt, damaged = find_checkpoint(inside / "ulim" / "checkpoints")
    assert ckpt is not None and not damaged
    assert main(["train", "--no-progress", "--eval-episodes", "0", "--resume",
                 str(inside / "ulim")]) == 0
    recs = read_metrics(inside / "ulim")
    assert [r["iteration"] for r in recs] == list(range(1, 201))
    shutil.rmtree(inside / "ulim")


def test_a_stopped_run_after_a_fault_has_no_partial_checkpoint_left(tmp_path, monkeypatch):
    """The partial checkpoint of a failed write is removed at once (the space it took is
    free again; a later resume needs no clean-up)."""
    import numpy as np
    import torch

    import ppokit.io.checkpoint as ck
    from ppokit.errors import Fault

    monkeypatch.setattr(ck, "_write", lambda path, data: _enospc())
    with pytest.raises(Fault, match="iter_000000001: no space left"):
        ck.save_checkpoint(tmp_path, 1, tensors={"m": {"w": torch.zeros(2)}},
                           arrays={"a": {"x": np.zeros(2)}}, state={"k": 1})
    assert os.listdir(tmp_path) == []
