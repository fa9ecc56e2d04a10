"""Self-play (ppokit.selfplay): the game wrapper's turn order and seats, masks, the fixed
players, snapshot files, the pool's choices and ratings, resume, and ``ppokit eval
--opponent``. Skipped without the pettingzoo extra."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")

from ppokit.algos import Trainer, resolve_config  # noqa: E402
from ppokit.errors import UsageError, UserCodeError  # noqa: E402
from ppokit.selfplay.games import RULES, SelfPlayEnv, game_factory  # noqa: E402
from ppokit.selfplay.match import play_games, wilson  # noqa: E402
from ppokit.selfplay.opponents import Fixed, Heuristic, RandomPlayer  # noqa: E402
from ppokit.selfplay.pool import (  # noqa: E402
    HEURISTIC,
    RANDOM,
    SnapshotPool,
    elo_update,
    read_snapshot,
    write_snapshot,
)

TTT = "pettingzoo:classic/tictactoe_v3"
C4 = "pettingzoo:classic/connect_four_v3"


class Checked:
    """A player that records every mask it is asked to move under, and its move."""

    def __init__(self, inner):
        self.inner, self.moves = inner, []

    def act(self, obs, rng):
        a = self.inner.act(obs, rng)
        self.moves.append((np.asarray(obs["action_mask"], bool).copy(), a))
        return a


def env_of(game_id, player, seat="alternate"):
    return SelfPlayEnv(game_factory(game_id)(), Fixed("p", player), seat=seat, label=game_id)


def test_turn_order_seats_alternate_and_the_board_is_the_learners():
    env = env_of(TTT, RandomPlayer())
    seats, free = [], []
    for k in range(6):
        obs, _ = env.reset(seed=k if k == 0 else None)
        seats.append(env.seat)
        free.append(int(obs["action_mask"].sum()))
        board = obs["observation"]
        # the learner's own plane is empty at its first move; the opponent's holds its
        # one move when the learner is second
        assert board[..., 0].sum() == 0 and board[..., 1].sum() == env.seat
    assert seats in ([0, 1] * 3, [1, 0] * 3)
    assert free == [9 - s for s in seats]
    obs, _ = env.reset(seed=0, options={"seat": "second"})
    assert env.seat == 1 and obs["action_mask"].sum() == 8


@pytest.mark.parametrize("game", [TTT, C4])
@pytest.mark.parametrize("player", ["random", "heuristic"])
def test_opponent_moves_are_always_legal_and_games_end_with_a_score(game, player):
    inner = RandomPlayer() if player == "random" else Heuristic(RULES[game.split("/")[1][:-3]])
    opp = Checked(inner)
    env = env_of(game, opp)
    rng = np.random.default_rng(0)
    results = set()
    for k in range(30):
        obs, _ = env.reset(seed=k)
        done = False
        while not done:
            legal = np.flatnonzero(obs["action_mask"])
            obs, r, done, _, info = env.step(int(rng.choice(legal)))
        results.add(info["selfplay"]["score"])
        assert info["selfplay"]["score"] == {1.0: 1.0, -1.0: 0.0, 0.0: 0.5}[env.total]
    assert opp.moves and all(mask[a] for mask, a in opp.moves)
    assert results <= {0.0, 0.5, 1.0}
    assert len(results) >= 2 or player == "heuristic"  # (which may win every game)


def test_an_illegal_move_is_refused_on_either_side():
    env = env_of(TTT, RandomPlayer(), seat="first")
    obs, _ = env.reset(seed=0)
    assert obs["action_mask"][4]
    env.step(4)  # the learner's centre; the opponent has answered
    with pytest.raises(ValueError, match="move 4 is not legal"):
        env.step(4)

    class Cheat:
        def act(self, obs, rng):
            return int(np.flatnonzero(obs["action_mask"] == 0)[0])

    env = env_of(TTT, Cheat(), seat="first")
    env.reset(seed=0)
    with pytest.raises(UserCodeError, match="opponent p chose the illegal move 4"):
        env.step(4)


def _obs(mine, theirs, mask):
    return {"observation": np.stack([mine, theirs], -1).astype(np.int8),
            "action_mask": np.asarray(mask, np.int8)}


def test_heuristic_wins_now_else_blocks_else_plays_legally():
    h, rng = Heuristic(RULES["tictactoe"]), np.random.default_rng(0)
    mine = np.array([[1, 1, 0], [0, 0, 0], [0, 0, 0]])
    theirs = np.array([[0, 0, 0], [1, 1, 0], [0, 0, 0]])
    free = ((mine + theirs) == 0).ravel()
    assert h.act(_obs(mine, theirs, free), rng) == 2  # completes the top row
    assert h.act(_obs(theirs * 0, theirs, ((theirs) == 0).ravel()), rng) == 5  # blocks
    empty = np.zeros((3, 3))
    moves = {h.act(_obs(empty, empty, np.ones(9)), rng) for _ in range(50)}
    assert len(moves) > 3  # no threat: random legal moves
    c4 = Heuristic(RULES["connect_four"])
    mine, theirs = np.zeros((6, 7)), np.zeros((6, 7))
    theirs[5, 0:3] = 1  # three in the bottom row: block at column 3
    mine[4, 0:2] = 1
    assert c4.act(_obs(mine, theirs, np.ones(7)), rng) == 3
    mine[5, 6], mine[4, 6], mine[3, 6] = 1, 1, 1  # a column of three: win on top of it
    assert c4.act(_obs(mine, theirs, np.ones(7)), rng) == 6


def test_heuristic_beats_random_in_real_games():
    make = game_factory(C4)
    scores = play_games(make, Heuristic(RULES["connect_four"]), "random", RandomPlayer(),
                        40, seed=0)
    assert np.mean(scores) > 0.8


def test_wilson_interval_matches_hand_computed_values():
    lo, hi = wilson(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert wilson(0, 20)[0] == 0.0 and wilson(20, 20)[1] == 1.0


def test_elo_update_against_a_hand_computed_value():
    # E = 1 / (1 + 10^(200/400)) = 0.240253; a win gains 16 * (1 - E)
    assert elo_update(1000.0, 1200.0, 1.0) == pytest.approx(12.15595, abs=1e-4)
    assert elo_update(1000.0, 1000.0, 0.5) == 0.0
    pool = SnapshotPool(_cfg(), None, {RANDOM: RandomPlayer(), HEURISTIC: None})
    pool.report(RANDOM, 1.0)  # the anchor stays at 1000
    assert pool.learner == pytest.approx(1008.0) and pool.records[RANDOM].rating == 1000.0
    pool.records[HEURISTIC].rating = 1200.0
    pool.report(HEURISTIC, 0.0)
    e = 1 / (1 + 10 ** ((1200 - 1008) / 400))
    assert pool.learner == pytest.approx(1008 - 16 * e)
    assert pool.records[HEURISTIC].rating == pytest.approx(1200 + 16 * e)
    assert pool.read_window() == [1, 0, 1] and pool.read_window() == [0, 0, 0]


class _Cfg:
    selfplay_pool, selfplay_pool_size, selfplay_latest_prob = "uniform", 3, 0.0
    selfplay_random_prob = selfplay_heuristic_prob = 0.0


def _cfg(**kw):
    c = _Cfg()
    for k, v in kw.items():
        setattr(c, k, v)
    return c


@pytest.mark.parametrize("mode, latest, want", [
    ("latest", 0.0, [0, 0, 1]), ("uniform", 0.0, [1 / 3] * 3),
    ("uniform", 0.4, [0.2, 0.2, 0.6]),
    # scores (w + d/2 + 1) / (n + 2): 9/10, 1/2, 1/10; weights (1 - s)^2 = .01, .25, .81
    ("prioritised", 0.0, [0.01 / 1.07, 0.25 / 1.07, 0.81 / 1.07])])
def test_pool_choice_distributions(mode, latest, want):
    pool = SnapshotPool(_cfg(selfplay_pool=mode, selfplay_latest_prob=latest),
                        None, {RANDOM: RandomPlayer(), HEURISTIC: None})
    for it in (5, 10, 15, 20):
        pool.add(it, f"player{it}")
    assert pool.members == [10, 15, 20]  # the newest pool_size snapshots
    r = pool.records
    r["snapshot:10"].wins = 8
    r["snapshot:15"].wins, r["snapshot:15"].losses = 3, 3
    r["snapshot:20"].losses = 8
    assert pool.weights() == pytest.approx(want)
    rng = np.random.default_rng(1)
    names = [pool.draw(rng)[0] for _ in range(4000)]
    freq = [names.count(f"snapshot:{m}") / 4000 for m in pool.members]
    assert freq == pytest.approx(want, abs=0.03)


def test_fixed_players_are_drawn_with_their_probabilities():
    heur = Heuristic(RULES["tictactoe"])
    pool = SnapshotPool(_cfg(selfplay_random_prob=0.2, selfplay_heuristic_prob=0.3), None,
                        {RANDOM: RandomPlayer(), HEURISTIC: heur})
    rng = np.random.default_rng(0)
    assert {pool.draw(rng)[0] for _ in range(50)} == {RANDOM}  # no snapshot yet
    pool.add(1, "p1")
    names = [pool.draw(rng)[0] for _ in range(4000)]
    assert names.count(RANDOM) / 4000 == pytest.approx(0.2, abs=0.03)
    assert names.count(HEURISTIC) / 4000 == pytest.approx(0.3, abs=0.03)


class _Centre:
    """A policy that always chooses move 4 (sampled or most likely)."""

    def act(self, o, gen, mask):
        return (torch.tensor([4]),)

    def deterministic_action(self, o, mask):
        return torch.tensor([4])


@pytest.mark.parametrize("prob", [0.0, 0.3, 1.0])
def test_policy_player_random_moves_with_their_probability(prob):
    from ppokit.selfplay.opponents import PolicyPlayer

    space = game_factory(TTT)().observation_space("player_1")
    player = PolicyPlayer(_Centre(), space, random_move_prob=prob)
    empty = _obs(np.zeros((3, 3)), np.zeros((3, 3)), np.ones(9))
    rng = np.random.default_rng(0)
    moves = np.array([player.act(empty, rng) for _ in range(3000)])
    # a random move is one of 9, so 8/9 of them leave the centre
    assert (moves != 4).mean() == pytest.approx(prob * 8 / 9, abs=0.025)
    if prob == 1.0:
        assert set(moves.tolist()) == set(range(9))
    if prob == 0.0:  # no extra draw from the game's generator: games repeat as before
        plain, rng0 = PolicyPlayer(_Centre(), space), np.random.default_rng(0)
        for _ in range(3000):
            plain.act(empty, rng0)
        assert rng.random() == rng0.random()
    with pytest.raises(ValueError, match="random_move_prob: expected a probability"):
        PolicyPlayer(_Centre(), space, random_move_prob=1.5)


def test_snapshot_files_are_data_and_are_checked(tmp_path):
    state = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}
    path = write_snapshot(tmp_path, 12, state, C4)
    assert path == tmp_path / "selfplay" / "snapshot_000012.safetensors"
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["iteration"] == 12 and meta["env_id"] == C4
    raw = path.read_bytes()
    header = int.from_bytes(raw[:8], "little")
    assert json.loads(raw[8:8 + header])["w"]["shape"] == [2, 3]  # safetensors, no pickle
    got, _ = read_snapshot(tmp_path, 12)
    assert torch.equal(got["w"], state["w"]) and torch.equal(got["b"], state["b"])
    path.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    with pytest.raises(UsageError, match="does not match"):
        read_snapshot(tmp_path, 12)
    with pytest.raises(UsageError, match="no snapshot 7 .*its snapshots: 12"):
        read_snapshot(tmp_path, 7)


def _train(run_dir, game=TTT, iterations=2, resume=False, **kw):
    over = dict(selfplay=True, n_envs=4, n_steps=16, total_timesteps=64 * iterations,
                selfplay_every=2, selfplay_eval_every=2, selfplay_eval_games=4,
                checkpoint_every=2, tensorboard=False, net_arch=[16])
    over.update(kw)
    cfg = resolve_config(env_id=game, overrides=over)
    tr = Trainer(cfg, run_dir, resume=resume, log=lambda m: None)
    if resume:
        tr.extend(64 * iterations - tr.global_step)
    tr.train()
    tr.close()
    return tr


def test_training_writes_snapshots_metrics_and_resumes_with_the_same_pool(tmp_path):
    run = tmp_path / "ttt"
    tr = _train(run, iterations=3, checkpoint_every=2)
    assert sorted(p.name for p in (run / "selfplay").glob("*.safetensors")) == [
        "snapshot_000001.safetensors", "snapshot_000002.safetensors"]
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["selfplay/pool_size"] for r in recs] == [1, 2, 2]
    assert recs[1]["selfplay/win_rate_random"] is not None
    assert recs[0]["selfplay/win_rate_random"] is None
    assert sum(recs[1][f"selfplay/{k}_rate_heuristic"] for k in ("win", "draw", "loss")) == 1
    # the last checkpoint (iteration 3) has the pool of snapshots 1 and 2; a snapshot
    # file written after it (a run killed later) is not a member on resume
    saved = tr.selfplay.state_dict()
    write_snapshot(run, 4, {"x": torch.zeros(1)}, TTT)
    back = _train(run, iterations=5, resume=True)
    assert back.iteration == 5
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["selfplay/pool_size"] for r in recs] == [1, 2, 2, 3, 3]
    assert back.selfplay.pool.members == [1, 2, 4]
    assert read_snapshot(run, 4)[0].keys() != {"x"}  # rewritten by the resumed run
    assert saved["members"] == [1, 2]


def test_snapshot_opponents_make_random_moves_as_configured(tmp_path):
    tr = _train(tmp_path / "eps", iterations=2, selfplay_snapshot_random_move_prob=0.25)
    players = tr.selfplay.pool.players
    assert sorted(players) == [1, 2]
    assert all(p.random_move_prob == 0.25 for p in players.values())


def test_config_refusals_are_one_line():
    cases = [({"selfplay": True}, "CartPole-v1", "selfplay: true needs a two-player"),
             ({"selfplay": True, "selfplay_random_prob": 0.6, "selfplay_heuristic_prob": 0.5},
              TTT, "selfplay_random_prob: 0.6 \\+ selfplay_heuristic_prob 0.5 is more"),
             ({"selfplay": True, "vectorization": "async"}, TTT, "vectorization: self-play"),
             ({"selfplay": True, "eval_every": 5}, TTT, "eval_every: a self-play run"),
             ({"selfplay": True, "selfplay_pool": "best"}, TTT, "selfplay_pool"),
             ({"selfplay": True, "selfplay_snapshot_random_move_prob": 1.5}, TTT,
              "selfplay_snapshot_random_move_prob")]
    for over, env, msg in cases:
        with pytest.raises(UsageError, match=msg) as e:
            resolve_config(env_id=env, overrides=over)
        assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    _train(root / "ttt", iterations=2)
    _train(root / "ttt2", iterations=2, seed=1)
    _train(root / "c4", game=C4, iterations=1, n_steps=8, total_timesteps=32, batch_size=32)
    return root


def test_eval_opponent_prints_rates_with_intervals(runs, capsys):
    from ppokit.cli import main

    for spec in ("random", "heuristic", "snapshot:2", str(runs / "ttt2")):
        assert main(["eval", str(runs / "ttt"), "--opponent", spec, "--episodes", "6"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith(f"{TTT} vs {spec}: 6 deterministic games, seats alternating")
        counts = [int(line.split("(")[1].split()[0]) for line in out[1:]]
        assert [line.split()[0] for line in out[1:]] == ["win", "draw", "loss"]
        assert sum(counts) == 6
        res = json.loads((runs / "ttt" / "eval_opponent.json").read_text())
        assert res["opponent"] == spec and [res["wins"], res["draws"], res["losses"]] == counts
        assert res["win_interval"][0] <= res["win_rate"] <= res["win_interval"][1]


@pytest.mark.parametrize("spec, msg", [
    ("bogus", "--opponent: expected random, heuristic, snapshot:N or a run directory"),
    ("snapshot:9", "--opponent: .* has no snapshot 9 .*its snapshots: 1, 2"),
    ("snapshot:-1", "--opponent: expected snapshot:N"),
    ("C4RUN", "--opponent: .*c4 is a run of pettingzoo:classic/connect_four_v3, not of "
     "pettingzoo:classic/tictactoe_v3")])
def test_eval_opponent_errors_are_one_line_exit_2(runs, capsys, spec, msg):
    from ppokit.cli import main

    spec = spec.replace("C4RUN", str(runs / "c4"))
    assert main(["eval", str(runs / "ttt"), "--opponent", spec, "--episodes", "2"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and __import__("re").search(msg, err[0]), err


def test_eval_opponent_needs_a_selfplay_run(tmp_path, capsys):
    from ppokit.cli import main

    cfg = resolve_config(env_id="CartPole-v1", overrides=dict(n_envs=2, n_steps=8, batch_size=16,
                                                             total_timesteps=16,
                                                             tensorboard=False))
    tr = Trainer(cfg, tmp_path / "cp", log=lambda m: None)
    tr.train()
    tr.close()
    assert main(["eval", str(tmp_path / "cp"), "--opponent", "random"]) == 2
    assert "was not trained with selfplay = true" in capsys.readouterr().err


def test_eval_without_an_opponent_names_the_flag(runs, capsys):
    from ppokit.cli import main

    assert main(["eval", str(runs / "ttt"), "--episodes", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a self-play run" in err[0] and "--opponent" in err[0]


class _Replies:
    """An opponent that plays, at its ``k``-th turn, legal move number ``choices[k]`` (0
    past the end of ``choices``), and records each choice and how many moves were legal."""

    def __init__(self, choices: list[int]):
        self.choices, self.taken, self.counts = choices, [], []

    def act(self, obs, rng) -> int:
        legal = np.flatnonzero(np.asarray(obs["action_mask"], bool))
        k = len(self.taken)
        choice = self.choices[k] if k < len(self.choices) else 0
        self.taken.append(choice)
        self.counts.append(len(legal))
        return int(legal[choice])


def _every_reply(make_game, learner, seat: str) -> tuple[int, list[list[int]]]:
    """The deterministic ``learner`` in ``seat`` against every sequence of legal opponent
    moves (depth first): the number of distinct games and the choices of those it lost."""
    choices, games, lost = [], 0, []
    while True:
        opponent = _Replies(choices)
        source = Fixed("replies", opponent)
        env = SelfPlayEnv(make_game(), source)
        obs, _ = env.reset(seed=0, options={"seat": seat})
        done = False
        while not done:
            obs, _, done, _, _ = env.step(learner.act(obs, env.np_random))
        games += 1
        if source.scores[-1] == 0.0:
            lost.append(opponent.taken)
        turns = [k for k, (c, n) in enumerate(zip(opponent.taken, opponent.counts))
                 if c + 1 < n]
        if not turns:
            return games, lost
        choices = opponent.taken[:turns[-1]] + [opponent.taken[turns[-1]] + 1]


_LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8),
          (2, 4, 6)]


def _first_free_games(board: list[int], turn: int, me: int) -> tuple[int, int]:
    """(games, losses) of a learner ``me`` that takes the first free cell against every
    sequence of the other player's moves, counted on a plain board (1 moves first)."""
    free = [i for i in range(9) if board[i] == 0]
    games = losses = 0
    for cell in free[:1] if turn == me else free:
        after = board[:cell] + [turn] + board[cell + 1:]
        if any(all(after[i] == turn for i in line) for line in _LINES):
            games, losses = games + 1, losses + (turn != me)
        elif len(free) == 1:
            games += 1
        else:
            g, lost = _first_free_games(after, 3 - turn, me)
            games, losses = games + g, losses + lost
    return games, losses


