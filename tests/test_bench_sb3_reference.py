"""The equal-budget Stable-Baselines3 reference of bench.learning (bench/learning_sb3.py):
the same network as ppokit's small-image CNN, ppokit's preset values in SB3's PPO, and the
table's reference column built from its result files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from bench import learning as L
from bench.learning_table import SB3_SOURCE, sb3_reference, write_table
from bench.learning_tasks import Task, slug, task
from gymnasium import spaces
from torch import nn

from ppokit.algos.presets import MINATAR_PRESET
from ppokit.errors import UsageError
from ppokit.policies import policy_for_config

BUDGET = 1_000_000


class Planes(gym.Env):
    """MinAtar's spaces without the game: 10×10×C boolean planes, three actions."""

    def __init__(self, channels: int = 4):
        self.observation_space = spaces.Box(0, 1, (10, 10, channels), bool)
        self.action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.random(self.observation_space.shape) < 0.2, {}

    def step(self, action):
        obs = self.np_random.random(self.observation_space.shape) < 0.2
        return obs, float(action == 1), bool(self.np_random.random() < 0.05), False, {}


def _model(channels: int = 4):
    sb = pytest.importorskip("bench.learning_sb3")
    cfg = sb.preset_config(task("minatar-breakout"), seed=3)
    return sb, cfg, sb.build_model(cfg, lambda: Planes(channels), BUDGET)


def _layers(modules) -> list[tuple]:
    """Each layer in order: its kind and, for weighted ones, weight shape, kernel, stride
    and padding."""
    out = []
    for m in modules:
        if isinstance(m, nn.Conv2d):
            out.append(("conv", tuple(m.weight.shape), m.kernel_size, m.stride, m.padding))
        elif isinstance(m, nn.Linear):
            out.append(("linear", tuple(m.weight.shape)))
        elif not isinstance(m, nn.Sequential) and type(m).__module__.startswith("torch"):
            out.append((type(m).__name__,))
    return out


