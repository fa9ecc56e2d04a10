"""The snapshot pool of a self-play run: the learner's past policies, as data files in the
run directory, and who each training episode plays.

Snapshots: ``RUN/selfplay/snapshot_NNNNNN.safetensors`` (the policy's weights after
iteration ``NNNNNN``) and ``snapshot_NNNNNN.json`` (its iteration, the run's game and the
weights file's SHA-256), each written atomically; they are read back as data only
(safetensors, JSON), checked against the recorded hash. The pool is the newest
``selfplay_pool_size`` snapshots (older files stay, for ``ppokit eval --opponent
snapshot:N``). Until the first snapshot (after iteration 1) episodes play the random
player.

Each episode's opponent (:meth:`SnapshotPool.draw`, from the episode's environment
generator): the random player with probability ``selfplay_random_prob``, the
one-step-lookahead player with ``selfplay_heuristic_prob``, else a snapshot: the newest
with probability ``selfplay_latest_prob``, else as ``selfplay_pool`` says — ``latest`` the
newest, ``uniform`` any, ``prioritised`` snapshot ``i`` with weight ``(1 − s_i)²`` where
``s_i = (wins_i + ½ draws_i + 1) / (games_i + 2)`` is the learner's smoothed score against
it (training games): the snapshots the learner wins least against are met most.

Ratings (Elo): the random player is the anchor, fixed at 1000; the learner starts at 1000,
a snapshot starts at the learner's rating when it is taken, the one-step-lookahead player
at 1000. After each game (training and evaluation) with the learner's score ``s`` (1, ½,
0) against opponent ``o``: ``E = 1 / (1 + 10^((R_o − R_learner) / 400))``, the learner
gains ``K (s − E)`` and ``o`` (unless it is the anchor) loses as much, ``K = 16``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load as t_load
from safetensors.torch import save as t_save

from ppokit.errors import UsageError
from ppokit.io.atomic import MAX_DATA_FILE, atomic_write_bytes, atomic_write_text, read_regular

__all__ = ["SnapshotPool", "Record", "elo_update", "snapshot_path", "write_snapshot",
           "read_snapshot", "list_snapshots", "ANCHOR", "ELO_K", "RANDOM", "HEURISTIC"]

ANCHOR = 1000.0
ELO_K = 16.0
RANDOM, HEURISTIC = "random", "heuristic"
SUBDIR = "selfplay"


def elo_update(r_learner: float, r_opponent: float, score: float,
               k: float = ELO_K) -> float:
    """The learner's rating change after one game with ``score`` (module doc)."""
    expected = 1.0 / (1.0 + 10.0 ** ((r_opponent - r_learner) / 400.0))
    return k * (score - expected)


def snapshot_path(run_dir: str | Path, iteration: int) -> Path:
    return Path(run_dir) / SUBDIR / f"snapshot_{iteration:06d}.safetensors"


