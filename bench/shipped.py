"""The shipped command end to end against the script an SB3 user would write for it.

    python -m bench.shipped [--seeds 0,1,2] [--steps 100000]

Both sides train PPO on CartPole-v1 with the RL-zoo's settings for ``--steps``
environment steps and produce the same things, timed as the wall-clock time of a fresh
process from its start to its exit (interpreter start-up and imports included):

* ppokit: ``ppokit train --env CartPole-v1 --total-steps N --seed S --run-dir DIR`` with
  its defaults (the CartPole preset is the zoo's; TensorBoard logs, checkpoints, the
  final deterministic evaluation of 10 episodes, the learning-curve plot);
* SB3: a script (:data:`SB3_SCRIPT`, written to a temporary file) that does the same at
  SB3's defaults: ``make_vec_env`` with 8 environments (Monitor files for the curve),
  ``PPO`` with the zoo's hyperparameters and ``tensorboard_log``, ``learn``, ``save``,
  ``evaluate_policy`` on 10 deterministic episodes, and the learning curve from the
  Monitor files saved as a PNG with matplotlib.

Seeds interleave the two sides. Prints each run and the medians; the ratio is SB3's
median wall time over ppokit's. Needs the ``bench`` extra (SB3) and matplotlib.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SB3_SCRIPT = '''
import sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import load_results

seed, steps, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
env = make_vec_env("CartPole-v1", n_envs=8, seed=seed, monitor_dir=out + "/monitor")
lin = lambda v: (lambda p: p * v)
model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
            n_epochs=20, ent_coef=0.0, learning_rate=lin(1e-3), clip_range=lin(0.2),
            seed=seed, tensorboard_log=out + "/tb", verbose=0)
model.learn(steps)
model.save(out + "/model")
mean, std = evaluate_policy(model, make_vec_env("CartPole-v1", n_envs=1, seed=10_000 + seed),
                            n_eval_episodes=10, deterministic=True)
df = load_results(out + "/monitor")
plt.plot(df["l"].cumsum(), df["r"].rolling(20, min_periods=1).mean())
plt.xlabel("steps"); plt.ylabel("episode return")
plt.savefig(out + "/curve.png")
print(f"EVAL {mean}")
'''


def _timed(cmd: list[str]) -> tuple[float, str]:
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}...: exit {p.returncode}\n{p.stderr[-2000:]}")
    return wall, p.stdout + p.stderr


def _eval_of(text: str) -> float | None:
    """The deterministic evaluation's mean: ppokit's summary line says ``eval M ± S``, the
    SB3 script prints ``EVAL M``."""
    found = re.findall(r"\beval ([-0-9.]+)", text, flags=re.IGNORECASE)
    return float(found[-1]) if found else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=100_000)
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    ppokit = Path(sys.executable).parent / "ppokit"
    walls: dict[str, list[float]] = {"ppokit": [], "SB3": []}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "sb3_train.py"
        script.write_text(SB3_SCRIPT)
        for i, seed in enumerate(seeds):
            runs = [("ppokit", [str(ppokit), "train", "--env", "CartPole-v1", "--total-steps",
                                str(a.steps), "--seed", str(seed), "--no-progress",
                                "--run-dir", f"{tmp}/ppokit-{seed}"]),
                    ("SB3", [sys.executable, str(script), str(seed), str(a.steps),
                             f"{tmp}/sb3-{seed}"])]
            for name, cmd in (runs if i % 2 == 0 else runs[::-1]):
                wall, out = _timed(cmd)
                walls[name].append(wall)
                ev = _eval_of(out)
                print(f"seed {seed} {name:<6} {wall:7.2f} s  eval {ev}", flush=True)
            assert Path(f"{tmp}/sb3-{seed}/curve.png").is_file()
    med = {k: statistics.median(v) for k, v in walls.items()}
    print(f"\nmedian wall time, {len(seeds)} seeds, {a.steps} steps: ppokit "
          f"{med['ppokit']:.2f} s, SB3 {med['SB3']:.2f} s: ppokit "
          f"{med['SB3'] / med['ppokit']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
