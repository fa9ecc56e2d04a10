"""A policy loss and an advantage estimator of the user's (tests/_toy_recipe.py, outside
ppokit's source) train from both ``ppokit train`` and ``ppokit llm train``; the step form
of an estimator serves the token trainer exactly as its native token form does."""

import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ppokit import core
from ppokit.cli import main
from ppokit.core.registry import tokens_as_steps

ENV_RUN = ["--total-steps", "1024", "--num-envs", "4", "--set", "n_steps=128",
           "batch_size=128", "n_epochs=2", "tensorboard=false", "--eval-episodes", "0",
           "--no-progress"]
LLM_RUN = ["--algo", "grpo", "--set", "prompts_per_iter=2", "samples_per_prompt=2",
           "iterations=2", "sft_steps=2", "max_new_tokens=4", "n_eval_prompts=2",
           "--no-progress", "--no-eval"]


def _clean() -> None:
    """Forget the user's module and its registrations, as a new process would."""
    import sys

    core.POLICY_LOSSES.unregister("toy_tanh")
    core.ADVANTAGES.unregister("toy_mc")
    sys.modules.pop("_toy_recipe", None)


@pytest.fixture
def toy():
    """The user's module as ``--import`` leaves it (a function: it exists only after the
    command imported it); forgotten before and after each test."""
    import sys

    _clean()
    yield lambda: sys.modules["_toy_recipe"]
    _clean()


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_env_training_with_the_users_policy_loss_and_estimator(tmp_path, toy, capsys):
    rd = tmp_path / "loss"
    assert main(["train", "--import", "_toy_recipe", "--set", "policy_loss=toy_tanh",
                 "--run-dir", str(rd), *ENV_RUN]) == 0
    mod = toy()
    assert mod.CALLS["loss"] == 2 * 2 * 4  # 2 iterations x 2 epochs x 4 minibatches of 128
    rows = _rows(rd / "metrics.jsonl")
    assert len(rows) == 2
    assert all(math.isfinite(r["policy_loss"]) for r in rows)
    assert all(r["approx_kl"] >= 0 for r in rows)  # measured by the engine
    assert all(r["clipfrac"] is None for r in rows)  # a statistic the loss does not define
    assert json.loads((rd / "config.json").read_text())["policy_loss"] == "toy_tanh"

    rd2 = tmp_path / "estimator"
    assert main(["train", "--import", "_toy_recipe", "--set", "advantage_estimator=toy_mc",
                 "--run-dir", str(rd2), *ENV_RUN]) == 0
    assert mod.CALLS["estimator"] == 2
    assert all(math.isfinite(r["value_loss"]) for r in _rows(rd2 / "metrics.jsonl"))


def test_llm_training_with_the_users_policy_loss_and_estimator(tmp_path, toy):
    rd = tmp_path / "loss"
    assert main(["llm", "train", "--import", "_toy_recipe", "--set", "policy_loss=toy_tanh",
                 "--run-dir", str(rd), *LLM_RUN]) == 0
    mod = toy()
    assert mod.CALLS["loss"] > 0
    rd2 = tmp_path / "estimator"
    assert main(["llm", "train", "--import", "_toy_recipe", "--set",
                 "advantage_estimator=toy_mc", "--run-dir", str(rd2), *LLM_RUN]) == 0
    assert mod.CALLS["estimator"] == 2
    cfg = json.loads((rd2 / "config.json").read_text())
    assert cfg["advantage_estimator"] == "toy_mc" and cfg["policy_loss"] == "clip"