@pytest.mark.parametrize("channels", [4, 10])  # Breakout; Seaquest's 10×10×10 (a tie)
def test_the_sb3_network_is_ppokits_small_image_cnn(channels):
    sb, cfg, model = _model(channels)
    twin = sb.ppokit_twin(model, cfg)  # ppokit's own network for the preset (and the weights)
    pol = model.policy
    assert sum(p.numel() for p in pol.parameters()) == sum(p.numel() for p in twin.parameters())
    sb3_trunk = _layers(pol.features_extractor.modules())
    assert sb3_trunk == _layers(twin.encoder.modules())
    assert [x[0] for x in sb3_trunk] == ["conv", "ReLU", "conv", "ReLU", "conv", "ReLU",
                                         "Flatten", "linear", "ReLU"]
    assert sb3_trunk[0][1:] == ((16, channels, 3, 3), (3, 3), (1, 1), (0, 0))
    assert sb3_trunk[-2] == ("linear", (256, 32 * 4 * 4))
    assert _layers([pol.mlp_extractor.policy_net, pol.action_net]) == _layers(twin.actor)
    assert _layers([pol.mlp_extractor.value_net, pol.value_net]) == _layers(twin.critic)
    assert pol.pi_features_extractor is pol.vf_features_extractor  # one shared trunk
    # the same initialisation: orthogonal with the same gains (√2 trunk, 0.01 actor,
    # 1 critic), so every weight matrix of SB3's network and of one ppokit initialised
    # has the same singular values
    own = policy_for_config(cfg, model.observation_space, model.action_space)
    ws = [m.weight for m in pol.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    wp = [m.weight for m in own.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    for a, b in zip(ws, wp, strict=True):
        sa = torch.linalg.svdvals(a.detach().reshape(a.shape[0], -1))
        sp = torch.linalg.svdvals(b.detach().reshape(b.shape[0], -1))
        assert torch.allclose(sa, sp, rtol=1e-4, atol=1e-6)
    # the same function: planes as the environments give them, same log-probs and values
    obs = torch.from_numpy(np.random.default_rng(0).random((6, 10, 10, channels)) < 0.3)
    acts = torch.tensor([0, 1, 2, 0, 1, 2])
    with torch.no_grad():
        v, logp, ent = pol.evaluate_actions(obs.float(), acts)
        logp2, ent2, v2 = twin.evaluate(obs.float(), acts)
    assert torch.allclose(logp, logp2, atol=1e-5) and torch.allclose(ent, ent2, atol=1e-5)
    assert torch.allclose(v.squeeze(-1), v2, atol=1e-5)


def test_each_preset_value_lands_in_sb3s_ppo():
    sb, cfg, model = _model()
    pol = model.policy
    rollout = 8 * 128
    first = 1 - rollout / BUDGET  # SB3's progress at its first update
    seen = {
        "n_envs": model.n_envs, "n_steps": model.n_steps, "n_epochs": model.n_epochs,
        "batch_size": model.batch_size, "learning_rate": model.lr_schedule(first),
        "lr_schedule": "linear" if model.lr_schedule(0.5 - rollout / BUDGET) == pytest.approx(
            0.5 * model.lr_schedule(first)) else "constant",
        "clip_range": model.clip_range(first),
        "clip_schedule": "linear" if model.clip_range(0.25 - rollout / BUDGET) ==
        pytest.approx(0.25 * model.clip_range(first)) else "constant",
        "ent_coef": model.ent_coef, "vf_coef": model.vf_coef, "gamma": model.gamma,
        "gae_lambda": model.gae_lambda, "max_grad_norm": model.max_grad_norm,
        "policy": "cnn" if isinstance(pol.features_extractor, sb.MinAtarCNN) else "?",
        "cnn_channels": tuple(m.out_channels for m in pol.features_extractor.modules()
                              if isinstance(m, nn.Conv2d)),
        "features_dim": pol.features_dim, "net_arch": tuple(pol.net_arch),
    }
    assert seen.keys() == MINATAR_PRESET.keys() - {"total_timesteps"}  # every key checked
    for key, value in seen.items():
        assert value == pytest.approx(MINATAR_PRESET[key]) if isinstance(value, float) \
            else value == MINATAR_PRESET[key], key
    # ppokit's schedule: the progress before the rollout (SB3 reads it after), never below
    # zero: the last of 977 iterations starts at step 999,424 and ends past the budget
    assert model.lr_schedule(1 - 977 * rollout / BUDGET) == pytest.approx(
        5e-4 * (1 - 976 * rollout / BUDGET))
    assert model.clip_range(-0.5) == 0.0
    # the defaults the preset leaves to ppokit, as ppokit has them
    assert pol.optimizer.param_groups[0]["eps"] == cfg.optimizer_eps == 1e-5
    assert model.normalize_advantage and model.clip_range_vf is None and model.target_kl is None
    assert pol.ortho_init and pol.share_features_extractor
    assert model.seed == 3 and model.device.type == "cpu"
    with pytest.raises(UsageError, match="target_kl"):
        sb.ppo_arguments(dataclasses.replace(cfg, target_kl=0.01), BUDGET)
    with pytest.raises(UsageError, match="normalize_obs"):
        sb.ppo_arguments(dataclasses.replace(cfg, normalize_obs=True), BUDGET)


def _result(d: Path, t: Task, seed: int, final: float, budget: int) -> None:
    p = d / slug(t) / f"seed{seed}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"task": t.name, "seed": seed, "budget": budget, "steps": budget,
                             "wall_s": 100.0, "final": {"mean": final},
                             "curve": [[budget, final, 100.0]]}))


def test_table_reference_column_from_sb3_result_files(tmp_path, monkeypatch):
    t = task("minatar-breakout")
    ours, sb3 = tmp_path / "results", tmp_path / "results_sb3"
    for s, v in enumerate((5.0, 6.0, 7.0)):
        _result(sb3, t, s, v, t.steps)
    _result(sb3, t, 3, 100.0, 20_480)  # a reduced smoke run: never in the table
    ref = sb3_reference(sb3, t)
    assert ref["n_seeds"] == 3 and ref["mean"] == 6.0 and ref["std"] == 1.0
    assert ref["low"] == pytest.approx(6.0 - 4.303 / 3 ** 0.5)
    assert sb3_reference(tmp_path / "none", t) is None
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"sources": {"g": {"project": "G"}}, "rows": [
        {"task": t.env_id, "source": "g", "mean": 28.0, "std": None, "n_seeds": 1,
         "budget_steps": 10_000_000}]}))
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- table:begin -->\n<!-- table:end -->\n")
    monkeypatch.setattr("bench.learning_table.figure", lambda *a: None)

    def row(finals):
        for s, v in enumerate(finals):
            _result(ours, t, s, v, t.steps)
        write_table(ours, refs, doc, tmp_path / "f.png", sb3_results=sb3)
        return next(x for x in doc.read_text().splitlines() if SB3_SOURCE in x)

    # ppokit 3.5-3.7: interval [3.352, 3.848] reaches the SB3 interval's lower end 3.516
    # (not its mean less its standard deviation, 5.0): within
    assert (f"| {SB3_SOURCE}: 6.000 ± 1.000 (3) [3.516, 8.484], {t.steps:,} | 0.60 | yes |"
            in row((3.5, 3.6, 3.7)))
    assert "| 0.50 | **no** |" in row((2.9, 3.0, 3.1))  # upper end 3.248 < 3.516
    assert "| 1.33 | yes |" in row((7.9, 8.0, 8.1))  # above
    assert "G: 28.0 (1), 10,000,000" in doc.read_text()  # the published row stays
    write_table(ours, refs, doc, tmp_path / "f.png")  # no SB3 results given: no column
    assert SB3_SOURCE not in doc.read_text()


