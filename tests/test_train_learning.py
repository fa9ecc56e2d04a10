"""Learning tests: a run must reach a return threshold, not merely finish. Slow (minutes):
run with `pytest -m slow tests/test_train_learning.py`."""

import pytest

from ppokit.algos import Trainer, resolve_config
from ppokit.algos.evaluate import evaluate_run


def _train_and_eval(tmp_path, **over):
    cfg = resolve_config(overrides={"tensorboard": False, **over})
    rd = tmp_path / f"{cfg.env_id}-{cfg.algo}-{cfg.seed}"
    tr = Trainer(cfg, rd, log=lambda m: None)
    tr.train()
    tr.close()
    return evaluate_run(rd, episodes=10)["mean_return"]


@pytest.mark.slow
def test_cartpole_preset_reaches_475_on_at_least_4_of_5_seeds(tmp_path):
    scores = [_train_and_eval(tmp_path, env_id="CartPole-v1", seed=s) for s in range(5)]
    assert sum(s >= 475 for s in scores) >= 4, scores


@pytest.mark.slow
@pytest.mark.parametrize("algo, steps, threshold", [
    ("a2c", 200_000, 195.0), ("reinforce", 200_000, 195.0), ("ppo-kl", 100_000, 195.0)])
def test_other_presets_learn_cartpole(tmp_path, algo, steps, threshold):
    score = _train_and_eval(tmp_path, env_id="CartPole-v1", algo=algo, total_timesteps=steps)
    assert score >= threshold


@pytest.mark.slow
@pytest.mark.parametrize("env_id, threshold", [("LunarLander-v3", 200.0),
                                               ("HalfCheetah-v5", 1500.0)])
def test_zoo_presets_within_1m_steps_on_2_of_3_seeds(tmp_path, env_id, threshold):
    """Very long (LunarLander ≈ 5-8 min per seed, HalfCheetah ≈ 30-60 min per seed on a
    2-core CPU). The issue's acceptance figures."""
    pytest.importorskip("Box2D" if env_id.startswith("Lunar") else "mujoco")
    scores = [_train_and_eval(tmp_path, env_id=env_id, seed=s) for s in range(3)]
    assert sum(s >= threshold for s in scores) >= 2, scores
