"""A two-player PettingZoo game (its AEC API) as a single-agent Gymnasium environment: the
learner plays one seat, a uniformly random player the other.

:class:`VersusRandom` steps the game through the opponent's moves until it is the
learner's turn again, and returns what PettingZoo's classic games give the player to move:
a ``Dict`` observation with the board from the learner's side and its ``"action_mask"``
(the legal moves), which ppokit applies (:mod:`ppokit.envs.masks`). The reward is the
learner's (+1 a win, −1 a loss, 0 a draw), at the step that ends the game. ``seat``:
``"first"``, ``"second"`` or ``"random"`` (drawn at each reset from the environment's
generator, which also draws the opponent's moves).

Registered (when ``ppokit.envs`` is imported; building one needs the ``pettingzoo``
extra):

* ``ppokit/TicTacToe-v0``: PettingZoo's ``tictactoe_v3`` against a random player, either
  seat (``env_kwargs`` ``{"seat": "first"}`` to fix it).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from ppokit.errors import require_extra

__all__ = ["VersusRandom", "VERSUS_IDS", "make_tictactoe", "register_versus", "SEATS"]

VERSUS_IDS = ("ppokit/TicTacToe-v0",)
SEATS = ("first", "second", "random")


class VersusRandom(gym.Env):
    """One seat of a two-player AEC game ``game`` against a random player (module doc)."""

    metadata = {"render_modes": []}

    def __init__(self, game, seat: str = "random"):
        if seat not in SEATS:
            raise ValueError(f"seat: expected one of {', '.join(SEATS)}, got {seat!r}")
        self.game, self.seat_rule = game, seat
        game.reset()
        if len(game.possible_agents) != 2:
            raise ValueError(f"game: expected two players, got {game.possible_agents}")
        first = game.possible_agents[0]
        self.observation_space = game.observation_space(first)
        self.action_space = game.action_space(first)
        self.me = first

    def _opponent_moves(self) -> float:
        """Play the random player's turns until the learner's (or the end); the learner's
        reward from them."""
        g, reward = self.game, 0.0
        while not self._over() and g.agent_selection != self.me:
            mask = np.asarray(g.observe(g.agent_selection)["action_mask"], bool)
            g.step(int(self.np_random.choice(np.flatnonzero(mask))))
            reward += float(g.rewards.get(self.me, 0.0))
        return reward

    def _over(self) -> bool:
        g = self.game
        return not g.agents or g.terminations.get(self.me, True) or g.truncations.get(
            self.me, False)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.game.reset(seed=None if seed is None else int(seed))
        agents = self.game.possible_agents
        seat = self.seat_rule
        if seat == "random":
            seat = SEATS[int(self.np_random.integers(2))]
        self.me = agents[0] if seat == "first" else agents[1]
        self._opponent_moves()
        return self.game.observe(self.me), {}

    def step(self, action):
        g = self.game
        g.step(int(action))
        reward = float(g.rewards.get(self.me, 0.0))
        if not self._over():
            reward += self._opponent_moves()
        return g.observe(self.me), reward, bool(self._over()), False, {}


def make_tictactoe(seat: str = "random") -> VersusRandom:
    """PettingZoo's tic-tac-toe against a random player (``ppokit/TicTacToe-v0``)."""
    require_extra("pettingzoo", "pettingzoo", "ppokit/TicTacToe-v0 (PettingZoo's "
                  "tic-tac-toe)")
    # (the module itself: PettingZoo's versioned alias warns of its deprecated loader)
    from pettingzoo.classic.tictactoe.tictactoe import env

    return VersusRandom(env(), seat)


def register_versus() -> None:
    """Register :data:`VERSUS_IDS` with Gymnasium (once)."""
    if VERSUS_IDS[0] not in gym.registry:
        gym.register(VERSUS_IDS[0], entry_point="ppokit.envs.versus:make_tictactoe")
