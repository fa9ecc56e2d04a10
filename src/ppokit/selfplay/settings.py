"""The self-play configuration keys (:class:`SelfPlaySettings`, a base of
:class:`ppokit.algos.config.TrainConfig`) and their combination checks."""

from __future__ import annotations

from dataclasses import dataclass

from ppokit.settings import fail, setting

__all__ = ["SelfPlaySettings", "POOL_MODES", "check_selfplay"]

POOL_MODES = ("latest", "uniform", "prioritised")


@dataclass(frozen=True)
class SelfPlaySettings:
    selfplay: bool = setting(False, "two-player turn-based games (a pettingzoo: classic id): "
                             "the learner plays one seat, alternating, against its own "
                             "snapshots and fixed players (docs/multiagent.md#self-play)")
    selfplay_pool: str = setting("uniform", "which snapshot an episode plays: latest, uniform "
                                 "or prioritised (the snapshots the learner scores least "
                                 "against)", choices=POOL_MODES)
    selfplay_every: int = setting(10, "self-play: save a snapshot of the policy into the pool "
                                  "every this many iterations", bounds=(1, 10**9, False))
    selfplay_pool_size: int = setting(20, "self-play: the newest this many snapshots form the "
                                      "pool", bounds=(1, 10**6, False))
    selfplay_latest_prob: float = setting(0.5, "self-play: probability that an episode plays "
                                          "the newest snapshot whatever selfplay_pool says",
                                          bounds=(0.0, 1.0, False))
    selfplay_random_prob: float = setting(0.0, "self-play: probability that an episode plays "
                                          "the random player", bounds=(0.0, 1.0, False))
    selfplay_heuristic_prob: float = setting(0.0, "self-play: probability that an episode "
                                             "plays the one-step-lookahead player",
                                             bounds=(0.0, 1.0, False))
    selfplay_snapshot_random_move_prob: float = setting(
        0.0, "self-play: probability that a snapshot opponent makes a uniformly random legal "
        "move instead of its policy's, at each of its turns (openings and positions the "
        "snapshots would not reach, then played on by them)", bounds=(0.0, 1.0, False))
    selfplay_eval_every: int = setting(10, "self-play: play selfplay_eval_games games against "
                                       "the random and the one-step-lookahead players every "
                                       "this many iterations (0 = never)",
                                       bounds=(0, 10**9, False))
    selfplay_eval_games: int = setting(100, "self-play: games of each evaluation against a "
                                       "fixed player (seats alternate)",
                                       bounds=(2, 10**6, False))


def check_selfplay(c) -> None:
    """The combinations a self-play configuration ``c`` (a ``TrainConfig``) refuses."""
    if not c.selfplay:
        return
    if c.selfplay_random_prob + c.selfplay_heuristic_prob > 1.0:
        fail("selfplay_random_prob", f"{c.selfplay_random_prob:g} + selfplay_heuristic_prob "
             f"{c.selfplay_heuristic_prob:g} is more than 1", show=False)
    if c.env_source != "id" or not c.env_id.startswith("pettingzoo:"):
        fail("selfplay", f"true needs a two-player PettingZoo game as env_id (e.g. "
             f"pettingzoo:classic/connect_four_v3), not {c.env_id}", show=False)
    if c.vectorization not in ("auto", "sync"):
        fail("vectorization", f"self-play steps its games in this process (auto or sync), "
             f"not {c.vectorization}", show=False)
    if c.eval_every:
        fail("eval_every", "a self-play run is evaluated against fixed players by "
             "selfplay_eval_every; set eval_every = 0", show=False)
    if c.recurrent != "none":
        fail("recurrent", "self-play opponents are feed-forward policies; use "
             "recurrent = none", show=False)
