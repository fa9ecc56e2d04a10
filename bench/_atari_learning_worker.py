"""One run of ``bench.atari_learning``: train with one library, then play whole games with
the trained policy; prints one JSON line. An ALE game gets ppokit's Atari wrappers and
preset; a MinAtar game (``MinAtar/...``) its preset and, on SB3's side, a small-image
extractor (``bench._split.sb3_minatar_ppo``)."""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import gymnasium as gym
import numpy as np
import torch

from bench._split import sb3_atari_ppo, sb3_minatar_ppo, sb3_rollout_clock, train_ppokit


def _ppokit(a) -> dict:
    from ppokit.algos import Trainer, resolve_config
    from ppokit.algos.evaluate import evaluate_run

    cfg = resolve_config(overrides={"tensorboard": False, "torch_threads": 1},
                         flags={"env_id": a.env, "seed": a.seed, "total_timesteps": a.steps})
    with tempfile.TemporaryDirectory() as run_dir:
        tr = Trainer(cfg, run_dir, log=lambda s: None)
        train_s, _ = train_ppokit(tr)
        last100 = tr.mean_recent_return
        steps = tr.global_step
        tr.close()
        res = evaluate_run(run_dir, episodes=a.episodes, seed=_EVAL_SEED)
    return {"steps": steps, "train_s": train_s, "train_last100": last100,
            "scores": res["returns"]}


def _sb3(a) -> dict:
    from ppokit.algos.config import ATARI_PRESET, MINATAR_PREFIX
    from ppokit.envs import atari

    minatar = a.env.startswith(MINATAR_PREFIX)
    model = (sb3_minatar_ppo(a.env, a.seed) if minatar
             else sb3_atari_ppo(a.env, ATARI_PRESET["n_envs"], a.seed))
    games: list[float] = []
    clock = sb3_rollout_clock(lambda loc: _record_games(loc.get("infos", ()), games))
    t0 = time.perf_counter()
    model.learn(total_timesteps=a.steps, callback=clock)
    train_s = time.perf_counter() - t0
    scores = []
    for i in range(a.episodes):  # whole games seeded as ppokit's evaluation seeds them
        game = gym.make(a.env) if minatar else atari.make_env(a.env, training=False)
        obs, _ = game.reset(seed=_EVAL_SEED + i)
        total, done = 0.0, False
        while not done:
            act, _ = model.predict(obs, deterministic=True)
            obs, r, term, trunc, _ = game.step(int(act))
            total += float(r)
            done = term or trunc
        game.close()
        scores.append(total)
    return {"steps": int(model.num_timesteps), "train_s": train_s,
            "train_last100": float(np.mean(games[-100:])) if games else float("nan"),
            "scores": scores}


def _record_games(infos, games: list[float]) -> None:
    """The game scores the wrappers report when a game (not a life) ends (a MinAtar game is
    one episode: SB3's Monitor reports its return)."""
    for info in infos:
        if "game_score" in info:
            games.append(float(info["game_score"]))
        elif "episode" in info:
            games.append(float(info["episode"]["r"]))


_EVAL_SEED = 10_000


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lib", choices=("ppokit", "sb3"), required=True)
    p.add_argument("--env", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--episodes", type=int, default=10)
    a = p.parse_args()
    torch.set_num_threads(1)
    rec = (_ppokit if a.lib == "ppokit" else _sb3)(a)
    rec["mean"] = float(np.mean(rec["scores"]))
    rec["std"] = float(np.std(rec["scores"]))
    print(json.dumps(rec))


if __name__ == "__main__":
    main()