def test_without_the_import_the_error_names_the_flag_and_reading_needs_none(tmp_path, toy,
                                                                           capsys):
    assert main(["train", "--set", "policy_loss=toy_tanh", "--run-dir", str(tmp_path / "x"),
                 *ENV_RUN]) == 2
    err = capsys.readouterr().err
    assert "policy_loss: expected one of cispo, clip, gspo, gspo_token, kl_penalty, vanilla" in err
    assert "--import MODULE" in err and not (tmp_path / "x").exists()
    rd = tmp_path / "run"
    assert main(["train", "--import", "_toy_recipe", "--set", "policy_loss=toy_tanh",
                 "--run-dir", str(rd), *ENV_RUN]) == 0
    _clean()  # a new process, which did not import it
    # reading the run (evaluating, reporting) needs no loss of the user's
    assert main(["eval", str(rd), "--episodes", "1"]) == 0
    assert main(["report", str(rd)]) in (0, 1)
    # training it does: resume names the module again
    ckpts = sorted((rd / "checkpoints").iterdir())
    assert ckpts
    capsys.readouterr()
    assert main(["train", "--resume", str(rd)]) == 2
    err = capsys.readouterr().err
    assert "policy_loss: 'toy_tanh' is not a registered policy loss" in err
    assert "ppokit train --resume RUN_DIR --import MODULE" in err
    assert main(["train", "--resume", str(rd), "--import", "_toy_recipe"]) == 0


def test_an_unimportable_module_is_named(capsys):
    assert main(["train", "--import", "no_such_mod_xyz"]) == 2
    assert "--import: cannot import module 'no_such_mod_xyz'" in capsys.readouterr().err
    assert main(["llm", "train", "--import", "bad-name"]) == 2
    assert "--import: expected a Python module name" in capsys.readouterr().err


def test_a_loss_that_returns_no_policy_loss_is_named(tmp_path):
    @core.register_policy_loss("toy_bad")
    def bad(spec, logp, logp_old, advantages, mask=None, **agg):
        return (logp * advantages).mean()

    try:
        with pytest.raises(TypeError, match="policy loss 'toy_bad': expected a PolicyLoss"):
            main(["train", "--set", "policy_loss=toy_bad", "--run-dir", str(tmp_path / "r"),
                  *ENV_RUN])
    finally:
        core.POLICY_LOSSES.unregister("toy_bad")


@st.composite
def _completions(draw):
    b = draw(st.integers(1, 5))
    length = draw(st.integers(1, 7))
    mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=length,
                                                max_size=length), min_size=b, max_size=b)))
    fl = st.floats(-3, 3, allow_nan=False, width=32)
    rewards = torch.tensor(draw(st.lists(st.lists(fl, min_size=length, max_size=length),
                                         min_size=b, max_size=b)))
    values = torch.tensor(draw(st.lists(st.lists(fl, min_size=length, max_size=length),
                                        min_size=b, max_size=b)))
    boot = (torch.tensor(draw(st.lists(fl, min_size=b, max_size=b)))
            if draw(st.booleans()) else None)
    gamma = draw(st.sampled_from([1.0, 0.9, 0.5]))
    lam = draw(st.sampled_from([1.0, 0.95, 0.0]))
    return core.TokenSteps(rewards, values, mask, boot), core.AdvantageSpec(gamma, lam)


@given(_completions())
def test_step_form_on_tokens_equals_the_native_token_form(case):
    """GAE's step form on each completion's action tokens (tokens_as_steps) is token GAE,
    masked spans skipped, empty rows zero, a bootstrap after the last action."""
    ts, spec = case
    entry = core.ADVANTAGES.entry("gae")
    native_adv, native_ret = core.token_gae(ts.rewards, ts.values, ts.mask, spec.gamma,
                                            spec.gae_lambda, bootstrap_values=ts.bootstrap)
    stepwise = core.registry.Entry("gae_steps", entry.fn, meta={"layout": "steps"})
    adv, ret = core.token_advantages(stepwise, ts, spec)
    m = ts.mask
    assert torch.allclose(adv[m], native_adv[m], atol=1e-5)
    assert torch.allclose(ret[m], native_ret[m], atol=1e-5)
    assert bool((adv[~m] == 0).all())


