"""What a self-play run adds to the environment trainer (:class:`SelfPlay`): the training
games (one :class:`~ppokit.selfplay.games.SelfPlayEnv` per ``n_envs``, sync, their
opponents drawn from the run's :class:`~ppokit.selfplay.pool.SnapshotPool`), a snapshot of
the policy after iteration 1 and every ``selfplay_every`` iterations (as an opponent, it
makes a uniformly random legal move with probability
``selfplay_snapshot_random_move_prob`` at each of its turns), the evaluations
against the random and the one-step-lookahead players every ``selfplay_eval_every``
iterations and the metrics of each iteration:

* ``selfplay/elo``: the learner's rating (:mod:`ppokit.selfplay.pool`);
* ``selfplay/pool_size``; ``selfplay/train_score``: the learner's mean score (1 a win,
  ½ a draw) in the iteration's finished training games;
* ``selfplay/win_rate_random``, ``draw_rate_random``, ``loss_rate_random`` and the same
  ``_heuristic``: the evaluation's rates (``None`` between evaluations; the learner takes
  its most likely legal move; the same game seeds every time).

The pool's state is part of each checkpoint, so ``--resume`` continues with the pool the
checkpoint had (its snapshots read back from ``RUN/selfplay/``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from ppokit.envs.vec import make_vec_factory
from ppokit.errors import UsageError

from .games import RULES, SelfPlayEnv, game_factory, game_name
from .match import play_games
from .opponents import Heuristic, PolicyPlayer, RandomPlayer, flat_space
from .pool import HEURISTIC, RANDOM, SnapshotPool, read_snapshot, write_snapshot

__all__ = ["SelfPlay", "EVAL_SEED_OFFSET", "game_spaces", "snapshot_policy"]

EVAL_SEED_OFFSET = 3_000_000  # evaluation games: seeds seed + this + k


def game_spaces(make_game) -> tuple:
    """``(Dict observation space, action space)`` of the game's first player."""
    g = make_game()
    g.reset()
    first = g.possible_agents[0]
    spaces = g.observation_space(first), g.action_space(first)
    g.close()
    return spaces


def snapshot_policy(cfg, weights: dict, obs_space, act_space, where: str = "snapshot"):
    """A policy of ``cfg``'s architecture holding ``weights``, ready to act."""
    from ppokit.policies import policy_for_config

    policy = policy_for_config(cfg, flat_space(obs_space), act_space)
    try:
        policy.load_state_dict(weights)
    except (RuntimeError, KeyError) as exc:
        raise UsageError(f"{where}: the weights do not fit the run's policy "
                         f"({str(exc).splitlines()[0][:200]})") from None
    policy.eval()
    return policy


class SelfPlay:
    """A self-play run's games, pool and evaluations (module doc)."""

    def __init__(self, cfg, run_dir: str | Path, log: Callable[[str], None] = print):
        self.cfg, self.run_dir, self.log = cfg, Path(run_dir), log
        self.make_game = game_factory(cfg.env_id, cfg.env_kwargs)
        self.obs_space, self.act_space = game_spaces(self.make_game)
        rules = RULES.get(game_name(cfg.env_id))
        self.heuristic = Heuristic(rules) if rules is not None else None
        if self.heuristic is None and cfg.selfplay_heuristic_prob > 0:
            raise UsageError(f"selfplay_heuristic_prob: the one-step-lookahead player knows "
                             f"{' and '.join(RULES)}, not {cfg.env_id}")
        self.pool = SnapshotPool(cfg, self._player_of_file,
                                 {RANDOM: RandomPlayer(), HEURISTIC: self.heuristic})

    def vec(self):
        """The training envs: ``n_envs`` games against the pool's opponents."""
        c = self.cfg

        def make():
            return SelfPlayEnv(self.make_game(), self.pool, label=c.env_id)

        # (ppokit's own env: built without the per-call checks of a user's factory)
        return make_vec_factory(make, c.n_envs, "sync", c.autoreset_mode)

    def _player_of_file(self, iteration: int) -> PolicyPlayer:
        weights, _ = read_snapshot(self.run_dir, iteration, "--resume")
        return self._player(weights, f"snapshot {iteration}")

    def _player(self, weights: dict, where: str) -> PolicyPlayer:
        """A snapshot as a training opponent (``selfplay_snapshot_random_move_prob``)."""
        policy = snapshot_policy(self.cfg, weights, self.obs_space, self.act_space, where)
        return PolicyPlayer(policy, self.obs_space,
                            random_move_prob=self.cfg.selfplay_snapshot_random_move_prob)

    def after_iteration(self, tr) -> dict:
        """Snapshot, evaluate and report after the trainer ``tr``'s iteration."""
        c, it = self.cfg, tr.iteration
        if it == 1 or it % c.selfplay_every == 0:
            state = {k: v.detach().clone() for k, v in tr.policy.state_dict().items()}
            write_snapshot(self.run_dir, it, state, c.env_id)
            self.pool.add(it, self._player(state, f"snapshot {it}"))
        w, d, l = self.pool.read_window()
        n = w + d + l
        rec = {"selfplay/elo": self.pool.learner, "selfplay/pool_size": len(self.pool.members),
               "selfplay/train_score": (w + 0.5 * d) / n if n else None}
        due = c.selfplay_eval_every and it % c.selfplay_eval_every == 0
        for name in (RANDOM, HEURISTIC):
            rates = self.evaluate(tr.policy, name) if due else None
            for i, kind in enumerate(("win", "draw", "loss")):
                rec[f"selfplay/{kind}_rate_{name}"] = None if rates is None else rates[i]
        return rec

    def evaluate(self, policy, name: str) -> tuple[float, float, float] | None:
        """Win, draw and loss rates of ``policy`` (most likely legal moves) in
        ``selfplay_eval_games`` games against the fixed player ``name``."""
        c = self.cfg
        opponent = self.pool.fixed[name]
        if opponent is None:
            return None
        was = policy.training
        policy.eval()
        try:
            scores = np.asarray(play_games(
                self.make_game, PolicyPlayer(policy, self.obs_space, deterministic=True),
                name, opponent, c.selfplay_eval_games, c.seed + EVAL_SEED_OFFSET,
                label=c.env_id, report=lambda o, s: self.pool.report(o, s, training=False)))
        finally:
            policy.train(was)
        return (float((scores == 1).mean()), float((scores == 0.5).mean()),
                float((scores == 0).mean()))

    def state_dict(self) -> dict:
        return self.pool.state_dict()

    def load_state_dict(self, st: dict) -> None:
        """The pool a checkpoint recorded, its snapshots read back from the run directory."""
        self.pool.load_state_dict(st)
        for m in self.pool.members:
            self.pool.players[m] = self._player_of_file(m)
