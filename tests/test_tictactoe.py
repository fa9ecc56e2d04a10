"""ppokit/TicTacToe-v0: PettingZoo's tic-tac-toe against a random player, its legal moves
as action masks (ppokit.envs.versus). Skipped without the pettingzoo extra."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("pettingzoo")

import ppokit  # noqa: E402
from ppokit.envs.versus import VersusRandom  # noqa: E402

TTT = "ppokit/TicTacToe-v0"


def play(env, seed, rng):
    """One game of uniformly random legal moves: (reward, moves, masks seen)."""
    obs, _ = env.reset(seed=seed)
    total, moves, masks = 0.0, 0, []
    while True:
        mask = np.asarray(obs["action_mask"], bool)
        masks.append(mask)
        obs, r, term, trunc, _ = env.step(int(rng.choice(np.flatnonzero(mask))))
        total, moves = total + r, moves + 1
        if term or trunc:
            return total, moves, masks


@pytest.mark.parametrize("seat, first_free", [("first", 9), ("second", 8)])
def test_the_learner_moves_with_the_legal_moves_as_its_mask(seat, first_free):
    env = gym.make(TTT, seat=seat)
    rng = np.random.default_rng(0)
    outcomes = set()
    for k in range(60):
        total, moves, masks = play(env, k, rng)
        assert masks[0].sum() == first_free  # the opponent has moved first as second
        assert all(a.sum() > b.sum() for a, b in zip(masks, masks[1:]))  # board fills
        assert total in (-1.0, 0.0, 1.0) and 1 <= moves <= 5
        outcomes.add(total)
    assert outcomes == {-1.0, 0.0, 1.0}
    env.close()


def test_seeded_games_repeat_and_the_seat_is_drawn():
    env = gym.make(TTT)
    a = [play(env, s, np.random.default_rng(s))[:2] for s in range(20)]
    b = [play(env, s, np.random.default_rng(s))[:2] for s in range(20)]
    assert a == b
    seats = {env.reset(seed=s)[0]["action_mask"].sum() for s in range(20)}
    assert seats == {8, 9}  # either seat
    with pytest.raises(ValueError, match="seat: expected one of"):
        VersusRandom(None, seat="middle")


def test_check_env_passes_the_masks():
    rep = ppokit.check_env(TTT, steps=500, seconds=10.0)
    assert rep["action-mask"].status == "PASS" and rep["env-exception"].status == "PASS"


@pytest.mark.slow
def test_masked_ppo_does_not_lose_to_a_random_player(tmp_path):
    # within ten minutes (about 1.5 here): at least 95 % of 400 games against the random
    # player won or drawn, either seat, the policy's most likely legal move
    t0 = time.perf_counter()
    agent = ppokit.train(TTT, "ppo", 200_000, n_envs=8, n_steps=128, batch_size=256,
                         n_epochs=10, learning_rate=1e-3, seed=0, progress=False,
                         run_dir=tmp_path / "ttt")
    rets, _ = ppokit.evaluate_policy(agent, TTT, n_eval_episodes=400,
                                     return_episode_rewards=True)
    rets = np.asarray(rets)
    assert time.perf_counter() - t0 < 600
    assert (rets >= 0).mean() >= 0.95, ((rets > 0).mean(), (rets < 0).mean())
