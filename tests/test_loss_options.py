"""A policy loss and an advantage estimator with options of their own, declared at their
registration, in ONE module of the user's (written to a temporary directory, outside
ppokit's source), set with ``--set loss_options.NAME=VALUE`` / ``advantage_options.NAME=``
on both command lines and from Python; each value is the one the function received."""

import json
import pickle
import sys
import textwrap

import pytest

from ppokit import core
from ppokit.cli import main
from ppokit.errors import UsageError

MODULE = "user_recipe_with_options"
SOURCE = textwrap.dedent('''
    """A loss with its own hyperparameter and an estimator with its own option."""
    import torch

    import ppokit
    from ppokit.core import PolicyLoss, aggregate, gae

    SEEN = {"beta": [], "shift": [], "mean_adv": []}


    @ppokit.register_policy_loss("quad_trust", options={"beta": 0.1, "verbose": False})
    def quad_trust(spec, logp, logp_old, advantages, mask=None, **agg):
        """-ratio * A plus beta * (ratio - 1)^2: a quadratic trust region of weight beta."""
        beta = spec.options["beta"]
        SEEN["beta"].append(beta)
        ratio = torch.exp(logp - logp_old)
        per = -ratio * advantages + beta * (ratio - 1.0) ** 2
        if mask is not None:
            per = torch.where(mask, per, torch.zeros((), dtype=per.dtype))
        return PolicyLoss(loss=aggregate(per, mask, **agg), per_sample=per, ratio=ratio)


    @ppokit.register_advantage_estimator("shifted_gae", options={"shift": 0.0, "lam": 0.9})
    def shifted_gae(steps, spec):
        """GAE with the estimator's own lambda, every advantage moved by shift."""
        SEEN["shift"].append(spec.options["shift"])
        adv, ret = gae(steps.rewards, steps.values, steps.next_values, steps.terminated,
                       steps.episode_end, spec.gamma, spec.options["lam"])
        adv = adv + spec.options["shift"]
        SEEN["mean_adv"].append(float(adv.mean()))
        return adv, ret
''')

ENV_RUN = ["--total-steps", "512", "--num-envs", "2", "--eval-episodes", "0",
           "--no-progress", "--set", "n_steps=128", "batch_size=128", "n_epochs=1",
           "tensorboard=false"]
LLM_RUN = ["--algo", "grpo", "--no-progress", "--no-eval", "--set", "prompts_per_iter=2",
           "samples_per_prompt=2", "iterations=2", "sft_steps=2", "max_new_tokens=4",
           "n_eval_prompts=2"]


