"""One vocabulary for both trainers: the LLM configuration's names, its presets as values,
``--set`` / ``--config`` with one resolution order, help from field metadata, deprecated
names accepted with a message."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from ppokit.algos.config import TrainConfig
from ppokit.cli import main
from ppokit.errors import UsageError
from ppokit.llm.training.config import DEPRECATED, PRESETS, LLMConfig
from ppokit.llm.training.config_values import config_from_values, config_help, parse_sets

SHARED = ("learning_rate", "n_epochs", "batch_size", "clip_range", "clip_range_vf", "vf_coef",
          "ent_coef", "max_grad_norm", "target_kl", "gamma", "gae_lambda",
          "normalize_advantage", "advantage_estimator", "use_critic", "kl_coef", "kl_target",
          "seed", "checkpoint_every")


def test_shared_quantities_have_the_environment_trainers_names():
    llm = {f.name for f in fields(LLMConfig)}
    env = {f.name for f in fields(TrainConfig)}
    for name in SHARED:
        assert name in llm and name in env, name
    for old in DEPRECATED:
        assert old not in llm


def test_every_field_is_documented_and_the_help_comes_from_the_metadata():
    text = config_help()
    for f in fields(LLMConfig):
        assert f.metadata.get("help"), f.name
        assert f"  {f.name} = " in text
    assert "lr -> learning_rate" in text


def test_presets_are_values_of_the_three_choices():
    for algo, preset in PRESETS.items():
        cfg = LLMConfig(algo=algo).resolved()
        assert cfg.advantage_estimator == preset["advantage_estimator"]
        assert cfg.use_critic == preset["use_critic"]
        assert cfg.kl_mode == preset["kl_mode"]
    assert LLMConfig(algo="dr-grpo").resolved().normalize_std is False
    # a preset's choice is just a value: GRPO's estimator with a critic-free RLOO preset
    cfg = LLMConfig(algo="rloo", advantage_estimator="grpo").resolved()
    assert cfg.advantage_estimator == "grpo" and not cfg.use_critic
    with pytest.raises(UsageError, match="advantage_estimator: 'gae' needs a critic"):
        LLMConfig(algo="grpo", advantage_estimator="gae").resolved()
    with pytest.raises(UsageError, match="advantage_estimator"):
        LLMConfig(advantage_estimator="vtrace").resolved()


def test_resolution_order_preset_toml_set_flags():
    toml = {"algo": "grpo", "clip_range": 0.3, "n_epochs": 3, "ent_coef": 0.01}
    sets = parse_sets(["clip_range=0.1", "n_epochs=4"])
    flags = {"n_epochs": 5}
    cfg = config_from_values(("--config", toml), ("--set", sets), ("flags", flags)).resolved()
    assert cfg.algo == "grpo" and cfg.agg == PRESETS["grpo"]["agg"]  # preset fills the rest
    assert cfg.ent_coef == 0.01 and cfg.clip_range == 0.1 and cfg.n_epochs == 5


def test_deprecated_names_are_accepted_with_a_message():
    said = []
    cfg = config_from_values(("--set", parse_sets(["lr=0.01", "clip_eps=0.15"], said.append)),
                             ("flags", {"epochs": 3, "minibatches": 4}), log=said.append)
    r = cfg.resolved()
    assert r.learning_rate == 0.01 and r.clip_range == 0.15 and r.n_epochs == 3
    assert r.batch_size == 64 // 4  # ppo preset: 64 sequences an iteration, 4 minibatches
    assert any("'lr' is deprecated; use 'learning_rate'" in m for m in said)
    assert any("minibatches" in m for m in said)
    with pytest.raises(UsageError, match="did you mean 'clip_range'"):
        parse_sets(["clip_rang=0.1"])
    with pytest.raises(UsageError, match="n_epochs: expected an integer"):
        parse_sets(["n_epochs=two"])


def test_cli_set_and_config_train_and_reach_the_run(tmp_path, capsys):
    toml = tmp_path / "x.toml"
    toml.write_text('[llm]\nalgo = "grpo"\nprompts_per_iter = 2\nsamples_per_prompt = 2\n'
                    'iterations = 1\nsft_steps = 2\nmax_new_tokens = 4\nn_eval_prompts = 2\n'
                    'clip_range = 0.3\n')
    rd = tmp_path / "run"
    assert main(["llm", "train", "--set", "clip_range=0.1", "--config", str(toml),
                 "--run-dir", str(rd), "--no-progress", "--no-eval", "--lr", "0.001"]) == 0
    err = capsys.readouterr().err
    assert "--lr is deprecated; use --learning-rate" in err
    cfg = json.loads((rd / "config.json").read_text())
    assert cfg["clip_range"] == 0.1 and cfg["algo"] == "grpo" and cfg["learning_rate"] == 0.001
    assert cfg["advantage_estimator"] == "grpo" and cfg["batch_size"] == 2
    # resuming may extend a run, not change it
    assert main(["llm", "train", "--resume", str(rd), "--set", "clip_range=0.2",
                 "--no-progress", "--no-eval"]) == 2
    assert "--clip-range: cannot be changed" in capsys.readouterr().err
    assert main(["llm", "train", "--resume", str(rd), "--set", "iterations=2",
                 "--no-progress", "--no-eval"]) == 0
    lines = (rd / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["iteration"] for x in lines] == [1, 2]
