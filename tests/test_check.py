"""ppokit check: every check passes on correct setups and the right one fails on a planted
bug (old log-probs recomputed each epoch, a sign error in the surrogate, gradients through
the advantages, a wrong surrogate gradient, dropout between collection and update, a mask
counting padding as actions, a model ignoring the attention mask)."""

from __future__ import annotations

import json
import tempfile

import gymnasium as gym
import pytest
import torch
from torch import nn

import ppokit.checks as checks
from ppokit.algos import resolve_config
from ppokit.algos.trainer import Trainer
from ppokit.checks import POLICY_CHECKS, collect_batch, ppo_surrogate, run_checks
from ppokit.checks.labels import check_labels_frozen
from ppokit.cli import main
from ppokit.core import clipped_surrogate_loss
from ppokit.policies import make_policy


@pytest.fixture(scope="module")
def policy():
    env = gym.make("CartPole-v1")
    torch.manual_seed(0)
    p = make_policy(env.observation_space, env.action_space)
    env.close()
    return p


@pytest.fixture(scope="module")
def batch(policy):
    return collect_batch(policy, "CartPole-v1", n=128, seed=0)


def only_failure(report, name):
    assert report.failed == [name], [(r.name, r.status, r.measured) for r in report.results]


# -- environment policies ---------------------------------------------------------------

def test_default_policy_passes(policy, batch):
    rep = run_checks(policy, batch, labels=True)
    assert rep.ok, [(r.name, r.measured) for r in rep.results]
    assert rep.names() == [*POLICY_CHECKS, "labels-frozen"]
    assert all(r.passed for r in rep.results)
    assert rep["ratio-identity"].values["max_ratio_dev"] <= 1e-6
    assert rep["zero-advantage-gradient"].values["max_grad"] == 0.0


def test_ratio_tolerance_follows_the_policys_sums_and_dtype():
    """Rounding between a step's pass and the batch's grows with the sums the policy
    computes: a Nature CNN is allowed more than CartPole's MLP, float64 the floor; a
    deviation such as dropout's (0.1 and more) stays far outside either."""
    from ppokit.checks.policy_checks import RATIO_TOL, RATIO_TOL_CAP, ratio_tolerance

    mlp = make_policy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    cnn = make_policy(gym.spaces.Box(0, 255, (4, 84, 84), "uint8"), gym.spaces.Discrete(4))
    eps = torch.finfo(torch.float32).eps
    assert ratio_tolerance(mlp) == pytest.approx(eps * 2 * (2 + 8 + 8))
    assert 1e-5 < ratio_tolerance(cnn) < 1e-4 < RATIO_TOL_CAP
    assert ratio_tolerance(mlp.double()) == RATIO_TOL


def test_gaussian_policy_passes():
    env = gym.make("Pendulum-v1")
    torch.manual_seed(1)
    p = make_policy(env.observation_space, env.action_space)
    env.close()
    assert run_checks(p, env="Pendulum-v1", n=64).ok


def test_sign_error_in_surrogate(policy, batch):
    def flipped(logp, logp_old, adv, mask=None):
        return -clipped_surrogate_loss(logp, logp_old, adv, mask).loss   # maximises the loss

    rep = run_checks(policy, batch, surrogate=flipped)
    only_failure(rep, "flipped-advantage-direction")
    r = rep["flipped-advantage-direction"]
    assert r.values["with_adv"] < 0 < r.values["with_neg_adv"]


def test_advantage_sign_error(policy, batch):
    def wrong_sign(logp, logp_old, adv, mask=None):
        return clipped_surrogate_loss(logp, logp_old, -adv, mask).loss

    only_failure(run_checks(policy, batch, surrogate=wrong_sign), "flipped-advantage-direction")


def test_extra_term_in_policy_loss(policy, batch):
    # an entropy-like term mixed into the "pure" surrogate moves the actor with Â = 0
    def with_extra(logp, logp_old, adv, mask=None):
        return clipped_surrogate_loss(logp, logp_old, adv, mask).loss + 0.01 * logp.mean()

    assert "zero-advantage-gradient" in run_checks(policy, batch, surrogate=with_extra).failed


def test_detached_ratio_breaks_finite_difference(policy, batch):
    # the ratio taken out of the graph and log π put back in: the gradient at ratio 1 is
    # right (so the direction checks pass) but it is not the derivative of the loss value
    def detached(logp, logp_old, adv, mask=None):
        ratio = torch.exp(logp - logp_old).detach()
        return -(ratio * adv * (1 + logp - logp.detach())).mean() - 0.1 * (ratio * adv).mean()

    rep = run_checks(policy, batch, surrogate=detached)
    only_failure(rep, "surrogate-finite-difference")
    assert rep["surrogate-finite-difference"].values["max_rel_error"] > 1e-3


