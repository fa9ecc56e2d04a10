"""A two-player, turn-based, zero-sum PettingZoo game (its AEC API, turn by turn) as a
single-agent Gymnasium environment: the learner plays one seat, an opponent the other.

:class:`SelfPlayEnv` plays the opponent's moves inside :meth:`~SelfPlayEnv.step` until it
is the learner's turn again (or the game is over) and returns what PettingZoo's classic
games give the player to move: a ``Dict`` observation from the learner's side with its
``"action_mask"`` (the legal moves), which ppokit applies (:mod:`ppokit.envs.masks`). The
reward is the learner's (+1 a win, −1 a loss, 0 a draw) at the step that ends the game.

Seats alternate: the first episode's seat is drawn from the environment's generator, each
later episode takes the other seat (``reset(options={"seat": "first"})`` fixes one
episode's). Who the opponent is comes from an :class:`OpponentSource` at each reset (the
snapshot pool of a self-play run, :mod:`ppokit.selfplay.pool`, or one fixed player); the
game's result goes back to it when the episode ends, and is in the last step's
``info["selfplay"]`` (``opponent``, ``score``: 1, ½ or 0, ``seat``: 0 first, 1 second).

:class:`BoardRules` knows where a move lands on the board of tic-tac-toe and connect four
and whether it completes a line, for the one-step-lookahead player
(:class:`ppokit.selfplay.opponents.Heuristic`).
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from ppokit.envs.multiagent import pettingzoo_parts
from ppokit.errors import UsageError, UserCodeError

__all__ = ["SelfPlayEnv", "BoardRules", "RULES", "OpponentSource", "game_factory",
           "game_name", "SEAT_RULES"]

SEAT_RULES = ("alternate", "first", "second")
PREFIX = "pettingzoo:"


class OpponentSource(Protocol):
    def draw(self, rng: np.random.Generator) -> tuple[str, Any]: ...

    def report(self, name: str, score: float) -> None: ...


@dataclass(frozen=True)
class BoardRules:
    """A board game's geometry: ``drop`` (a move names a column and the piece falls to its
    lowest free cell, connect four) or a move names a cell, row-major (tic-tac-toe); ``k``
    in a row wins."""

    drop: bool
    k: int

    def cell(self, board: np.ndarray, action: int) -> tuple[int, int] | None:
        """Where ``action`` puts a piece on ``board`` (``[H, W]``, nonzero where taken)."""
        h, w = board.shape
        if self.drop:
            free = np.flatnonzero(board[:, action] == 0)
            return (int(free[-1]), action) if len(free) else None
        r, c = divmod(action, w)
        return (r, c) if board[r, c] == 0 else None

    def completes(self, mine: np.ndarray, r: int, c: int) -> bool:
        """Whether a piece at ``(r, c)`` gives ``mine`` (``[H, W]``) ``k`` in a row."""
        h, w = mine.shape
        for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
            run = 1
            for sign in (1, -1):
                rr, cc = r + sign * dr, c + sign * dc
                while 0 <= rr < h and 0 <= cc < w and mine[rr, cc]:
                    run, rr, cc = run + 1, rr + sign * dr, cc + sign * dc
            if run >= self.k:
                return True
        return False


# the games whose boards the one-step-lookahead player reads (PettingZoo classic names)
RULES = {"tictactoe": BoardRules(drop=False, k=3), "connect_four": BoardRules(drop=True, k=4)}


def game_name(env_id: str) -> str:
    """``pettingzoo:classic/connect_four_v3`` → ``connect_four``."""
    return env_id.rsplit("/", 1)[-1].rsplit("_v", 1)[0]


def game_factory(env_id: str, env_kwargs: dict | None = None):
    """A factory of the AEC game ``pettingzoo:FAMILY/NAME`` (the module
    ``pettingzoo.FAMILY.NAME``; only modules under ``pettingzoo`` are imported)."""
    family, name = pettingzoo_parts(env_id, "classic/connect_four_v3")
    try:
        with warnings.catch_warnings():  # (PettingZoo's versioned aliases warn of their loader)
            warnings.simplefilter("ignore", DeprecationWarning)
            module = importlib.import_module(f"pettingzoo.{family}.{name}")
    except ImportError as exc:
        raise UsageError(f"env: cannot load {env_id!r} ({str(exc).splitlines()[0]})") from None
    # the bare game (raw_env) where the module has one: PettingZoo's checking wrappers
    # (move order, bounds, illegal moves) cost as much as the game, and SelfPlayEnv checks
    # every move against the mask itself
    build = getattr(module, "raw_env", None) or getattr(module, "env", None)
    if not callable(build):
        raise UsageError(f"env: {env_id!r} has no AEC env() to play turn by turn")
    kwargs = dict(env_kwargs or {})

    def make():
        try:
            return build(**kwargs)
        except TypeError as exc:
            raise UsageError(f"env_kwargs: {env_id!r} does not accept them ({exc})") from None

    return make


class SelfPlayEnv(gym.Env):
    """The learner's seat of a two-player AEC ``game`` (module doc). ``opponents``: where
    each episode's opponent comes from; ``seat``: ``alternate``, ``first`` or ``second``."""

    metadata = {"render_modes": []}

    def __init__(self, game, opponents: OpponentSource, seat: str = "alternate",
                 label: str = "game"):
        if seat not in SEAT_RULES:
            raise ValueError(f"seat: expected one of {', '.join(SEAT_RULES)}, got {seat!r}")
        self.game, self.opponents, self.seat_rule, self.label = game, opponents, seat, label
        game.reset()
        agents = list(game.possible_agents)
        if len(agents) != 2:
            raise UsageError(f"env: {label} has {len(agents)} players; self-play needs two")
        space = game.observation_space(agents[0])
        if not isinstance(space, gym.spaces.Dict) or "action_mask" not in space.spaces:
            raise UsageError(f"env: {label}'s observations have no \"action_mask\" key; "
                             "self-play needs the legal moves of a turn-based game")
        self.observation_space = space
        self.action_space = game.action_space(agents[0])
        self.me = agents[0]
        self.seat = -1  # none played yet: the first is drawn
        self.opponent_name, self.opponent = "", None
        self.total = 0.0

    def _legal(self, agent: str) -> np.ndarray:
        return np.asarray(self.game.observe(agent)["action_mask"], bool)

    def _over(self) -> bool:
        g = self.game
        return not g.agents or bool(g.terminations.get(self.me, True)) or bool(
            g.truncations.get(self.me, False))

    def _opponent_moves(self) -> float:
        """The opponent's turns until the learner's (or the end); the learner's reward."""
        g, reward = self.game, 0.0
        while not self._over() and g.agent_selection != self.me:
            who = g.agent_selection
            move = int(self.opponent.act(g.observe(who), self.np_random))
            if not self._legal(who)[move]:
                raise UserCodeError(f"{self.label}: opponent {self.opponent_name} chose the "
                                    f"illegal move {move}")
            g.step(move)
            reward += float(g.rewards.get(self.me, 0.0))
        return reward

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.game.reset(seed=None if seed is None else int(seed))
        fixed = (options or {}).get("seat", self.seat_rule)
        if fixed == "first":
            self.seat = 0
        elif fixed == "second":
            self.seat = 1
        else:
            self.seat = int(self.np_random.integers(2)) if self.seat < 0 else 1 - self.seat
        self.me = self.game.possible_agents[self.seat]
        self.opponent_name, self.opponent = self.opponents.draw(self.np_random)
        self.total = self._opponent_moves()
        return self.game.observe(self.me), {}

    def step(self, action):
        g, a = self.game, int(action)
        if not self._legal(self.me)[a]:
            raise ValueError(f"{self.label}: move {a} is not legal here (the observation's "
                             "action_mask)")
        g.step(a)
        reward = float(g.rewards.get(self.me, 0.0))
        if not self._over():
            reward += self._opponent_moves()
        self.total += reward
        info = {}
        done = self._over()
        if done:
            score = 1.0 if self.total > 0 else 0.0 if self.total < 0 else 0.5
            self.opponents.report(self.opponent_name, score)
            info["selfplay"] = {"opponent": self.opponent_name, "score": score,
                                "seat": self.seat}
        return g.observe(self.me), reward, done, False, info