def test_sb3_command_refuses_other_tasks_and_keeps_full_results(tmp_path, capsys,
                                                                  monkeypatch):
    sb = pytest.importorskip("bench.learning_sb3")
    monkeypatch.setattr(sb, "installed", lambda t: True)  # (whether minatar is here or not)
    assert L.main(["sb3", "--tasks", "cartpole"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CartPole" in err and "MinAtar and MuJoCo" in err
    assert L.main(["sb3", "--tasks", "minatar-breakout", "--seeds", "x"]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert L.main(["sb3", "--tasks", "minatar-nope"]) == 2
    assert "unknown task" in capsys.readouterr().err
    monkeypatch.setattr(sb, "installed", lambda t: False)
    assert L.main(["sb3", "--tasks", "minatar-breakout"]) == 2
    assert "minatar extra" in capsys.readouterr().err
    t = task("minatar-breakout")
    _result(tmp_path, t, 0, 6.0, t.steps)
    _result(tmp_path, t, 1, 2.0, 20_480)
    lines: list[str] = []
    assert not sb._todo(t, 0, t.steps, tmp_path, lines.append)  # done: skipped
    assert not sb._todo(t, 0, 20_480, tmp_path, lines.append)  # a full result stays
    assert "full budget" in lines[-1]
    assert sb._todo(t, 1, t.steps, tmp_path, lines.append)  # a reduced one is replaced
    assert sb._todo(t, 2, t.steps, tmp_path, lines.append)  # none yet


# ------------------------------------------------------------------ the MuJoCo (MLP) side
class Bodies(gym.Env):
    """A MuJoCo task's kind of spaces without the physics: 7 unbounded floats (of large
    scale, as joint velocities), 3 actions in [-1, 1]."""

    def __init__(self):
        self.observation_space = spaces.Box(-np.inf, np.inf, (7,), np.float64)
        self.action_space = spaces.Box(-1.0, 1.0, (3,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.normal(5.0, 20.0, 7), {}

    def step(self, action):
        obs = self.np_random.normal(5.0, 20.0, 7)
        return obs, float(-np.square(action).sum()), bool(self.np_random.random() < 0.02), \
            False, {}


def _mlp_model(name: str = "ant", seed: int = 3):
    sb = pytest.importorskip("bench.learning_sb3")
    cfg = sb.preset_config(task(name), seed=seed)
    return sb, cfg, sb.build_model(cfg, Bodies, BUDGET)


def test_the_ant_preset_lands_in_sb3s_mlp_ppo_and_vecnormalize():
    from stable_baselines3.common.vec_env import VecNormalize

    from ppokit.algos.presets import ENV_PRESETS

    sb, cfg, model = _mlp_model()
    pol = model.policy
    preset = ENV_PRESETS["Ant-v5"]
    assert (model.n_envs, model.n_steps, model.batch_size, model.n_epochs) == \
        (preset["n_envs"], preset["n_steps"], preset["batch_size"], preset["n_epochs"]) == \
        (1, 2048, 64, 10)
    # the values the preset leaves to ppokit's defaults (SB3's defaults too): constant
    # learning rate and clip range at every progress
    assert model.lr_schedule(1.0) == model.lr_schedule(0.01) == cfg.learning_rate == 3e-4
    assert model.clip_range(1.0) == model.clip_range(0.01) == cfg.clip_range == 0.2
    assert (model.gamma, model.gae_lambda, model.ent_coef, model.vf_coef,
            model.max_grad_norm) == (0.99, 0.95, 0.0, 0.5, 0.5)
    assert model.normalize_advantage and model.clip_range_vf is None and model.target_kl is None
    assert not model.use_sde and model.seed == 3
    assert pol.net_arch == {"pi": [64, 64], "vf": [64, 64]} and pol.activation_fn is nn.Tanh
    assert pol.ortho_init and pol.optimizer.param_groups[0]["eps"] == 1e-5
    assert torch.equal(pol.log_std.detach(), torch.zeros(3))  # log_std_init 0
    vn = model.get_env()
    assert isinstance(vn, VecNormalize) and vn.norm_obs and vn.norm_reward
    assert (vn.clip_obs, vn.clip_reward, vn.gamma, vn.epsilon) == (10.0, 10.0, 0.99, 1e-8)
    rec = sb.arguments_record(model)
    assert rec["vec_normalize"]["clip_obs"] == 10.0 and rec["log_std_init"] == 0.0
    assert rec["parameters"] == 2 * (7 * 64 + 64 + 64 * 64 + 64) + 64 * 3 + 3 + 65 + 3
    # Humanoid's preset: ReLU, no orthogonal initialisation, log std from -2, 256 units
    kw = sb.ppo_arguments(sb.preset_config(task("humanoid")), BUDGET)
    assert kw["policy_kwargs"]["activation_fn"] is nn.ReLU
    assert kw["policy_kwargs"]["net_arch"] == {"pi": [256, 256], "vf": [256, 256]}
    assert (kw["policy_kwargs"]["ortho_init"], kw["policy_kwargs"]["log_std_init"]) == \
        (False, -2.0)
    assert (kw["n_steps"], kw["batch_size"], kw["gamma"]) == (512, 256, 0.95)
    assert sb.normalize_arguments(dataclasses.replace(cfg, normalize_obs=False)) == dict(
        norm_obs=False, norm_reward=True, clip_obs=10.0, clip_reward=10.0, gamma=0.99,
        epsilon=1e-8)
    assert sb.normalize_arguments(dataclasses.replace(cfg, normalize_obs=False,
                                                      normalize_reward=False)) is None
    for key, value in (("target_kl", 0.02), ("recurrent", "lstm"), ("clip_range_vf", 0.2),
                       ("advantage_estimator", "vtrace")):
        with pytest.raises(UsageError, match=key):
            sb.ppo_arguments(dataclasses.replace(cfg, **{key: value}), BUDGET)


def test_the_mlp_twin_and_normaliser_act_as_sb3s_policy_and_vecnormalize():
    sb, cfg, model = _mlp_model()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # weights of no special form: every one must land in its place
        for p in model.policy.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    twin = sb.ppokit_twin(model, cfg)
    assert sum(p.numel() for p in twin.parameters()) == \
        sum(p.numel() for p in model.policy.parameters())
    vn = model.get_env()
    vn.reset()
    for _ in range(50):  # statistics of 51 batches of observations, far from (0, 1)
        vn.step(np.zeros((1, 3), np.float32))
    raw = np.random.default_rng(1).normal(5.0, 20.0, (6, 7))
    norm = sb.obs_normalizer(model, cfg)
    assert vn.obs_rms.count == pytest.approx(51 + 1e-4)
    np.testing.assert_allclose(norm(raw), vn.normalize_obs(raw), rtol=1e-5, atol=1e-5)
    obs = torch.from_numpy(norm(raw))
    acts = torch.from_numpy(np.random.default_rng(2).uniform(-1, 1, (6, 3)).astype(np.float32))
    with torch.no_grad():
        v, logp, ent = model.policy.evaluate_actions(obs, acts)
        logp2, ent2, v2 = twin.evaluate(obs, acts)
        mean = model.policy._predict(obs, deterministic=True)
        mean2 = twin.deterministic_action(obs)
    assert torch.allclose(logp, logp2, atol=1e-4) and torch.allclose(ent, ent2, atol=1e-5)
    assert torch.allclose(v.squeeze(-1), v2, atol=1e-5)
    assert torch.allclose(mean, mean2, atol=1e-6)
    before = norm.rms.mean.copy()
    norm(raw)  # evaluation does not move the statistics
    assert np.array_equal(norm.rms.mean, before)


@pytest.mark.skipif(not L.installed(task("ant")), reason="needs the mujoco extra")
def test_sb3_smoke_run_on_ant_writes_its_result_file(tmp_path):
    sb = pytest.importorskip("bench.learning_sb3")
    t = dataclasses.replace(task("ant"), final_episodes=2, curve_episodes=1)
    path = sb.run_one(t, 0, 2048, tmp_path, log=lambda *_: None)
    rec = json.loads(path.read_text())
    assert path == tmp_path / "ant" / "seed0.json"
    assert rec["budget"] == rec["steps"] == 2048 and rec["reduced"]
    assert rec["final"]["deterministic"] and rec["final"]["episodes"] == 2
    assert rec["final"]["seed"] == L.EVAL_SEED
    assert "VecNormalize" in rec["protocol"]["evaluation"]
    assert rec["sb3_arguments"]["vec_normalize"]["norm_reward"]
    assert rec["differences"] == list(sb.DIFFERENCES_MLP)
    assert rec["preset"]["normalize_obs"] and rec["preset"]["n_steps"] == 2048
    # one update from the initial policy: the deterministic (mean) policy stays nearly
    # still, so the ant keeps healthy for most of its 1000 steps (1 per healthy step)
    assert 300 < rec["final"]["mean"] < 1100
