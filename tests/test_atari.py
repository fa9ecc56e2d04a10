"""Atari preprocessing (ppokit.envs.atari) step by step on the real ALE game, the preset,
game scores in the metrics, and a tiny `ppokit train` / `eval` on Breakout."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from ppokit.algos.config import ATARI_PRESET, resolve_config
from ppokit.cli import main
from ppokit.envs import atari, make_vec
from ppokit.envs.atari import GameScore, MaxAndSkip, NoopReset
from ppokit.errors import UsageError
from ppokit.io import read_metrics
from ppokit.policies.encoders import NatureCNN, image_layout
from ppokit.rollout.collector import finished_games

GAME = "ALE/Breakout-v5"
atari.register()


def _ale(**kw):
    return gym.make(GAME, frameskip=1, obs_type="grayscale", disable_env_checker=True, **kw)


def _find(env, cls):
    while not isinstance(env, cls):
        env = env.env
    return env


def _frame(env) -> int:
    return int(env.unwrapped.ale.getEpisodeFrameNumber())


def test_max_and_skip_against_four_single_frames():
    """One skipped step = 4 emulator frames with the same action, rewards summed, the
    observation the maximum of frames 3 and 4 (a second emulator, same seed, no stickiness
    so both see the same frames)."""
    a, b = MaxAndSkip(_ale(repeat_action_probability=0.0)), _ale(repeat_action_probability=0.0)
    a.reset(seed=3)
    b.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(60):
        act = int(rng.integers(4))
        f0 = _frame(a)
        obs, r, te, tr, _ = a.step(act)
        frames, total = [], 0.0
        for _ in range(4):
            o, rb, teb, trb, _ = b.step(act)
            frames.append(o)
            total += rb
            if teb or trb:
                break
        assert _frame(a) - f0 == len(frames) == 4
        assert r == total and te == teb
        assert np.array_equal(obs, np.maximum(frames[-2], frames[-1]))
        assert obs.shape == (210, 160) and obs.dtype == np.uint8


def test_noop_reset_starts_after_1_to_30_noops():
    env = NoopReset(_ale())
    seen = set()
    for seed in range(6):
        env.reset(seed=seed)
        assert 1 <= env.last_noops <= 30 and _frame(env) == env.last_noops
        seen.add(env.last_noops)
    assert len(seen) > 1  # the seed decides them
    env.reset(seed=0)
    first = env.last_noops
    env.reset(seed=0)
    assert env.last_noops == first


def _play(env, seed: int, max_steps: int = 5000):
    """Random actions until the game reports its score; per step: (reward, terminated,
    the GameScore wrapper's reward delta, lives, info)."""
    gs = _find(env, GameScore)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    rows = []
    for _ in range(max_steps):
        before = gs.score
        obs, r, te, tr, info = env.step(int(rng.integers(4)))
        raw = gs.score - before if "game_score" not in info else None
        rows.append((r, te, tr, raw, int(env.unwrapped.ale.lives()), info))
        if "game_score" in info:
            return obs, rows
        if te or tr:
            env.reset()
    raise AssertionError("no game ended")


def test_training_env_life_loss_ends_episodes_not_the_game_score():
    env = atari.make_env(GAME, training=True)
    _, rows = _play(env, seed=1)
    ends = [i for i, row in enumerate(rows) if row[1]]
    lives = [row[4] for row in rows]
    # every life lost ends a training episode; the game's score is reported once, at the
    # end of the fifth
    assert len(ends) == 5 and ends[-1] == len(rows) - 1
    assert all(lives[i] < (lives[i - 1] if i else 5) for i in ends)
    info = rows[-1][5]
    assert [("game_score" in row[5]) for row in rows].count(True) == 1
    # rewards are clipped to their sign in training; the game score is the unclipped sum
    raws = [row[3] for row in rows[:-1]]
    assert all(r == np.sign(raw) for (r, *_), raw in zip(rows[:-1], raws))
    assert info["game_length"] > len(rows)  # it counts the reset's NOOP / FIRE steps too
    assert info["game_score"] >= sum(row[0] for row in rows)


def test_evaluation_env_plays_whole_games_unclipped():
    env = atari.make_env(GAME, training=False)
    _, rows = _play(env, seed=2)
    assert [row[1] for row in rows].count(True) == 1 and rows[-1][1]  # one game, one end
    assert rows[-1][4] == 0
    info = rows[-1][5]
    assert info["game_score"] == sum(row[0] for row in rows)
    assert all(row[0] == row[3] for row in rows[:-1])  # unclipped


def test_clipping_only_in_training():
    """Breakout's upper bricks score 4 and 7: the sign in training, the points in
    evaluation (raw rewards of the same emulator state)."""
    t = atari.make_env(GAME, training=True)
    e = atari.make_env(GAME, training=False)
    assert isinstance(t.env, atari.ClipRewardSign) and not any(
        isinstance(w, (atari.ClipRewardSign, atari.EpisodicLife)) for w in _chain(e))
    assert any(isinstance(w, atari.EpisodicLife) for w in _chain(t))
    assert t.env.reward(7.0) == 1.0 and t.env.reward(-3.0) == -1.0 and t.env.reward(0.0) == 0


def _chain(env):
    out = [env]
    while hasattr(env, "env"):
        env = env.env
        out.append(env)
    return out


def test_stacked_frames_shape_dtype_and_order():
    env = atari.make_env(GAME)
    assert env.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert all(np.array_equal(obs[0], obs[k]) for k in range(4))  # filled with the first
    prev = obs
    for _ in range(5):
        obs, *_ = env.step(0)
        assert np.array_equal(obs[:3], prev[1:])  # oldest first, shifted by one
        prev = obs
    last, c, h, w, scale = image_layout(env.observation_space)
    assert (last, c, h, w) == (False, 4, 84, 84) and scale == pytest.approx(1 / 255)
    cnn = NatureCNN(env.observation_space)
    assert cnn.conv[0].in_channels == 4
    assert cnn(torch.from_numpy(obs[None]).float()).shape == (1, 512)


def test_vector_env_and_collector_report_game_scores():
    """The training vector env ends episodes at every life; the collector's finished list
    holds the games (their unclipped scores) instead."""
    from ppokit.policies import make_policy
    from ppokit.rollout import Collector

    env = make_vec(GAME, 2)
    assert env.game_scores and env.single_observation_space.shape == (4, 84, 84)
    torch.manual_seed(0)
    pol = make_policy(env.single_observation_space, env.single_action_space, hidden=(),
                      policy="cnn")
    col = Collector(env, pol, generator=torch.Generator().manual_seed(0))
    assert col.games
    col.reset(seed=0)
    ends = 0
    for _ in range(6):
        ro = col.collect(64)
        ends += int(ro.episode_end.sum())
        if len(col.finished) >= 1:
            break
    games = col.pop_finished()
    assert games and ends >= 5 * len(games)  # five lives (episodes) per game at least
    assert all(length > 100 and score >= 0 for score, length in games)
    assert ro.obs.shape[2:] == (4, 84, 84)
    env.close()


def test_finished_games_reads_both_autoreset_layouts():
    same = {"final_info": {"game_score": np.array([0.0, 12.0]), "_game_score":
                           np.array([False, True]), "game_length": np.array([0, 300])}}
    nxt = {"game_score": np.array([5.0, 0.0]), "_game_score": np.array([True, False]),
           "game_length": np.array([99, 0])}
    assert finished_games(same, np.array([True, True])) == [(12.0, 300)]
    assert finished_games(nxt, np.array([True, False])) == [(5.0, 99)]
    assert finished_games({}, np.array([True])) == []
    assert finished_games({"final_info": {}}, np.array([True])) == []


def test_atari_preset_resolves():
    c = resolve_config(env_id=GAME)
    want = dict(n_envs=8, n_steps=128, n_epochs=4, batch_size=256, learning_rate=2.5e-4,
                lr_schedule="linear", clip_range=0.1, clip_schedule="linear", ent_coef=0.01,
                vf_coef=0.5, gamma=0.99, gae_lambda=0.95, max_grad_norm=0.5,
                total_timesteps=10_000_000, policy="cnn", net_arch=(), precision="auto")
    assert {k: getattr(c, k) for k in want} == want == {**ATARI_PRESET}
    assert resolve_config(env_id="ALE/Pong-v5").clip_range == 0.1
    assert resolve_config(env_id=GAME, overrides={"n_envs": 4}).n_envs == 4
    assert resolve_config(env_id="CartPole-v1").policy == "auto"
    assert resolve_config(env_id="CartPole-v1").precision == "fp32"


def test_atari_env_kwargs_are_checked():
    with pytest.raises(UsageError, match="'frameskip' is set by ppokit's Atari"):
        make_vec(GAME, 1, env_kwargs={"frameskip": 2})
    with pytest.raises(UsageError, match="vectorization: ALE/Breakout-v5 is built with"):
        make_vec(GAME, 1, vectorization="vector_entry_point")
    env = make_vec(GAME, 1, env_kwargs={"repeat_action_probability": 0.0})
    assert env.envs[0].unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    env.close()
    env = make_vec(GAME, 1)  # the -v5 default: sticky actions
    assert env.envs[0].unwrapped.ale.getFloat("repeat_action_probability") == \
        pytest.approx(0.25)
    env.close()


def test_train_eval_check_on_breakout(tmp_path, capsys):
    rd = tmp_path / "run"
    rc = main(["train", "--env", GAME, "--total-steps", "256", "--run-dir", str(rd),
               "--set", "n_envs=2", "n_steps=64", "batch_size=64", "n_epochs=1",
               "tensorboard=false", "--eval-episodes", "1", "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "ppo on ALE/Breakout-v5: 256 steps" in out and "eval " in out
    cfg = json.loads((rd / "config.json").read_text())
    assert cfg["policy"] == "cnn" and cfg["clip_range"] == 0.1
    assert len(read_metrics(rd)) == 2
    res = json.loads((rd / "eval.json").read_text())
    assert res["episodes"] == 1 and res["mean_return"] >= 0
    assert main(["eval", str(rd), "--episodes", "1"]) == 0
    assert main(["check", str(rd), "--samples", "64", "--no-labels"]) == 0
