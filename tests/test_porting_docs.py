"""docs/from_sb3.md and docs/from_trl.md run: each page's ```python blocks are executed in
order, in one namespace, in a temporary directory, and what they train must have learned."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def run_page(name: str, tmp_path, monkeypatch) -> dict:
    monkeypatch.chdir(tmp_path)
    text = (DOCS / name).read_text()
    ns: dict = {"__name__": name}
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert blocks
    for i, block in enumerate(blocks):
        exec(compile(block, f"{name} block {i}", "exec"), ns)  # noqa: S102
    return ns


def test_from_sb3_runs_with_one_import_changed(tmp_path, monkeypatch):
    ns = run_page("from_sb3.md", tmp_path, monkeypatch)
    assert ns["total"] >= 195  # the loaded model balances the pole (CartPole's solved mark)
    assert ns["mean_reward"] >= 150 and ns["std_reward"] >= 0  # evaluate_policy's
    assert (tmp_path / "ppo_cartpole" / "config.json").is_file()
    assert ns["model"].num_timesteps >= 20_000
    assert ns["agent"].num_timesteps >= 30_000  # learn(10_000) went on in the same run
    assert ns["same"].num_timesteps == ns["agent"].num_timesteps
    # MaskablePPO: learned with the masks (most is 20), nothing without them
    assert ns["with_masks"] >= 17 and ns["without"] <= 2
    assert (tmp_path / "ppo_mask" / "config.json").is_file()


def test_from_trl_runs_and_the_reward_rises(tmp_path, monkeypatch):
    ns = run_page("from_trl.md", tmp_path, monkeypatch)
    run = ns["run"]
    assert run.config.samples_per_prompt == 4 and run.config.max_new_tokens == 12
    assert run.config.kl_coef == 0.0
    hist = run.history
    first = sum(r["score_mean"] for r in hist[:5]) / 5
    last = sum(r["score_mean"] for r in hist[-5:]) / 5
    assert last > first + 0.1, (first, last)


def test_sb3_shapes_refuse_what_they_cannot_honour(tmp_path):
    from ppokit import PPO
    from ppokit.errors import UsageError

    with pytest.raises(UsageError, match="tensorboard_log: expected a directory"):
        PPO("MlpPolicy", "CartPole-v1", tensorboard_log=3)
    with pytest.raises(UsageError, match="tensorboard_log: the run directory is run_dir"):
        PPO("MlpPolicy", "CartPole-v1", tensorboard_log="tb", run_dir="r")
    with pytest.raises(UsageError, match="policy: expected one of MlpPolicy"):
        PPO("LstmPolicy", "CartPole-v1")
    with pytest.raises(UsageError, match="policy_kwargs: 'features_extractor_kwargs'"):
        PPO("MlpPolicy", "CartPole-v1", policy_kwargs={"features_extractor_kwargs": {}})
    with pytest.raises(UsageError, match="has not been trained"):
        PPO("MlpPolicy", "CartPole-v1").predict([0.0, 0.0, 0.0, 0.0])

    class SB3Callback:
        def _on_step(self):
            return True

    with pytest.raises(UsageError, match="a Stable-Baselines3 callback object"):
        PPO("MlpPolicy", "CartPole-v1").learn(1000, callback=SB3Callback())


def test_trl_names_that_do_not_map_are_refused():
    from ppokit.errors import UsageError
    from ppokit.llm.training.config_values import config_from_values, parse_sets

    assert parse_sets(["num_generations=8", "beta=0.1"]) == {"samples_per_prompt": 8,
                                                             "kl_coef": 0.1}
    for name, hint in (("per_device_train_batch_size", "batch_size"),
                       ("loss_type", "agg"), ("scale_rewards", "normalize_std")):
        with pytest.raises(UsageError, match=f"{name}: TRL's name.*{hint}"):
            config_from_values(("train()", {name: 1}))


def test_an_unregistered_instance_is_copied_or_refused(tmp_path):
    import copy

    import gymnasium as gym
    import numpy as np

    import ppokit
    from ppokit.envs.source import InstanceEnvs
    from ppokit.errors import UsageError

    class Coin(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.zeros(2, np.float32), {}

        def step(self, a):
            self.t += 1
            return np.zeros(2, np.float32), float(a), self.t >= 8, False, {}

    env = Coin()
    maker = InstanceEnvs(env)
    assert maker.label == "Coin" and maker() is env
    assert isinstance(maker(), Coin) and maker() is not env
    agent = ppokit.train(env, total_timesteps=512, n_envs=2, n_steps=128,
                         run_dir=tmp_path / "coin", progress=False)
    assert agent.num_timesteps == 512

    class Locked(Coin):
        def __deepcopy__(self, memo):
            raise TypeError("holds a lock")

    locked = InstanceEnvs(Locked())
    locked()
    with pytest.raises(UsageError, match="cannot be copied"):
        locked()
    assert copy.deepcopy(env) is not env
