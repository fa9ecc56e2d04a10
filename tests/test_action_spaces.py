"""Every action space ppokit accepts gives actions its space contains — in training (the
fast and the reference collectors, the LSTM policy), ``predict`` (deterministic and
sampled), evaluation, video — whatever its shape, start and dtype; every other space is
refused with one line naming it before anything is trained (Ray actors and EnvPool:
tests/test_ray.py, tests/test_envpool.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

import ppokit
from _space_env import action_spaces, factory
from ppokit.algos import Trainer
from ppokit.api import _resolve
from ppokit.errors import UsageError
from ppokit.policies.actions import check_action_space, env_actions


def _train(tmp_path, space, **config):
    maker = factory(space)
    base = dict(n_envs=2, n_steps=8, batch_size=8, n_epochs=1, tensorboard=False,
                checkpoint_every=100)
    base.update(config)
    cfg = _resolve("SpaceEnv", "ppo", 16, None, "factory", base, maker)
    run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    tr = Trainer(cfg, run, env=maker, log=lambda m: None)
    tr.train()  # SpaceEnv raises at the first action its space does not contain
    tr.close()
    return run, maker


@settings(max_examples=30)
@given(space=action_spaces(), fast=st.booleans(), lstm=st.booleans())
def test_every_accepted_space_gets_actions_it_contains(tmp_path_factory, space, fast, lstm):
    lstm = lstm and not isinstance(space, spaces.MultiBinary)  # (no Bernoulli LSTM head)
    tmp = tmp_path_factory.mktemp("spaces")
    config = dict(fast=fast, recurrent="lstm" if lstm else "none", lstm_hidden_size=4)
    run, maker = _train(tmp, space, **config)
    agent = ppokit.load(run, env=maker)
    obs = np.random.default_rng(0).uniform(-1, 1, (5, 3)).astype(np.float32)
    for deterministic in (True, False):
        one, _ = agent.predict(obs[0], deterministic=deterministic)
        assert space.contains(one), (space, one)
        batch, _ = agent.predict(obs, deterministic=deterministic)
        assert batch.shape == (5, *space.shape)
        assert all(space.contains(batch[i, ...]) for i in range(5)), (space, batch)
    agent.evaluate(episodes=2)  # the env refuses an action outside its space
    agent.evaluate(episodes=2, deterministic=False)


@settings(max_examples=200)
@given(space=action_spaces(), seed=st.integers(0, 2**16))
def test_env_actions_are_contained_for_any_policy_output(space, seed):
    """The conversion alone, on raw policy outputs: indices from 0, bits, and Gaussian
    samples far outside the Box."""
    g = np.random.default_rng(seed)
    n = 7
    if isinstance(space, spaces.Discrete):
        a = g.integers(0, space.n, n)
    elif isinstance(space, spaces.MultiDiscrete):
        a = g.integers(0, space.nvec.reshape(-1), (n, space.nvec.size))
    elif isinstance(space, spaces.MultiBinary):
        a = g.integers(0, 2, (n, int(np.prod(space.shape))))
    else:
        a = (g.standard_normal((n, int(np.prod(space.shape)))) * 10).astype(np.float32)
    out = env_actions(a, space)
    assert out.shape == (n, *space.shape) and out.dtype == space.dtype
    assert all(space.contains(out[i, ...]) for i in range(n))
    if not isinstance(space, spaces.Box):  # the policy's index plus the space's start
        start = np.asarray(getattr(space, "start", 0))
        np.testing.assert_array_equal(out.reshape(n, -1) - start.reshape(-1),
                                      a.reshape(n, -1))


def test_the_reported_spaces_train(tmp_path):
    """MultiBinary((2, 3)) and MultiDiscrete([[2, 3], [4, 2]]) train (they crashed in the
    policy), and Discrete / MultiDiscrete with a start are sent actions inside the space."""
    for space in (spaces.MultiBinary((2, 3)), spaces.MultiDiscrete([[2, 3], [4, 2]]),
                  spaces.Discrete(3, start=-1), spaces.Discrete(2, start=5),
                  spaces.MultiDiscrete([3, 2], start=[1, -4])):
        _train(tmp_path, space)


class _Unsupported(gym.Env):
    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)

    def __init__(self, space):
        self.action_space = space

    def reset(self, *, seed=None, options=None):
        raise AssertionError("an unsupported space must be refused before any step")

    def step(self, action):
        raise AssertionError("an unsupported space must be refused before any step")


UNSUPPORTED = [
    (spaces.Graph(spaces.Box(0, 1, (2,)), spaces.Discrete(3)), "Graph"),
    (spaces.Sequence(spaces.Discrete(2)), "Sequence"),
    (spaces.Text(5), "Text"),
    (spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3))), "Tuple"),
    (spaces.Dict({"a": spaces.Discrete(2)}), "Dict"),
    (spaces.OneOf((spaces.Discrete(2), spaces.Box(0, 1, (2,)))), "OneOf"),
    (spaces.Box(0, 5, (2,), dtype=np.int64), "Box of int64"),
    (spaces.MultiDiscrete(np.zeros((0,), np.int64) + 2), "without entries"),
]


@pytest.mark.parametrize(("space", "words"), UNSUPPORTED,
                         ids=[w for _, w in UNSUPPORTED])
def test_unsupported_spaces_are_refused_in_one_line_naming_them(tmp_path, space, words):
    with pytest.raises(ValueError, match=words):
        check_action_space(space)
    with pytest.raises(UsageError) as exc:
        ppokit.train(lambda: _Unsupported(space), total_steps=16, n_envs=1, n_steps=16,
                     batch_size=16, run_dir=tmp_path / "run", progress=False)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("action space ") and words in msg
    assert "is not supported" in msg and not (tmp_path / "run").exists()


def test_unsupported_space_on_the_command_line_exits_2_with_one_line(tmp_path, capsys,
                                                                     monkeypatch):
    mod = tmp_path / "graphenv.py"
    mod.write_text(
        "import gymnasium as gym\nimport numpy as np\n"
        "class G(gym.Env):\n"
        "    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)\n"
        "    action_space = gym.spaces.Sequence(gym.spaces.Discrete(2))\n"
        "    def reset(self, *, seed=None, options=None):\n"
        "        return np.zeros(3, np.float32), {}\n"
        "    def step(self, action):\n"
        "        raise AssertionError('no step')\n"
        "gym.register('GraphEnv-v0', entry_point=G)\n")
    monkeypatch.chdir(tmp_path)
    from ppokit.cli import main

    assert main(["train", "--env", "graphenv:GraphEnv-v0", "--run-dir",
                 str(tmp_path / "r"), "--set", "n_envs=1", "n_steps=16", "batch_size=16",
                 "total_timesteps=16"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Sequence(Discrete(2)" in err
    assert not (tmp_path / "r").exists()


def test_discrete_observations_with_a_start_are_one_hot_from_the_start():
    from ppokit.policies import make_policy

    pol = make_policy(spaces.Discrete(4, start=-2), spaces.Discrete(2))
    obs = torch.tensor([-2, -1, 0, 1])
    torch.testing.assert_close(pol._features(obs), torch.eye(4))
