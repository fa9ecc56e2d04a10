"""Custom environments from the command line: ``--env module:Id`` (the module imported from
the current directory because the user named it), ``--env-kwargs``, with ``--seeds`` (child
processes) and async vectorisation; a run whose env id names a module needs it named again;
a hostile run directory naming a module imports nothing."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from _corridor import best_return, write_module
from ppokit.cli import main
from ppokit.io import latest_checkpoint, load_checkpoint, save_checkpoint

FAST = ["--set", "tensorboard=false", "--no-progress"]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in ``tmp_path`` as the current directory; sys.path restored afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return tmp_path


def _err_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_custom_env_module_trains_with_seeds_async_and_env_kwargs(in_tmp, capsys):
    write_module(in_tmp, "ppk_corr_cli", "PpkCorridorCli-v0")
    root = in_tmp / "seeds"
    rc = main(["train", "--env", "ppk_corr_cli:PpkCorridorCli-v0", "--env-kwargs",
               '{"size": 3}', "--seeds", "0-1", "--parallel", "2", "--total-steps", "4096",
               "--num-envs", "4", "--set", "n_steps=128", "--set", "vectorization=async",
               "--eval-episodes", "4", "--run-dir", str(root), *FAST])
    assert rc == 0, capsys.readouterr()
    summary = json.loads((root / "summary.json").read_text())
    assert summary["failed"] == [] and len(summary["eval_mean_returns"]) == 2
    # learned: close to the best return of a corridor of size 3 (0.8; random play ≈ -1)
    assert min(summary["eval_mean_returns"]) >= best_return(3) - 0.3, summary
    cfg = json.loads((root / "s0" / "config.json").read_text())
    assert cfg["env_id"] == "ppk_corr_cli:PpkCorridorCli-v0"
    assert cfg["env_kwargs"] == {"size": 3} and cfg["vectorization"] == "async"


def test_a_module_env_run_needs_its_id_named_again(in_tmp, capsys):
    write_module(in_tmp, "ppk_corr_again", "PpkCorridorAgain-v0")
    env_id = "ppk_corr_again:PpkCorridorAgain-v0"
    rd = in_tmp / "run"
    assert main(["train", "--env", env_id, "--env-kwargs", '{"size": 2}', "--total-steps",
                 "512", "--num-envs", "4", "--set", "n_steps=128", "--run-dir", str(rd),
                 "--eval-episodes", "2", *FAST]) == 0
    assert json.loads((rd / "eval.json").read_text())["episodes"] == 2
    capsys.readouterr()
    for argv in (["eval", str(rd)], ["train", "--resume", str(rd)],
                 ["check", str(rd), "--no-labels", "--samples", "16"]):
        assert main(argv) == 2, argv
        line = _err_line(capsys)
        assert f"pass --env {env_id} again" in line, line
    assert main(["eval", str(rd), "--env", "CartPole-v1"]) == 2
    assert "trained on 'ppk_corr_again:PpkCorridorAgain-v0', not 'CartPole-v1'" in \
        _err_line(capsys)
    assert main(["eval", str(rd), "--env", env_id, "--episodes", "2"]) == 0
    assert main(["train", "--resume", str(rd), "--env", env_id, *FAST[2:]]) == 0


def test_env_kwargs_from_a_toml_file(in_tmp, capsys):
    write_module(in_tmp, "ppk_corr_toml", "PpkCorridorToml-v0")
    (in_tmp / "c.toml").write_text('env_id = "ppk_corr_toml:PpkCorridorToml-v0"\n'
                                   "n_envs = 2\nn_steps = 64\n[env_kwargs]\nwidth = 3\n")
    rd = in_tmp / "run"
    assert main(["train", "--config", "c.toml", "--total-steps", "128", "--run-dir", str(rd),
                 "--eval-episodes", "1", *FAST]) == 0
    cfg = json.loads((rd / "config.json").read_text())
    assert cfg["env_kwargs"] == {"width": 3}
    # the kwargs reached the environment: the policy was built for 3-wide observations
    import ppokit

    agent = ppokit.load(rd, env="ppk_corr_toml:PpkCorridorToml-v0")
    assert agent.observation_space.shape == (3,)
    assert agent.predict(np.zeros((2, 3), np.float32))[0].shape == (2,)


def _name_a_module(run_dir, env_id: str, **more) -> None:
    """Rewrite the newest checkpoint (a valid manifest) and config.json so that the run's
    configuration names ``env_id``."""
    ck = latest_checkpoint(run_dir / "checkpoints")
    tensors, arrays, state = load_checkpoint(ck)
    state["config"].update(env_id=env_id, **more)
    save_checkpoint(run_dir / "checkpoints", state["iteration"], tensors=tensors,
                    arrays=arrays, state=state)
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg.update(env_id=env_id, **more)
    (run_dir / "config.json").write_text(json.dumps(cfg))


def test_a_hostile_run_dir_naming_a_module_imports_nothing(in_tmp, capsys):
    import ppokit

    marker = in_tmp / "IMPORTED"
    write_module(in_tmp, "ppk_hostile", "PpkHostile-v0", marker=marker)
    sys.path.insert(0, str(in_tmp))  # importable, so only ppokit's rule keeps it out
    rd = in_tmp / "run"
    assert main(["train", "--total-steps", "512", "--run-dir", str(rd), "--eval-episodes",
                 "0", *FAST]) == 0
    _name_a_module(rd, "ppk_hostile:PpkHostile-v0")
    capsys.readouterr()
    for argv in (["eval", str(rd)], ["eval", str(rd), "--stochastic"],
                 ["train", "--resume", str(rd)], ["check", str(rd)], ["report", str(rd)],
                 ["plot", str(rd), "--out", str(in_tmp / "p.png")]):
        main(argv)
        capsys.readouterr()
    loaded = ppokit.load(rd)  # the recorded spaces: an agent that predicts, nothing imported
    assert loaded.predict(np.zeros(4, np.float32))[0] in (0, 1)
    with pytest.raises(ValueError, match="pass --env ppk_hostile:PpkHostile-v0 again"):
        loaded.evaluate(episodes=1)
    with pytest.raises(ValueError, match="trained on 'ppk_hostile:PpkHostile-v0', not"):
        ppokit.train("CartPole-v1", run_dir=rd, resume=True, progress=False)
    assert not marker.exists()
    assert "ppk_hostile" not in sys.modules
    # a run dir claiming a factory asks for the factory, and imports nothing either
    _name_a_module(rd, "ppk_hostile.Corridor", env_source="factory")
    assert main(["eval", str(rd)]) == 2
    assert "environment factory" in _err_line(capsys)
    with pytest.raises(ValueError, match="pass the factory again"):
        ppokit.load(rd).learn(64)
    assert not marker.exists() and "ppk_hostile" not in sys.modules


@pytest.mark.parametrize("argv, message", [
    (["--env-kwargs", "[1]"], "--env-kwargs: expected a JSON object"),
    (["--env-kwargs", "{bad"], "--env-kwargs: expected a JSON object"),
    (["--env-kwargs", '{"num_envs": 3}'], "--env-kwargs (env_kwargs): 'num_envs' is set by"),
    (["--env-kwargs", '{"nope": 1}'], "env_kwargs: 'CartPole-v1' does not accept them"),
    (["--set", "env_kwargs=3"], "env_kwargs: expected a table"),
    (["--env", "ppk_missing_mod:X-v0"], "--env: cannot import module 'ppk_missing_mod'"),
    (["--env", "1bad:X-v0"], "--env: expected module:Id with a Python module name"),
    (["--set", "env_source=factory"], "env: this run trains on an environment factory"),
])
def test_bad_env_arguments_name_the_argument(in_tmp, capsys, argv, message):
    rd = in_tmp / "run"
    assert main(["train", "--total-steps", "2048", "--run-dir", str(rd), *argv, *FAST]) == 2
    assert message in _err_line(capsys)
    assert not rd.exists()
