"""Breakout (or another ALE game, or a MinAtar game) learned by ppokit and by
Stable-Baselines3 at the same budget: the same wrappers (ppokit.envs.atari) and PPO Atari
preset, SB3's ``CnnPolicy``, one torch thread each; both libraries' runs of a seed train
at the same time, each in its own process. Each trained policy then plays whole games (all
lives, unclipped score, deterministic actions) on the same evaluation seeds; the table
gives the mean score and its spread per library. A MinAtar game (``MinAtar/Breakout-v1``)
gets ppokit's MinAtar preset on both sides, SB3's ``CnnPolicy`` with a small-image
extractor of the same three 3x3 convolutions.

    python -m bench.atari_learning --steps 1000000 --seeds 0,1
    python -m bench.atari_learning --env MinAtar/Breakout-v1 --steps 1000000 --seeds 0
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from bench._split import have


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="ALE/Breakout-v5")
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--episodes", type=int, default=10, help="evaluation games per run")
    a = p.parse_args(argv)
    if not have("stable_baselines3"):
        return 2
    rows = {"sb3": [], "ppokit": []}
    for seed in (int(s) for s in a.seeds.split(",")):
        procs = {lib: subprocess.Popen(
            [sys.executable, "-m", "bench._atari_learning_worker", "--lib", lib, "--env", a.env,
             "--steps", str(a.steps), "--seed", str(seed), "--episodes", str(a.episodes)],
            stdout=subprocess.PIPE, text=True) for lib in rows}
        for lib, proc in procs.items():
            out, _ = proc.communicate()
            if proc.returncode:
                print(f"{lib} seed {seed} failed (exit {proc.returncode})", file=sys.stderr)
                return 1
            rec = json.loads(out.strip().splitlines()[-1])
            rows[lib].append(rec)
            print(f"  {lib:<7} seed {seed}: eval {rec['mean']:.1f} ± {rec['std']:.1f} over "
                  f"{len(rec['scores'])} games, last 100 training games {rec['train_last100']:.1f}"
                  f", {rec['steps']} steps in {rec['train_s']:.0f} s", flush=True)
    print(f"\n{a.env}, {a.steps} steps per run, seeds {a.seeds}")
    print(f"{'lib':<8}{'eval mean of seeds':>20}{'per seed':>24}{'training last 100':>20}")
    for lib, recs in rows.items():
        means = [r["mean"] for r in recs]
        spread = f"{statistics.mean(means):.1f}" + (
            f" ± {statistics.stdev(means):.1f}" if len(means) > 1 else "")
        per_seed = ", ".join(f"{m:.1f}" for m in means)
        train = statistics.mean(r["train_last100"] for r in recs)
        print(f"{lib:<8}{spread:>20}{per_seed:>24}{train:>20.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
