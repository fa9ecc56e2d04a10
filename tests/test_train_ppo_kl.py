"""PPO-KL's adaptive β: adapted after each iteration from the KL between the rollout's
policy and the policy after the iteration's epochs, measured on the iteration's samples
(the PPO paper's rule), and logged as ``kl_after_update``."""

from __future__ import annotations

import pytest
import torch

from ppokit.algos import Trainer, resolve_config
from ppokit.io import read_metrics

TARGET = 1e-4


def _paper_rule(beta: float, d: float) -> float:
    """β after an update that moved the policy by ``d``: ×2 above 1.5·target, ÷2 below
    target/1.5 (PPO paper, §4)."""
    if d > 1.5 * TARGET:
        return beta * 2
    if d < TARGET / 1.5:
        return beta / 2
    return beta


@pytest.mark.parametrize("lr", [3e-3, 3e-5])
def test_beta_adapts_from_the_kl_after_each_iterations_update(tmp_path, lr):
    """Two iterations, β and the measured KL computed here by hand from each rollout's
    frozen log-probabilities and the policy the iteration ended with. One minibatch, one
    epoch: the update's own approx_kl (measured before the step) is 0 there, so a β driven
    by it would halve every time; the KL after the step is what moves β."""
    cfg = resolve_config(overrides=dict(
        algo="ppo-kl", env_id="CartPole-v1", n_envs=2, n_steps=64, batch_size=128,
        n_epochs=1, total_timesteps=128 * 2, kl_coef=1.0, kl_target=TARGET,
        learning_rate=lr, tensorboard=False, checkpoint_every=100, seed=3))
    tr = Trainer(cfg, tmp_path / "run", log=lambda m: None)
    rollouts = []
    collect = tr.collector.collect

    def keep(n):
        rollouts.append(collect(n))
        return rollouts[-1]

    tr.collector.collect = keep
    beta, seen = 1.0, []
    for _ in range(2):
        rec = tr.iterate()
        seen.append(rec["kl_after_update"])
        flat = rollouts[-1].flat()
        with torch.no_grad():
            logp, _, _ = tr.policy.evaluate(flat["obs"], flat["actions"])
        log_ratio = (logp - flat["logp"]).double()
        d = float((log_ratio.exp() - 1 - log_ratio).mean())  # k3 of KL(π_old ‖ π)
        assert rec["kl_coef"] == beta  # the β this iteration's update used
        assert rec["kl_after_update"] == pytest.approx(d, rel=1e-5, abs=1e-10)
        assert abs(rec["approx_kl"]) < 1e-6  # before the one step: the old policy
        beta = _paper_rule(beta, d)
        assert tr.kl_ctl.value == beta
    tr.close()
    recs = read_metrics(tmp_path / "run")  # its own metric in metrics.jsonl
    assert [r["kl_after_update"] for r in recs] == seen
    # a large step moves the policy past the band (β doubles for the second iteration), a
    # tiny one stays below it (β halves)
    assert recs[1]["kl_coef"] == (2.0 if lr == 3e-3 else 0.5)


def test_kl_after_update_is_logged_only_for_ppo_kl(tmp_path):
    cfg = resolve_config(overrides=dict(env_id="CartPole-v1", n_envs=2, n_steps=32,
                                        batch_size=64, total_timesteps=64, tensorboard=False))
    tr = Trainer(cfg, tmp_path / "run", log=lambda m: None)
    assert tr.iterate()["kl_after_update"] is None
    tr.close()
