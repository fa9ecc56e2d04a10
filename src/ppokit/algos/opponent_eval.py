"""``ppokit eval RUN --opponent SPEC``: a self-play run's policy (its newest checkpoint)
against one opponent, whole games with seats alternating, and the win, draw and loss
rates with their 95 % Wilson intervals.

``SPEC``: ``random``, ``heuristic`` (one-step lookahead), ``snapshot:N`` (the run's own
snapshot after iteration ``N``, ``RUN/selfplay/``) or the directory of another run of the
same game (its newest checkpoint). A policy opponent samples its moves (so that games
differ); the run's policy takes its most likely legal move unless ``stochastic``."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ppokit.errors import UsageError
from ppokit.selfplay.coach import game_spaces, snapshot_policy
from ppokit.selfplay.games import game_factory
from ppokit.selfplay.match import play_games, wilson
from ppokit.selfplay.opponents import PolicyPlayer, RandomPlayer, heuristic_for
from ppokit.selfplay.pool import read_snapshot

__all__ = ["evaluate_versus", "opponent_of"]

COUNTS = {"win": "wins", "draw": "draws", "loss": "losses"}
_SNAPSHOT = re.compile(r"snapshot:(\d{1,9})")


def opponent_of(spec: str, run_dir: Path, cfg, obs_space):
    """``(name, player)`` of ``--opponent`` ``spec`` for the run ``run_dir`` (module doc);
    a one-line :class:`UsageError` for a spec that names nothing playable."""
    if spec == "random":
        return "random", RandomPlayer()
    if spec == "heuristic":
        return "heuristic", heuristic_for(cfg.env_id, "--opponent")
    if spec.startswith("snapshot:"):
        m = _SNAPSHOT.fullmatch(spec)
        if m is None:
            raise UsageError(f"--opponent: expected snapshot:N with N an iteration, got "
                             f"{spec!r}")
        weights, _ = read_snapshot(run_dir, int(m.group(1)), "--opponent")
        policy = snapshot_policy(cfg, weights, obs_space, _action_space(cfg), "--opponent")
        return spec, PolicyPlayer(policy, obs_space)
    other = Path(spec)
    if not other.is_dir():
        raise UsageError(f"--opponent: expected random, heuristic, snapshot:N or a run "
                         f"directory, got {spec!r}")
    from ppokit.algos.runs import open_run

    try:
        run = open_run(other, need_env=False)
    except UsageError as exc:
        raise UsageError(f"--opponent: {spec}: {exc}") from None
    if run.cfg.env_id != cfg.env_id:
        raise UsageError(f"--opponent: {spec} is a run of {run.cfg.env_id}, not of "
                         f"{cfg.env_id}")
    policy, _, _ = run.policy()
    return str(other), PolicyPlayer(policy, obs_space)


def _action_space(cfg):
    return game_spaces(game_factory(cfg.env_id, cfg.env_kwargs))[1]


def evaluate_versus(run_dir: str | Path, spec: str, *, games: int, seed: int | None = None,
                    stochastic: bool = False) -> dict:
    """The run's results in ``games`` games against ``spec`` (module doc)."""
    from ppokit.algos.runs import open_run

    run_dir = Path(run_dir)
    run = open_run(run_dir, need_env=False)
    cfg = run.cfg
    if not cfg.selfplay:
        raise UsageError(f"--opponent: {run_dir} was not trained with selfplay = true (it "
                         f"trains {cfg.env_id}); evaluate it without --opponent")
    make_game = game_factory(cfg.env_id, cfg.env_kwargs)
    obs_space, _ = game_spaces(make_game)
    name, opponent = opponent_of(spec, run_dir, cfg, obs_space)
    policy, _, _ = run.policy()
    seed = cfg.seed + 1_000_000 if seed is None else seed
    scores = np.asarray(play_games(make_game, PolicyPlayer(policy, obs_space,
                                                           deterministic=not stochastic),
                                   name, opponent, games, seed, label=cfg.env_id))
    out = {"env_id": cfg.env_id, "opponent": name, "games": games, "seed": seed,
           "deterministic": not stochastic}
    for kind, value in (("win", 1.0), ("draw", 0.5), ("loss", 0.0)):
        k = int((scores == value).sum())
        out[COUNTS[kind]] = k
        out[kind + "_rate"] = k / games
        out[kind + "_interval"] = list(wilson(k, games))
    return out


def summary(res: dict) -> str:
    """The lines ``ppokit eval --opponent`` prints."""
    kind = "deterministic" if res["deterministic"] else "stochastic"
    lines = [f"{res['env_id']} vs {res['opponent']}: {res['games']} {kind} games, seats "
             f"alternating (seed {res['seed']}); rates with 95 % Wilson intervals"]
    for kind in ("win", "draw", "loss"):
        lo, hi = res[kind + "_interval"]
        lines.append(f"  {kind:<5}{res[kind + '_rate']:.3f}  [{lo:.3f}, {hi:.3f}]  "
                     f"({res[COUNTS[kind]]} games)")
    return "\n".join(lines)