def write_snapshot(run_dir: str | Path, iteration: int, state: dict, env_id: str) -> Path:
    """Write a policy's ``state`` (its ``state_dict``) as snapshot ``iteration``."""
    path = snapshot_path(run_dir, iteration)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = t_save({k: v.detach().cpu().clone().contiguous() for k, v in state.items()})
    atomic_write_bytes(path, data)
    meta = {"iteration": iteration, "env_id": env_id,
            "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    atomic_write_text(path.with_suffix(".json"), json.dumps(meta) + "\n")
    return path


def list_snapshots(run_dir: str | Path) -> list[int]:
    """The iterations of the snapshots in a run directory, in order."""
    d = Path(run_dir) / SUBDIR
    names = sorted(d.glob("snapshot_*.safetensors")) if d.is_dir() else []
    return [int(p.stem[9:]) for p in names if p.stem[9:].isdigit()]


def read_snapshot(run_dir: str | Path, iteration: int, where: str = "snapshot"
                  ) -> tuple[dict[str, torch.Tensor], dict]:
    """``(weights, meta)`` of snapshot ``iteration``; a one-line :class:`UsageError` when
    it is missing or does not match its JSON."""
    path = snapshot_path(run_dir, iteration)
    if not path.exists():
        have = ", ".join(str(i) for i in list_snapshots(run_dir)) or "none"
        raise UsageError(f"{where}: {Path(run_dir)} has no snapshot {iteration} ({path.name}); "
                         f"its snapshots: {have}")
    try:
        meta = json.loads(read_regular(path.with_suffix(".json")))
        data = read_regular(path, MAX_DATA_FILE)
    except (OSError, ValueError, UsageError) as exc:
        raise UsageError(f"{where}: snapshot {iteration} of {Path(run_dir)} is unreadable "
                         f"({str(exc).splitlines()[0][:200]})") from None
    if not isinstance(meta, dict) or meta.get("sha256") != hashlib.sha256(data).hexdigest():
        raise UsageError(f"{where}: {path} does not match {path.with_suffix('.json').name} "
                         "(damaged)")
    try:
        return t_load(data), meta
    except Exception as exc:  # noqa: BLE001 (safetensors raises its own errors)
        raise UsageError(f"{where}: {path} is not a safetensors file ({exc})") from None


@dataclass
class Record:
    """A pool member's or fixed player's results (the learner's view) and rating."""

    rating: float = ANCHOR
    wins: int = 0
    draws: int = 0
    losses: int = 0

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    def smoothed_score(self) -> float:
        return (self.wins + 0.5 * self.draws + 1.0) / (self.games + 2.0)


class SnapshotPool:
    """The pool and the ratings of one run (module doc). ``player(iteration)`` builds the
    player of a snapshot; ``fixed``: the random and the one-step-lookahead players (the
    latter ``None`` for a game it does not know)."""

    def __init__(self, cfg, player, fixed: dict):
        self.cfg, self.player, self.fixed = cfg, player, fixed
        self.members: list[int] = []  # snapshot iterations, oldest first
        self.records: dict[str, Record] = {RANDOM: Record(), HEURISTIC: Record()}
        self.learner = ANCHOR
        self.players: dict[int, object] = {}
        self.window = [0, 0, 0]  # training games' wins, draws, losses since last read

    @staticmethod
    def name(iteration: int) -> str:
        return f"snapshot:{iteration}"

    def add(self, iteration: int, policy_player) -> None:
        """Snapshot ``iteration`` (its files already written) joins the pool."""
        self.members = [m for m in self.members if m != iteration] + [iteration]
        self.players[iteration] = policy_player
        self.records[self.name(iteration)] = Record(rating=self.learner)
        for old in self.members[:-self.cfg.selfplay_pool_size]:
            self.players.pop(old, None)
        self.members = self.members[-self.cfg.selfplay_pool_size:]

    def weights(self) -> np.ndarray:
        """The choice probabilities of the pool's members (oldest first), ``selfplay_pool``
        and ``selfplay_latest_prob`` together (module doc)."""
        n, c = len(self.members), self.cfg
        if c.selfplay_pool == "latest":
            rest = np.eye(n)[-1]
        elif c.selfplay_pool == "uniform":
            rest = np.full(n, 1.0 / n)
        else:
            s = np.array([self.records[self.name(m)].smoothed_score() for m in self.members])
            rest = (1.0 - s) ** 2
            rest = rest / rest.sum()
        return c.selfplay_latest_prob * np.eye(n)[-1] + (1 - c.selfplay_latest_prob) * rest

    def draw(self, rng: np.random.Generator):
        c, u = self.cfg, rng.random()
        if u < c.selfplay_random_prob or not self.members:
            return RANDOM, self.fixed[RANDOM]
        if u < c.selfplay_random_prob + c.selfplay_heuristic_prob and self.fixed[HEURISTIC]:
            return HEURISTIC, self.fixed[HEURISTIC]
        m = self.members[int(rng.choice(len(self.members), p=self.weights()))]
        if m not in self.players:
            self.players[m] = self.player(m)
        return self.name(m), self.players[m]

    def report(self, name: str, score: float, training: bool = True) -> None:
        """A finished game's score (the learner's) against ``name``: results and Elo."""
        rec = self.records.get(name)
        if rec is None:  # (a snapshot that has left the pool while its game went on)
            return
        slot = 0 if score == 1.0 else 1 if score == 0.5 else 2
        rec.wins, rec.draws, rec.losses = (rec.wins + (slot == 0), rec.draws + (slot == 1),
                                           rec.losses + (slot == 2))
        if training:
            self.window[slot] += 1
        delta = elo_update(self.learner, rec.rating, score)
        self.learner += delta
        if name != RANDOM:
            rec.rating -= delta

    def read_window(self) -> list[int]:
        out, self.window = self.window, [0, 0, 0]
        return out

    def state_dict(self) -> dict:
        return {"members": list(self.members), "learner": self.learner,
                "window": list(self.window),
                "records": {k: asdict(v) for k, v in self.records.items()}}

    def load_state_dict(self, st: dict) -> None:
        members = [int(m) for m in st["members"]]
        if any(m < 1 for m in members):
            raise ValueError("selfplay: snapshot iterations must be >= 1")
        self.members, self.players = members, {}
        self.learner = float(st["learner"])
        self.window = [int(x) for x in st["window"]]
        self.records = {str(k): Record(float(v["rating"]), int(v["wins"]), int(v["draws"]),
                                       int(v["losses"])) for k, v in st["records"].items()}
