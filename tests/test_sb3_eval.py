"""A model trained the Stable-Baselines3 way (an environment instance) is loaded and
evaluated as its users expect: ``ppokit.load(path).evaluate()``, ``ppokit.load(path,
env=ID)``, ``ppokit eval PATH`` and ``ppokit.evaluate_policy(model, env)``; a run trained
on a factory takes an id, an instance or the factory at load time."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import ppokit
from ppokit.cli import main
from ppokit.envs.source import registered_id
from ppokit.errors import UsageError

SMALL = dict(n_envs=2, n_steps=32, batch_size=64, tensorboard=False)


@pytest.fixture
def saved(tmp_path, monkeypatch):
    """``PPO("MlpPolicy", gym.make("CartPole-v1")).learn(...).save("m")``."""
    monkeypatch.chdir(tmp_path)
    model = ppokit.PPO("MlpPolicy", gym.make("CartPole-v1"), run_dir="train", **SMALL)
    model.learn(128)
    model.save("m")
    return model, tmp_path / "m"


def test_an_instance_run_loads_and_evaluates_by_itself(saved, capsys):
    model, m = saved
    cfg = json.loads((m / "config.json").read_text())
    assert (cfg["env_id"], cfg["env_source"], cfg["env_kwargs"]) == ("CartPole-v1", "id", {})
    res = ppokit.load(m).evaluate(episodes=3)
    assert len(res["returns"]) == 3 and res["mean_return"] > 0
    again = ppokit.load(m, env="CartPole-v1").evaluate(episodes=3)
    assert again["returns"] == res["returns"]  # the same seeds, the same environment
    assert ppokit.PPO.load(m, env=gym.make("CartPole-v1")).agent.evaluate(episodes=3
                                                                          )["returns"] \
        == res["returns"]
    capsys.readouterr()
    assert main(["eval", str(m), "--episodes", "3"]) == 0
    assert json.loads((m / "eval.json").read_text())["returns"] == res["returns"]
    assert main(["eval", str(m), "--episodes", "3", "--env", "CartPole-v1"]) == 0


def test_evaluate_policy_as_stable_baselines3s(saved):
    model, _ = saved
    env = gym.make("CartPole-v1")
    mean, std = ppokit.evaluate_policy(model, env, n_eval_episodes=4)
    assert isinstance(mean, float) and isinstance(std, float) and mean > 0
    returns, lengths = ppokit.evaluate_policy(model, env, n_eval_episodes=4,
                                              return_episode_rewards=True)
    assert len(returns) == 4 and mean == pytest.approx(sum(returns) / 4)
    assert lengths == [int(r) for r in returns]  # CartPole pays 1 a step
    env.reset(seed=0)
    env.step(0)  # the user's environment is still open
    by_id = ppokit.evaluate_policy(ppokit.load(model.agent.run_dir), "CartPole-v1",
                                   n_eval_episodes=4)
    assert by_id == (mean, std)  # the same seeded episodes, whatever builds them
    with pytest.raises(UsageError, match="model: expected a ppokit PPO/A2C model"):
        ppokit.evaluate_policy(object(), env)
    with pytest.raises(UsageError, match="n_eval_episodes: expected an integer"):
        ppokit.evaluate_policy(model, env, n_eval_episodes=0)
    with pytest.raises(UsageError, match="has not been trained"):
        ppokit.evaluate_policy(ppokit.PPO("MlpPolicy", "CartPole-v1"), env)


def test_a_factory_run_takes_an_id_an_instance_or_the_factory(tmp_path, capsys):
    rd = tmp_path / "run"
    ppokit.train(lambda: gym.make("CartPole-v1"), total_steps=128, run_dir=rd,
                 progress=False, **SMALL).close()
    assert json.loads((rd / "config.json").read_text())["env_source"] == "factory"
    with pytest.raises(UsageError, match="pass the factory again"):
        ppokit.load(rd).evaluate(episodes=1)
    ref = ppokit.load(rd, env=lambda: gym.make("CartPole-v1")).evaluate(episodes=2)
    for env in ("CartPole-v1", gym.make("CartPole-v1")):
        assert ppokit.load(rd, env=env).evaluate(episodes=2)["returns"] == ref["returns"]
    capsys.readouterr()
    assert main(["eval", str(rd)]) == 2
    assert "--env ID" in capsys.readouterr().err
    assert main(["eval", str(rd), "--env", "CartPole-v1", "--episodes", "2"]) == 0
    assert capsys.readouterr().out.startswith("CartPole-v1: mean return ")
    res = json.loads((rd / "eval.json").read_text())
    assert res["returns"] == ref["returns"] and res["env_id"] == "CartPole-v1"
    # an environment given that the policy does not fit is refused in one line
    assert main(["eval", str(rd), "--env", "Acrobot-v1", "--episodes", "1"]) == 2
    assert "env: the observation space of env 'Acrobot-v1' is Box of shape (6,); the policy " \
        "was trained for Box of shape (4,)" in capsys.readouterr().err
    with pytest.raises(UsageError, match="the policy was trained for Box of shape"):
        ppokit.evaluate_policy(ppokit.load(rd), gym.make("MountainCar-v0"))
    # and it continues on the id named, as on its factory
    assert main(["train", "--resume", str(rd), "--env", "CartPole-v1", "--total-steps",
                 "192", "--no-progress", "--eval-episodes", "0"]) == 0
    agent = ppokit.load(rd, env="CartPole-v1").learn(64, progress=False)
    assert agent.num_timesteps == 256
    agent.close()


def test_what_is_recorded_of_an_instance():
    assert registered_id(gym.make("CartPole-v1", render_mode="rgb_array").spec) == \
        ("CartPole-v1", {})
    assert registered_id(gym.make("FrozenLake-v1", map_name="8x8").spec) == \
        ("FrozenLake-v1", {"map_name": "8x8"})
    # what an id and its keyword arguments cannot rebuild stays a factory
    assert registered_id(gym.make("CartPole-v1", max_episode_steps=50).spec) is None
    wrapped = gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))
    assert registered_id(wrapped.spec) is None
    assert registered_id(None) is None
