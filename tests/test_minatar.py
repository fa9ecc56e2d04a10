"""MinAtar's games (the minatar extra): registered when a MinAtar/ id is asked for, read as
images (boolean object planes) by the small-image CNN, the preset; and (slow) Breakout
learning well above random play."""

from __future__ import annotations

import numpy as np
import pytest

import ppokit
from ppokit.algos import resolve_config
from ppokit.algos.config import MINATAR_PRESET
from ppokit.errors import UsageError

pytest.importorskip("minatar")  # the minatar extra (installed by `make setup`)

BREAKOUT = "MinAtar/Breakout-v1"
RANDOM_RETURN = 0.41  # random play, 200 episodes (docs/pixels.md)


def test_minatar_ids_are_registered_and_read_as_images(tmp_path):
    from ppokit.envs import make_vec
    from ppokit.policies import make_policy

    env = make_vec(BREAKOUT, 2)
    space = env.single_observation_space
    assert space.shape == (10, 10, 4) and space.dtype == np.bool_
    pol = make_policy(space, env.single_action_space, policy="auto",
                      cnn_channels=MINATAR_PRESET["cnn_channels"],
                      features_dim=MINATAR_PRESET["features_dim"])
    assert type(pol.encoder).__name__ == "SmallImageCNN"
    env.close()
    cfg = resolve_config(env_id=BREAKOUT)
    assert all(getattr(cfg, k) == v for k, v in MINATAR_PRESET.items())
    agent = ppokit.train(BREAKOUT, total_steps=2048, run_dir=tmp_path / "r", progress=False,
                         tensorboard=False, torch_threads=1)
    assert agent.evaluate(episodes=2)["episodes"] == 2
    agent.close()
    loaded = ppokit.load(tmp_path / "r")
    obs = np.zeros((10, 10, 4), bool)
    assert loaded.action_space.contains(loaded.predict(obs)[0])


def test_a_minatar_id_without_the_extra_says_which_extra(monkeypatch):
    from ppokit.envs import minatar, vec

    monkeypatch.setattr(minatar, "register", lambda: False)
    with pytest.raises(UsageError, match="needs the minatar extra") as exc:
        vec.check_env_id("MinAtar/NotAGame-v1")
    assert "\n" not in str(exc.value)


@pytest.mark.slow
def test_breakout_learns_well_above_random_play(tmp_path):
    """The preset for 262144 steps (a quarter of its budget): measured 4.8 over the last
    100 training games and 4.8 ± 1.3 in 10 deterministic games; random play 0.41."""
    agent = ppokit.train(BREAKOUT, total_steps=262_144, run_dir=tmp_path / "r", seed=0,
                         progress=False, tensorboard=False, torch_threads=1)
    assert agent.mean_training_return >= 5 * RANDOM_RETURN
    res = agent.evaluate(episodes=10)
    assert res["mean_return"] >= 5 * RANDOM_RETURN, res
    agent.close()
