"""How often does a CartPole-v1 run end without a solving policy? ppokit (fast paths and
reference paths) against Stable-Baselines3, with the RL-zoo's settings, many seeds each.

    python -m bench.collapse [--seeds 0-19] [--parallel 2] [--steps 100000]

Every run is a fresh process (``bench._ppokit_worker`` / ``bench._sb3_worker``, the same
workers ``bench.vs_sb3`` uses) that trains for ``--steps`` environment steps and then plays
10 deterministic evaluation episodes (seeds 10000 + run seed). Every process uses one
torch thread, so ``--parallel`` runs share the cores without oversubscription. The table gives, per
configuration, the distribution of the final deterministic evaluation over the seeds: mean,
median, the share of runs at or above 475 (CartPole's "solved") with a 95 % Wilson
interval, and the worst run. Installs nothing; needs the ``bench`` extra.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time

CONFIGS = {
    "ppokit fast": ("bench._ppokit_worker", []),
    "ppokit reference": ("bench._ppokit_worker", ["--set", "fast=false"]),
    # one torch thread for every configuration: several runs share the machine, and more
    # threads than cores per process collapses throughput (the outcome does not depend on it)
    "sb3": ("bench._sb3_worker", ["--threads", "1"]),
}
SOLVED = 475.0


def _seeds(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion ``k / n``."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0-19")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--configs", default=",".join(CONFIGS))
    a = p.parse_args()
    seeds = _seeds(a.seeds)
    names = [c.strip() for c in a.configs.split(",")]
    jobs = [(name, s) for s in seeds for name in names]
    results: dict[str, dict[int, float]] = {n: {} for n in names}
    running: list[tuple[str, int, subprocess.Popen]] = []
    t0 = time.perf_counter()
    while jobs or running:
        while jobs and len(running) < a.parallel:
            name, s = jobs.pop(0)
            module, extra = CONFIGS[name]
            cmd = [sys.executable, "-m", module, "--env", "CartPole-v1", "--seed", str(s),
                   "--steps", str(a.steps), *extra]
            running.append((name, s, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                      stderr=subprocess.PIPE, text=True)))
        time.sleep(0.5)
        for item in list(running):
            name, s, proc = item
            if proc.poll() is None:
                continue
            running.remove(item)
            out, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"{name} seed {s} failed:\n{err[-2000:]}")
            ev = json.loads(out.strip().splitlines()[-1])["eval_mean"]
            results[name][s] = ev
            print(f"  [{time.perf_counter() - t0:6.0f} s] {name:17s} seed {s:2d}: eval {ev:6.1f}",
                  flush=True)
    print()
    print(f"CartPole-v1, RL-zoo PPO settings, {a.steps} steps, {len(seeds)} seeds each; final "
          "deterministic evaluation (10 episodes)")
    print(f"{'config':18s} {'mean':>7s} {'median':>7s} {'>= 475':>8s} {'95% interval':>15s} "
          f"{'worst':>7s}  seeds below 475")
    for name in names:
        evs = [results[name][s] for s in seeds]
        k = sum(e >= SOLVED for e in evs)
        lo, hi = wilson(k, len(evs))
        below = [s for s in seeds if results[name][s] < SOLVED]
        print(f"{name:18s} {statistics.mean(evs):7.1f} {statistics.median(evs):7.1f} "
              f"{k:3d}/{len(evs):<4d} [{lo:5.2f}, {hi:5.2f}] {min(evs):7.1f}  "
              f"{below if below else '-'}")


if __name__ == "__main__":
    main()
