"""The Python API: ppokit.train / Agent.predict / evaluate / save / ppokit.load / learn,
factories, callbacks, and arguments checked at the boundary."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import ppokit
from _corridor import best_return, write_module
from ppokit.cli import main
from ppokit.errors import UsageError
from ppokit.io import latest_checkpoint, read_metrics

TINY = dict(tensorboard=False, progress=False)


def test_import_ppokit_is_light():
    code = ("import sys, ppokit; assert callable(ppokit.__getattr__); "
            "bad = [m for m in ('torch', 'gymnasium', 'numpy') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_train_predict_evaluate_save_load_learn(tmp_path):
    rd = tmp_path / "run"
    agent = ppokit.train("CartPole-v1", total_steps=2048, run_dir=rd, seed=3,
                         normalize_obs=True, **TINY)
    assert agent.num_timesteps == 2048 and agent.run_dir == rd
    for name in ("config.json", "metrics.jsonl", "learning_curve.png"):
        assert (rd / name).exists(), name
    assert agent.mean_training_return is not None
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    actions, state = agent.predict(obs)
    assert state is None and actions.shape == (5,)
    # the run's normalisation, then the deterministic action
    with torch.inference_mode():
        want = agent.policy.deterministic_action(torch.as_tensor(agent.obs_norm(obs))).numpy()
    assert np.array_equal(actions, want)
    single, _ = agent.predict(obs[2])
    assert single.shape == () and single == actions[2]
    res = agent.evaluate(episodes=2)
    assert json.loads((rd / "eval.json").read_text())["returns"] == res["returns"]
    agent.evaluate(episodes=2, deterministic=False)
    assert (rd / "eval_stochastic.json").exists()

    saved = tmp_path / "saved"
    agent.save(saved)
    loaded = ppokit.load(saved)
    assert np.array_equal(loaded.predict(obs)[0], actions)
    assert loaded.num_timesteps == 2048
    assert main(["eval", str(saved), "--episodes", "2"]) == 0
    # a loaded agent is read-only: evaluate writes nothing
    from_run = ppokit.load(rd)
    before = sorted(p.name for p in rd.iterdir())
    assert from_run.evaluate(episodes=1)["episodes"] == 1
    assert sorted(p.name for p in rd.iterdir()) == before

    agent.learn(1024)
    assert agent.num_timesteps == 3072
    assert latest_checkpoint(rd / "checkpoints").name == "iter_000000012"
    assert [r["iteration"] for r in read_metrics(rd)] == list(range(1, 13))
    agent.close()
    assert ppokit.load(rd).num_timesteps == 3072


def test_a_factory_env_trains_and_is_needed_again(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    write_module(tmp_path, "ppk_corr_api", "PpkCorridorApi-v0")
    mod = importlib.import_module("ppk_corr_api")

    def make_env():
        return mod.Corridor(size=3)

    rd = tmp_path / "run"
    agent = ppokit.train(make_env, total_steps=16384, run_dir=rd, n_envs=4, n_steps=128,
                         eval_every=2, eval_episodes=2, stop_at_return=0.7, **TINY)
    assert agent.cfg.env_source == "factory" and agent.cfg.env_id.endswith("make_env")
    # learned: evaluations during training reached 0.7 (the best return is 0.8, random
    # play ≈ -1) and training stopped there, with a checkpoint
    assert agent.stopped_early and agent.num_timesteps < 16384
    steps = agent.num_timesteps
    assert latest_checkpoint(rd / "checkpoints").name == f"iter_{steps // 512:09d}"
    assert agent.evaluate(episodes=4)["mean_return"] >= best_return(3) - 0.3
    agent.close()
    bare = ppokit.load(rd)  # the run records its spaces: predict needs no environment
    assert bare.predict(np.array([0.0], np.float32))[0] == 1  # step right
    with pytest.raises(UsageError, match="pass the factory again"):
        bare.evaluate(episodes=1)  # evaluation does
    assert main(["eval", str(rd)]) == 2
    assert "environment factory" in capsys.readouterr().err
    loaded = ppokit.load(rd, env=make_env, best=True)
    assert loaded.predict(np.array([0.0], np.float32))[0] == 1  # step right
    resumed = ppokit.train(make_env, run_dir=rd, resume=True, progress=False)
    assert steps < resumed.num_timesteps <= steps + 2 * 512
    resumed.close()


def test_callbacks_see_metrics_and_the_agent_and_can_stop(tmp_path):
    seen = []

    def cb(metrics, agent):
        seen.append((metrics["iteration"], agent.num_timesteps))
        return "stop" if metrics["iteration"] == 2 else None

    agent = ppokit.train("CartPole-v1", total_steps=4096, run_dir=tmp_path / "r",
                         callbacks=[cb, lambda m, a: True], **TINY)
    assert seen == [(1, 256), (2, 512)] and agent.stopped_early
    assert latest_checkpoint(tmp_path / "r" / "checkpoints").name == "iter_000000002"
    agent.close()


def test_eval_during_training_keeps_the_best_and_stops_at_a_return(tmp_path, capsys):
    rd = tmp_path / "r"
    assert main(["train", "--total-steps", "4096", "--run-dir", str(rd), "--eval-episodes",
                 "0", "--set", "eval_every=2", "--set", "eval_episodes=2", "--set",
                 "stop_at_return=-1e9", "--set", "tensorboard=false", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "stopped early: evaluation return" in out and "mean training return" in out
    recs = read_metrics(rd)
    assert [r["eval_return_mean"] is None for r in recs] == [True, False]
    assert recs[1]["eval_best"] == recs[1]["eval_return_mean"]
    assert latest_checkpoint(rd / "best").name == "iter_000000002"
    assert latest_checkpoint(rd / "checkpoints").name == "iter_000000002"
    assert main(["eval", str(rd), "--best", "--episodes", "2"]) == 0
    assert json.loads((rd / "eval_best.json").read_text())["episodes"] == 2
    assert not (rd / "eval.json").exists()
    capsys.readouterr()
    rd2 = tmp_path / "r2"
    assert main(["train", "--total-steps", "256", "--run-dir", str(rd2), "--eval-episodes",
                 "0", "--set", "tensorboard=false", "--no-progress"]) == 0
    assert main(["eval", str(rd2), "--best"]) == 2
    assert "--best:" in capsys.readouterr().err
    assert main(["train", "--run-dir", str(tmp_path / "r3"), "--set",
                 "stop_at_return=100"]) == 2
    assert "stop_at_return: needs eval_every > 0" in capsys.readouterr().err


def test_a_resumed_run_replaces_best_only_with_a_better_policy(tmp_path):
    from ppokit.io import load_checkpoint, save_checkpoint

    rd = tmp_path / "r"
    ppokit.train("CartPole-v1", total_steps=512, run_dir=rd, eval_every=1, eval_episodes=1,
                 **TINY).close()
    # best/ holds a policy evaluated after the newest checkpoint (as when a run stops
    # between the two), here with a better evaluation than any to come
    ck = latest_checkpoint(rd / "best")
    tensors, arrays, state = load_checkpoint(ck)
    state["best_eval_return"] = 1e9
    save_checkpoint(rd / "best", 5, tensors=tensors, arrays=arrays, state=state, keep=1)
    agent = ppokit.load(rd).learn(512, progress=False)
    assert latest_checkpoint(rd / "best").name == "iter_000000005"
    assert [r["eval_best"] for r in read_metrics(rd)][-2:] == [1e9, 1e9]
    agent.close()


class _NotAFactory:
    pass


@pytest.mark.parametrize("kwargs, message", [
    (dict(env=_NotAFactory), "env: got the class _NotAFactory; pass a factory"),
    (dict(env=3), "env: expected a Gymnasium id or a factory"),
    (dict(lr=0.1), "ppokit.train: unknown key 'lr'; did you mean 'learning_rate'"),
    (dict(total_timesteps=10, total_steps=10), "total_timesteps: the same as total_steps"),
    (dict(total_steps=-1), "total_steps (total_timesteps): expected"),
    (dict(progress="yes"), "progress: expected True, False, None (a bar when stderr is a "
                           "terminal) or a text stream"),
    (dict(callbacks=[1]), "callbacks: expected functions"),
    (dict(env_kwargs=[1]), "env_kwargs: expected a table"),
    (dict(resume=True), "resume: needs run_dir"),
    (dict(env="ppk_nowhere:X-v0"), "env: cannot import module 'ppk_nowhere'"),
])
def test_train_arguments_are_checked_at_the_boundary(tmp_path, monkeypatch, kwargs, message):
    monkeypatch.chdir(tmp_path)
    kwargs = {"env": "CartPole-v1", **kwargs}
    with pytest.raises(UsageError) as exc:
        ppokit.train(kwargs.pop("env"), **kwargs)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_classes_and_bad_observations_are_refused(tmp_path):
    import gymnasium as gym

    with pytest.raises(UsageError, match="got the class CartPoleEnv; pass a factory"):
        ppokit.train(gym.make("CartPole-v1").unwrapped.__class__)
    agent = ppokit.train("CartPole-v1", total_steps=256, run_dir=tmp_path / "r", **TINY)
    with pytest.raises(UsageError, match="run_dir: .* already holds a run; continue it with "
                       "ppokit.train"):
        ppokit.train("CartPole-v1", total_steps=256, run_dir=tmp_path / "r", **TINY)
    with pytest.raises(UsageError, match=r"observation: expected shape \(4,\)"):
        agent.predict(np.zeros(3))
    with pytest.raises(UsageError, match="episodes: expected an integer"):
        agent.evaluate(episodes=0)
    with pytest.raises(UsageError, match="more_steps: expected an integer"):
        agent.learn(0)
    agent.save(tmp_path / "r2")
    with pytest.raises(UsageError, match="already holds a run"):
        agent.save(tmp_path / "r2")
    agent.close()


def test_cartpole_from_python_reaches_500_and_stops_there(tmp_path):
    agent = ppokit.train("CartPole-v1", run_dir=tmp_path / "r", seed=0, eval_every=5,
                         eval_episodes=5, stop_at_return=500, **TINY)
    assert agent.stopped_early and agent.num_timesteps < 100_000
    best = ppokit.load(tmp_path / "r", best=True)
    assert best.evaluate(episodes=10)["mean_return"] >= 475
    agent.close()


def test_ctrl_c_in_python_writes_a_checkpoint_and_learn_continues(tmp_path, capsys):
    """SIGINT during ppokit.train: the iteration finishes, a checkpoint is written, then
    KeyboardInterrupt reaches the caller; the run continues from that checkpoint."""
    import os
    import signal

    def interrupt_at_3(rec, agent):
        if rec["iteration"] == 3:
            os.kill(os.getpid(), signal.SIGINT)

    rd = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        ppokit.train("CartPole-v1", total_steps=4096, run_dir=rd, n_envs=4, n_steps=64,
                     callbacks=[interrupt_at_3], **TINY)
    err = capsys.readouterr().err
    assert "received SIGINT" in err and "continue with agent.learn" in err
    assert latest_checkpoint(rd / "checkpoints").name == "iter_000000003"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    agent = ppokit.train("CartPole-v1", run_dir=rd, resume=True, progress=False)
    assert agent.num_timesteps == 4096
    assert [r["iteration"] for r in read_metrics(rd)] == list(range(1, 17))
    agent.close()


def test_a_gymnasium_vector_env_trains_as_it_is(tmp_path):
    import gymnasium as gym

    vec = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    agent = ppokit.train(vec, total_steps=1024, run_dir=tmp_path / "r", n_steps=64, **TINY)
    assert agent.cfg.n_envs == 4 and agent.cfg.env_source == "factory"
    assert agent.num_timesteps == 1024
    res = agent.evaluate(episodes=3)  # single copies built from the vector env's env_fns
    assert len(res["returns"]) == 3 and res["mean_return"] > 0
    agent.close()
    assert vec.closed  # ppokit closes the vector env with the agent
    with pytest.raises(UsageError, match="n_envs: 8, but the VectorEnv given has 2"):
        ppokit.train(gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync"),
                     n_envs=8, run_dir=tmp_path / "r2", **TINY)
    # a vector env with its own vectorised implementation: single copies from its spec
    vec = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="vector_entry_point")
    agent = ppokit.train(vec, total_steps=512, run_dir=tmp_path / "r3", n_steps=64, **TINY)
    assert len(agent.evaluate(episodes=2)["returns"]) == 2
    # loading the run needs the environment again (a vector env or a factory)
    agent.close()
    loaded = ppokit.load(tmp_path / "r3",
                         env=gym.make_vec("CartPole-v1", 2, vectorization_mode="sync"))
    assert len(loaded.evaluate(episodes=2)["returns"]) == 2


def test_scalars_logged_from_a_callback_join_that_iterations_record(tmp_path):
    def mine(rec, agent):
        agent.log("custom/twice_iteration", 2 * rec["iteration"])

    rd = tmp_path / "run"
    agent = ppokit.train("CartPole-v1", total_steps=1024, run_dir=rd, n_envs=4, n_steps=64,
                         callbacks=[mine], progress=False)
    recs = read_metrics(rd)
    assert [r["custom/twice_iteration"] for r in recs] == [2.0 * r["iteration"] for r in recs]
    with pytest.raises(UsageError, match="log: scalars are logged"):
        agent.log("custom/x", 1.0)  # outside a callback

    def clash(rec, agent):
        agent.log("approx_kl", 1.0)

    with pytest.raises(UsageError, match="'approx_kl' is one of ppokit's own metrics"):
        agent.learn(256, callbacks=[clash])

    def not_a_number(rec, agent):
        agent.log("custom/x", float("nan"))

    with pytest.raises(UsageError, match="custom/x: expected a finite number"):
        agent.learn(256, callbacks=[not_a_number])
    agent.close()


def test_stable_baselines3_names_and_the_package_listing(tmp_path):
    """``total_timesteps=`` (SB3's name) trains as ``total_steps=``; ``dir(ppokit)`` lists
    the lazily imported API, so tab completion finds it."""
    agent = ppokit.train("CartPole-v1", total_timesteps=256, run_dir=tmp_path / "r", **TINY)
    assert agent.cfg.total_timesteps == 256
    names = dir(ppokit)
    for name in ("train", "load", "Agent", "check_env", "register_policy_loss",
                 "register_advantage_estimator", "register_features_extractor"):
        assert name in names