def _forget() -> None:
    """As a new process would: the module and its registrations gone."""
    core.POLICY_LOSSES.unregister("quad_trust")
    core.ADVANTAGES.unregister("shifted_gae")
    sys.modules.pop(MODULE, None)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """The module file in a directory of its own, the current one (``--import`` searches
    it first); a function returning the imported module's record of what it saw."""
    src = tmp_path / "code"
    src.mkdir()
    (src / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.chdir(src)
    monkeypatch.syspath_prepend(str(src))
    _forget()
    yield lambda: sys.modules[MODULE].SEEN
    _forget()


def _metrics(rd):
    rows = [json.loads(line) for line in (rd / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("sps", "time")} for r in rows]


def test_env_cli_options_reach_the_loss_and_the_estimator_and_resume(tmp_path, user_module):
    options = ["policy_loss=quad_trust", "loss_options.beta=0.3",
               "advantage_estimator=shifted_gae", "advantage_options.shift=2",
               "advantage_options.lam=0.5"]
    rd = tmp_path / "env"
    assert main(["train", "--import", MODULE, "--run-dir", str(rd), *ENV_RUN, *options]) == 0
    seen = user_module()
    # 2 iterations of 256 steps: 2 estimates, 2 x 1 epoch x 2 minibatches of 128
    assert seen["beta"] == [0.3] * 4
    assert seen["shift"] == [2.0, 2.0]  # the text "2" read as the default's type, float
    saved = json.loads((rd / "config.json").read_text())
    assert saved["loss_options"] == {"beta": 0.3}
    assert saved["advantage_options"] == {"shift": 2.0, "lam": 0.5}
    # resumed: the options come back from the run directory, not from the command line,
    # and the run continues as one trained straight to the new total
    seen["beta"].clear()
    assert main(["train", "--resume", str(rd), "--import", MODULE, "--total-steps", "1024",
                 "--no-progress", "--eval-episodes", "0"]) == 0
    assert seen["beta"] == [0.3] * 4 and seen["shift"][-2:] == [2.0, 2.0]


def test_resume_with_options_is_exact(tmp_path, user_module):
    """Interrupted after a checkpoint and resumed, a run with options gives the metrics
    of the run trained without a stop (the options read back from its directory)."""
    from ppokit.algos import resolve_config
    from ppokit.algos.trainer import Trainer

    __import__(MODULE)
    cfg = resolve_config(overrides={
        "n_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 1, "total_timesteps": 512,
        "checkpoint_every": 2, "tensorboard": False, "policy_loss": "quad_trust",
        "loss_options": {"beta": 0.05}, "advantage_estimator": "shifted_gae",
        "advantage_options": {"shift": 0.5}})
    full = Trainer(cfg, tmp_path / "full", log=lambda m: None)
    full.train()
    full.close()
    part = Trainer(cfg, tmp_path / "part", log=lambda m: None)
    for _ in range(3):  # one iteration past the checkpoint, then "crash"
        part.iterate()
    part.metrics.close()
    part.close()
    seen = user_module()
    seen["beta"].clear()
    seen["shift"].clear()
    from ppokit.algos.runs import open_run

    resumed = Trainer(open_run(tmp_path / "part", None, "--resume").cfg, tmp_path / "part",
                      resume=True, log=lambda m: None)
    assert resumed.iteration == 2
    resumed.train()
    resumed.close()
    assert seen["beta"] == [0.05] * 4 and seen["shift"] == [0.5, 0.5]
    assert len(_metrics(tmp_path / "full")) == 4
    assert _metrics(tmp_path / "part") == _metrics(tmp_path / "full")


def test_the_option_changes_what_the_estimator_computes(user_module):
    """A shift of 5 moves every advantage by exactly 5 against a shift of 0 (the same
    rollout: the estimate comes before any update)."""
    import tempfile

    from ppokit.algos import resolve_config
    from ppokit.algos.trainer import Trainer

    __import__(MODULE)
    means = []
    for shift in (0.0, 5.0):
        cfg = resolve_config(overrides={"n_envs": 2, "n_steps": 64, "total_timesteps": 128,
                                        "batch_size": 128, "advantage_estimator": "shifted_gae",
                                        "advantage_options": {"shift": shift},
                                        "tensorboard": False})
        with tempfile.TemporaryDirectory() as d:
            tr = Trainer(cfg, d)
            try:
                tr.iterate()
            finally:
                tr.close()
        means.append(user_module()["mean_adv"][-1])
    assert means[1] - means[0] == pytest.approx(5.0, abs=1e-5)


def test_llm_cli_options_reach_the_loss_and_the_estimator(tmp_path, user_module):
    rd = tmp_path / "llm"
    assert main(["llm", "train", "--import", MODULE, "--run-dir", str(rd), *LLM_RUN,
                 "policy_loss=quad_trust", "loss_options.beta=0.7",
                 "advantage_estimator=shifted_gae", "advantage_options.shift=-1.5"]) == 0
    seen = user_module()
    assert seen["beta"] and set(seen["beta"]) == {0.7}
    assert seen["shift"] == [-1.5, -1.5]  # one estimate per iteration
    saved = json.loads((rd / "config.json").read_text())
    assert saved["loss_options"] == {"beta": 0.7}
    assert saved["advantage_options"] == {"shift": -1.5}
    from ppokit.llm.training.runfiles import config_from_run

    resumed = config_from_run(str(rd)).resolved()  # what `ppokit llm train --resume` reads
    assert resumed.loss_options == {"beta": 0.7}
    assert resumed.advantage_options == {"shift": -1.5}


@pytest.mark.parametrize("cmd", [["train"], ["llm", "train"]])
@pytest.mark.parametrize("item, named, said", [
    ("loss_options.betta=1", "loss_options.betta", "its options: beta, verbose"),
    ("loss_options.beta=abc", "loss_options.beta", "expected a finite number"),
    ("loss_options.verbose=2", "loss_options.verbose", "expected true or false"),
    ("advantage_options.beta=1", "advantage_options.beta", "its options: shift, lam"),
])
def test_refusals_name_the_option(tmp_path, user_module, capsys, cmd, item, named, said):
    assert main([*cmd, "--import", MODULE, "--run-dir", str(tmp_path / "r"), "--no-progress",
                 "--set", "policy_loss=quad_trust", "advantage_estimator=shifted_gae",
                 item]) == 2
    err = capsys.readouterr().err
    assert named in err and said in err
    assert not (tmp_path / "r").exists()


def test_a_built_in_part_declares_no_options(tmp_path, capsys):
    assert main(["train", "--run-dir", str(tmp_path / "r"), "--set",
                 "loss_options.beta=0.3"]) == 2
    assert "loss_options.beta: not an option of the policy loss 'clip' (it declares no " \
           "options)" in capsys.readouterr().err


def test_from_python_and_json(tmp_path, user_module):
    import ppokit

    __import__(MODULE)
    agent = ppokit.train("CartPole-v1", total_steps=256, run_dir=tmp_path / "py", n_envs=2,
                         n_steps=128, batch_size=256, n_epochs=1, tensorboard=False,
                         progress=False, policy_loss="quad_trust",
                         loss_options={"beta": 2})  # an integer is a number
    assert user_module()["beta"] == [2.0]
    assert agent.cfg.loss_options == {"beta": 2.0}
    with pytest.raises(UsageError, match=r"loss_options\.beta: expected a finite number"):
        ppokit.train("CartPole-v1", run_dir=tmp_path / "bad", policy_loss="quad_trust",
                     loss_options={"beta": [1]})
    with pytest.raises(UsageError, match=r"loss_options: expected a table"):
        ppokit.train("CartPole-v1", run_dir=tmp_path / "bad", policy_loss="quad_trust",
                     loss_options=3)
    from ppokit.llm.training.config import LLMConfig

    llm = LLMConfig(policy_loss="quad_trust", loss_options={"beta": 1}).resolved()
    assert llm.loss_options == {"beta": 1.0} and isinstance(llm.loss_options["beta"], float)
    with pytest.raises(UsageError, match=r"advantage_options\.lam: not an option of the "
                                         r"advantage estimator 'grpo'"):
        LLMConfig(algo="grpo", advantage_options={"lam": 0.5}).resolved()
    from ppokit.algos.config import parse_sets

    # the JSON form and the dotted form merge, later items winning
    assert parse_sets(['loss_options={"beta": 1.0, "verbose": true}',
                       "loss_options.beta=0.5"]) == {
        "loss_options": {"beta": "0.5", "verbose": True}}


def test_declarations_are_checked():
    with pytest.raises(ValueError, match="option 'beta': a default of type bool, int, float "
                                         "or str"):
        core.register_policy_loss("bad_opts", lambda *a, **k: None, options={"beta": None})
    with pytest.raises(ValueError, match="identifier"):
        core.register_advantage_estimator("bad_opts", lambda *a: None, options={"a-b": 1})
    assert "bad_opts" not in core.POLICY_LOSSES and "bad_opts" not in core.ADVANTAGES


def test_the_spec_carries_read_only_options_and_the_kernels_step_aside():
    from ppokit.engine import UpdateSpec
    from ppokit.engine.fused import supports
    from ppokit.policies import make_policy

    spec = UpdateSpec(options={"beta": 0.3})
    with pytest.raises(TypeError):
        spec.options["beta"] = 1.0
    assert pickle.loads(pickle.dumps(spec)) == spec and hash(spec) == hash(
        UpdateSpec(options={"beta": 0.3}))
    assert spec.with_values(clip_range=0.1).options == {"beta": 0.3}
    import gymnasium as gym

    policy = make_policy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    assert supports(UpdateSpec(), policy) is None
    assert "options" in supports(spec, policy)


def test_an_extractor_with_an_lstm_is_refused_by_name():
    import torch

    import ppokit
    from ppokit.policies.encoders import FEATURES_EXTRACTORS, register_features_extractor

    class Flat(torch.nn.Module):
        def __init__(self, observation_space, features_dim: int = 8):
            super().__init__()
            self.features_dim = 8
            self.net = torch.nn.Linear(4, 8)

        def forward(self, obs):
            return self.net(obs.float())

    register_features_extractor("toy_lstm_extractor", Flat)
    try:
        with pytest.raises(UsageError, match=r"recurrent: lstm runs on the MLP encoder.*"
                                              r"'toy_lstm_extractor' \(a features extractor"):
            ppokit.train("CartPole-v1", policy="toy_lstm_extractor", recurrent="lstm",
                         progress=False)
    finally:
        FEATURES_EXTRACTORS.unregister("toy_lstm_extractor")
