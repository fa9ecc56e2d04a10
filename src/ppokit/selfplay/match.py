"""Whole games of a policy against one fixed player, seats alternating (the first game as
first player), and the Wilson score interval of the rates they give."""

from __future__ import annotations

import math

from ppokit.errors import UserCodeError

from .games import SelfPlayEnv
from .opponents import Fixed

__all__ = ["play_games", "wilson", "MAX_MOVES"]

MAX_MOVES = 10_000  # moves of one game: a game that does not end is an error, not a hang


def play_games(make_game, learner, name: str, opponent, games: int, seed: int,
               label: str = "game", report=None) -> list[float]:
    """The learner's scores (1 a win, ½ a draw, 0 a loss) in ``games`` games against
    ``opponent``; game ``k`` is seeded ``seed + k`` and played from the first seat when
    ``k`` is even. ``report(name, score)`` also receives each result (ratings)."""
    src = Fixed(name, opponent)
    env = SelfPlayEnv(make_game(), src, label=label)
    try:
        for k in range(games):
            obs, _ = env.reset(seed=seed + k, options={"seat": ("first", "second")[k % 2]})
            for _ in range(MAX_MOVES):
                obs, _, done, _, _ = env.step(learner.act(obs, env.np_random))
                if done:
                    break
            else:
                raise UserCodeError(f"{label}: a game did not end within {MAX_MOVES} moves")
            if report is not None:
                report(name, src.scores[-1])
    finally:
        env.close()
    return src.scores


def wilson(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95 % for ``z = 1.96``) of ``k`` successes in ``n``."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