def test_dropout_between_collection_and_update(policy):
    p = make_policy(gym.make("CartPole-v1").observation_space, gym.spaces.Discrete(2))
    p.actor = nn.Sequential(nn.Dropout(0.2), *p.actor)
    p.train()
    rep = run_checks(p, collect_batch(p, "CartPole-v1", n=128, seed=0))
    assert "ratio-identity" in rep.failed
    assert rep["ratio-identity"].values["max_ratio_dev"] > 1e-3


class RecomputedOldLogp(Trainer):
    """Bug: old log-probs recomputed from the current policy at every epoch."""

    def update_minibatch(self, mb, *args, **kwargs):
        mb = dict(mb)
        with torch.no_grad():
            mb["logp"] = self.policy.log_prob(mb["obs"], mb["actions"])
        return super().update_minibatch(mb, *args, **kwargs)


class AdvantagesWithGradient(Trainer):
    """Bug: advantages re-derived from the live critic, so gradients flow through them."""

    def update_minibatch(self, mb, *args, **kwargs):
        mb = dict(mb)
        mb["advantages"] = mb["returns"] - self.policy.value(mb["obs"])
        return super().update_minibatch(mb, *args, **kwargs)


def test_labels_frozen_catches_recomputed_old_logp(policy, batch):
    rep = run_checks(policy, batch, labels=True, trainer_cls=RecomputedOldLogp)
    only_failure(rep, "labels-frozen")
    diffs = rep["labels-frozen"].values["diffs"]
    assert diffs["logp_old"] > 1e-4 and diffs["returns"] == 0.0


def test_labels_frozen_catches_gradient_through_advantages(policy):
    r = check_labels_frozen(policy, trainer_cls=AdvantagesWithGradient)
    assert r.passed is False
    assert r.values["with_grad"] == ["advantages"]


# -- command line -----------------------------------------------------------------------

def test_cli_default_policy_passes(capsys):
    assert main(["check", "--samples", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True
    assert [r["name"] for r in out["results"]] == [*POLICY_CHECKS, "labels-frozen"]
    assert {r["status"] for r in out["results"]} == {"PASS"}


def test_cli_exit_1_on_failure(monkeypatch, capsys):
    def broken(clip_eps=0.2):
        good = ppo_surrogate(clip_eps)
        return lambda lp, lpo, adv, mask=None: -good(lp, lpo, adv, mask)

    monkeypatch.setattr(checks, "ppo_surrogate", broken)
    assert main(["check", "--samples", "64", "--no-labels"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "flipped-advantage-direction" in out


def test_cli_trained_run_dir(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--total-steps", "2048", "--run-dir", str(run), "--no-progress",
                 "--eval-episodes", "0", "--set", "tensorboard=false"]) == 0
    capsys.readouterr()
    assert main(["check", str(run), "--samples", "64"]) == 0
    out = capsys.readouterr().out
    assert "CartPole-v1" in out and "all checks passed" in out


def test_cli_bad_run_dir(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nope")]) == 2
    assert main(["check", str(tmp_path)]) == 2           # not a run directory
    err = capsys.readouterr().err
    assert err.count("ppokit check: error:") == 2


class FusedStepRecomputedOldLogp(Trainer):
    """Bug on the fused path: old log-probs recomputed right before the kernel."""

    def _minibatch_step(self):
        step = super()._minibatch_step()

        def buggy(mb, clip, kl_limit=None):
            mb = dict(mb)
            mb["logp"] = self.policy.log_prob(mb["obs"], mb["actions"]).detach()
            return step(mb, clip, kl_limit)

        return buggy


def test_labels_frozen_sees_through_the_fused_step():
    from ppokit.engine.fused import FusedStep

    tr = Trainer(resolve_config(overrides={"tensorboard": False}),
                 tempfile.mkdtemp(prefix="ppokit-test-"), log=lambda m: None)
    assert isinstance(tr._minibatch_step().__self__, FusedStep)  # the default path
    tr.close()
    assert check_labels_frozen().passed is True
    r = check_labels_frozen(trainer_cls=FusedStepRecomputedOldLogp)
    assert r.passed is False and r.values["diffs"]["logp_old"] > 1e-4