@given(_completions())
def test_reward_to_go_on_tokens_is_reinforce_pps_return(case):
    """reward_to_go's step form on tokens with zero values: REINFORCE++'s per-token return
    (before its whitening), so one estimator serves both trainers."""
    ts, spec = case
    zero = core.TokenSteps(ts.rewards, torch.zeros_like(ts.values), ts.mask, None)
    adv, ret = core.token_advantages(core.ADVANTAGES.entry("reward_to_go"), zero, spec)
    _, expected = core.token_gae(ts.rewards, torch.zeros_like(ts.rewards), ts.mask,
                                 spec.gamma, 1.0)
    m = ts.mask
    assert torch.allclose(ret[m], expected[m], atol=1e-5)
    assert torch.allclose(adv[m], expected[m], atol=1e-5)


@given(_completions())
def test_the_toy_estimator_is_reward_to_go(case):
    """The user's plain-loop estimator agrees with ppokit's reward_to_go on the packed
    layout (episode ends, bootstraps and empty steps alike)."""
    import importlib

    ts, spec = case
    _clean()
    mod = importlib.import_module("_toy_recipe")
    try:
        steps, _, _ = tokens_as_steps(ts)
        a1, r1 = mod.toy_mc(steps, spec)
        a2, r2 = core.ADVANTAGES.get("reward_to_go")(steps, spec)
        assert torch.allclose(r1, r2, atol=1e-4) and torch.allclose(a1, a2, atol=1e-4)
    finally:
        _clean()


class TinyExtractor(torch.nn.Module):
    """A user's features extractor in Stable-Baselines3's shape: ``(observation_space,
    features_dim)``, a ``features_dim`` attribute; counts its forward passes."""

    calls = 0

    def __init__(self, observation_space, features_dim: int = 16):
        super().__init__()
        n = int(torch.tensor(observation_space.shape).prod())
        self.features_dim = 16
        self.net = torch.nn.Sequential(torch.nn.Linear(n, 16), torch.nn.Tanh())

    def forward(self, obs):
        TinyExtractor.calls += 1
        return self.net(obs.reshape(obs.shape[0], -1).float())


def test_a_users_features_extractor_trains_evaluates_and_predicts(tmp_path):
    import numpy as np

    import ppokit
    from ppokit.policies.encoders import FEATURES_EXTRACTORS

    name = f"{__name__}.TinyExtractor"
    FEATURES_EXTRACTORS.unregister(name)
    try:
        agent = ppokit.train("CartPole-v1", total_steps=1024, run_dir=tmp_path / "r",
                             policy=TinyExtractor, n_envs=4, n_steps=128, batch_size=128,
                             n_epochs=2, tensorboard=False, progress=False)
        assert TinyExtractor.calls > 0
        assert isinstance(agent.policy.encoder, TinyExtractor)
        cfg = json.loads((tmp_path / "r" / "config.json").read_text())
        assert cfg["policy"] == name
        before = TinyExtractor.calls
        loaded = ppokit.load(tmp_path / "r")  # registered in this process: loads as trained
        action, _ = loaded.predict(np.zeros(4, dtype=np.float32), deterministic=True)
        assert int(action) in (0, 1) and TinyExtractor.calls > before
        FEATURES_EXTRACTORS.unregister(name)  # a process that never registered it
        with pytest.raises(Exception, match="register_features_extractor"):
            ppokit.load(tmp_path / "r")
    finally:
        FEATURES_EXTRACTORS.unregister(name)


def test_extractor_names_are_checked():
    import gymnasium as gym

    from ppokit.errors import UserCodeError
    from ppokit.policies import make_policy
    from ppokit.policies.encoders import FEATURES_EXTRACTORS, register_features_extractor

    with pytest.raises(ValueError, match="ppokit's own"):
        register_features_extractor("cnn", TinyExtractor)
    register_features_extractor("toy_bad_extractor", lambda space, features_dim: "x")
    try:
        with pytest.raises(UserCodeError, match="expected a torch.nn.Module"):
            make_policy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2),
                        policy="toy_bad_extractor")
    finally:
        FEATURES_EXTRACTORS.unregister("toy_bad_extractor")