def test_every_reply_enumerates_every_game_of_a_fixed_learner():
    # a learner that takes its first legal move, against every sequence of the opponent's
    # legal moves: as many games and losses as a plain recursion over the board counts
    first = type("First", (), {"act": lambda self, obs, rng: int(
        np.flatnonzero(obs["action_mask"])[0])})()
    make = game_factory(TTT)
    for seat, me in (("first", 1), ("second", 2)):
        games, lost = _every_reply(make, first, seat)
        assert (games, len(lost)) == _first_free_games([0] * 9, 1, me)
        assert len({tuple(c) for c in lost}) == len(lost)
    assert _first_free_games([0] * 9, 1, 1) == (157, 58)
    assert _first_free_games([0] * 9, 1, 2) == (665, 429)


@pytest.mark.slow
def test_tictactoe_selfplay_example_never_loses(tmp_path):
    # docs/examples/selfplay-tictactoe.toml, trained within 10 minutes (one torch thread):
    # no loss in 1,000 games against the random player (seats alternating, the most likely
    # legal move), and none against any sequence of the opponent's legal moves from either
    # seat (the games the random player's are a sample of)
    import time
    from pathlib import Path

    from ppokit.algos.opponent_eval import evaluate_versus
    from ppokit.algos.runs import open_run
    from ppokit.cliutil import load_toml
    from ppokit.selfplay.coach import game_spaces
    from ppokit.selfplay.opponents import PolicyPlayer

    example = Path(__file__).parent.parent / "docs/examples/selfplay-tictactoe.toml"
    values = load_toml(str(example))
    t0 = time.perf_counter()
    cfg = resolve_config(toml_values=values, overrides={"tensorboard": False})
    tr = Trainer(cfg, tmp_path / "ttt", log=lambda m: None)
    tr.train()
    tr.close()
    assert time.perf_counter() - t0 < 600
    res = evaluate_versus(tmp_path / "ttt", "random", games=1000)
    assert res["losses"] == 0 and res["win_rate"] > 0.9, res
    make_game = game_factory(TTT)
    policy, _, _ = open_run(tmp_path / "ttt", need_env=False).policy()
    learner = PolicyPlayer(policy, game_spaces(make_game)[0], deterministic=True)
    for seat in ("first", "second"):
        games, lost = _every_reply(make_game, learner, seat)
        assert games > 50 and lost == [], (seat, games, lost[:5])


def test_train_cli_ends_with_games_against_the_random_player(tmp_path, capsys):
    from ppokit.cli import main

    run = tmp_path / "cli"
    code = main(["train", "--env", TTT, "--total-steps", "64", "--num-envs", "4",
                 "--run-dir", str(run), "--eval-episodes", "4", "--no-progress", "--set",
                 "selfplay=true", "n_steps=16", "batch_size=32", "net_arch=[16]",
                 "tensorboard=false"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "against the random player: win" in out.out and "(4 deterministic games)" in out.out
    res = json.loads((run / "eval_opponent.json").read_text())
    assert res["opponent"] == "random" and res["games"] == 4
    assert "note: the training return" not in out.err + out.out


def test_check_refuses_a_selfplay_run_in_one_line(runs, capsys):
    from ppokit.cli import main

    assert main(["check", str(runs / "ttt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not play self-play games" in err[0]
