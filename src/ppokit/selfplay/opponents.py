"""The players a self-play learner meets: :class:`RandomPlayer` (a uniformly random legal
move), :class:`Heuristic` (one-step lookahead: win now if a move wins, else block the
opponent's immediate win, else a random legal move) and :class:`PolicyPlayer` (a policy's
move: a snapshot of the learner, another run's policy). Each acts on one observation of
the player to move (a PettingZoo classic ``Dict`` with ``"observation"`` and
``"action_mask"``) with the environment's generator, so that games repeat from a seed.
:class:`Fixed` is an opponent source that always names the same player."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from ppokit.errors import UsageError

from .games import RULES, BoardRules, game_name

__all__ = ["RandomPlayer", "Heuristic", "PolicyPlayer", "Fixed", "heuristic_for",
           "flat_space"]


def _legal(obs) -> np.ndarray:
    return np.flatnonzero(np.asarray(obs["action_mask"], bool))


class RandomPlayer:
    """A uniformly random legal move."""

    def act(self, obs, rng: np.random.Generator) -> int:
        return int(rng.choice(_legal(obs)))


class Heuristic:
    """One-step lookahead on a board game (``rules``): a move that completes a line now;
    else a move on the cell where the opponent would complete one; else a random legal
    move (ties broken at random too). The board is the observation's two planes: the
    player to move's pieces (``[..., 0]``) and the opponent's (``[..., 1]``)."""

    def __init__(self, rules: BoardRules):
        self.rules = rules

    def act(self, obs, rng: np.random.Generator) -> int:
        planes = np.asarray(obs["observation"])
        mine, theirs = planes[..., 0] != 0, planes[..., 1] != 0
        legal = _legal(obs)
        wins, blocks = [], []
        for a in legal:
            cell = self.rules.cell(mine | theirs, int(a))
            if cell is None:
                continue
            if self.rules.completes(mine, *cell):
                wins.append(a)
            elif self.rules.completes(theirs, *cell):
                blocks.append(a)
        return int(rng.choice(wins or blocks or legal))


def heuristic_for(env_id: str, where: str = "opponent") -> Heuristic:
    """The one-step-lookahead player of ``env_id``'s game (tic-tac-toe, connect four)."""
    rules = RULES.get(game_name(env_id))
    if rules is None:
        raise UsageError(f"{where}: the one-step-lookahead player knows "
                         f"{' and '.join(RULES)}, not {env_id}")
    return Heuristic(rules)


def flat_space(space: gym.spaces.Dict) -> gym.spaces.Box:
    """The flat ``Box`` a ``Dict`` observation is trained as (sorted keys, as
    :class:`ppokit.envs.vec.FlattenDictObs`), with its ``dict_space`` attribute."""
    sorted_space = gym.spaces.Dict({k: space.spaces[k] for k in sorted(space.spaces)})
    flat = gym.spaces.flatten_space(sorted_space)
    flat.dict_space = sorted_space
    return flat


class PolicyPlayer:
    """A trained policy's move on one observation (flattened as in training), over the
    legal moves only: sampled (with a seed drawn from the game's generator) or, with
    ``deterministic``, the most likely one. With ``random_move_prob`` > 0, each move is
    instead a uniformly random legal one with that probability (the game's generator)."""

    def __init__(self, policy, space: gym.spaces.Dict, deterministic: bool = False,
                 random_move_prob: float = 0.0):
        if not 0.0 <= random_move_prob <= 1.0:
            raise ValueError(f"random_move_prob: expected a probability in [0, 1], got "
                             f"{random_move_prob!r}")
        self.policy, self.deterministic = policy, deterministic
        self.random_move_prob = random_move_prob
        self.dict_space = flat_space(space).dict_space

    def act(self, obs, rng: np.random.Generator) -> int:
        if self.random_move_prob > 0 and rng.random() < self.random_move_prob:
            return int(rng.choice(_legal(obs)))
        flat = gym.spaces.flatten(self.dict_space, obs).astype(np.float32)
        o = torch.from_numpy(flat)[None]
        mask = torch.from_numpy(np.asarray(obs["action_mask"], bool))[None]
        with torch.inference_mode():
            if self.deterministic:
                a = self.policy.deterministic_action(o, mask)
            else:
                gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
                a = self.policy.act(o, gen, mask)[0]
        return int(a.reshape(-1)[0])


class Fixed:
    """An opponent source (:class:`ppokit.selfplay.games.OpponentSource`) of one player,
    which counts the learner's scores against it."""

    def __init__(self, name: str, player):
        self.name, self.player = name, player
        self.scores: list[float] = []

    def draw(self, rng: np.random.Generator):
        return self.name, self.player

    def report(self, name: str, score: float) -> None:
        self.scores.append(score)
