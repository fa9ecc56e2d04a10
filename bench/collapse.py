"""How often does a CartPole-v1 run end without a solving policy? ppokit's fused minibatch
step against its eager reference step (and, on request, the reference paths throughout and
Stable-Baselines3), with the RL-zoo's settings, many seeds each.

    python -m bench.collapse [--seeds 0-39] [--parallel 2] [--steps 100000]
                             [--configs "ppokit fast,ppokit eager step,ppokit reference,sb3"]

Every run is a fresh process (``bench._ppokit_worker`` / ``bench._sb3_worker``, the same
workers ``bench.vs_sb3`` uses) that trains for ``--steps`` environment steps and then plays
10 deterministic evaluation episodes (seeds 10000 + run seed). Every process uses one
torch thread, so ``--parallel`` runs share the cores without oversubscription.

The configurations: ``ppokit fast`` (the default: fast collector, fused step), ``ppokit
eager step`` (the same fast collector, the eager reference step: the two steps alone are
compared), ``ppokit reference`` (``fast=false``: the reference collector and the eager
step) and ``sb3``. The table gives, per configuration, the distribution of the final
deterministic evaluation over the seeds: mean, median, the number of runs at 500 (every
evaluation episode played to CartPole's limit) and at or above 475 (CartPole's "solved")
with a 95 % Wilson interval, and the worst run; then, for each pair of configurations, both
counts side by side with a two-sided Fisher exact test of equal proportions and a 95 %
Newcombe interval of the difference. Installs nothing; sb3 needs the ``bench`` extra.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time

from ppokit.core.stats import wilson_interval as wilson

CONFIGS = {
    "ppokit fast": ("bench._ppokit_worker", []),
    "ppokit eager step": ("bench._ppokit_worker", ["--step", "eager"]),
    "ppokit reference": ("bench._ppokit_worker", ["--set", "fast=false"]),
    # one torch thread for every configuration: several runs share the machine, and more
    # threads than cores per process collapses throughput (the outcome does not depend on it)
    "sb3": ("bench._sb3_worker", ["--threads", "1"]),
}
SOLVED = 475.0
LIMIT = 500.0  # CartPole-v1's episode limit: every evaluation episode played to the end
DEFAULT_CONFIGS = ("ppokit fast", "ppokit eager step")


def _seeds(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided Fisher exact test of ``k1/n1`` against ``k2/n2``: the probability, with
    the margins fixed, of a table no more likely than the observed one."""
    k, n = k1 + k2, n1 + n2

    def prob(a: int) -> float:
        return math.comb(n1, a) * math.comb(n2, k - a) / math.comb(n, k)

    observed = prob(k1)
    lo, hi = max(0, k - n2), min(k, n1)
    p = sum(q for q in (prob(a) for a in range(lo, hi + 1)) if q <= observed * (1 + 1e-7))
    return min(1.0, p)


def newcombe(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float]:
    """95 % interval of ``k1/n1 − k2/n2`` from the two Wilson intervals (Newcombe's
    hybrid score method, his method 10)."""
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1)
    l2, u2 = wilson(k2, n2)
    d = p1 - p2
    return (d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2),
            d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2))


def summary(results: dict[str, dict[int, float]], seeds: list[int], steps: int) -> str:
    """The table of the module doc for ``results[config][seed]`` (final evaluations)."""
    names = list(results)
    lines = [f"CartPole-v1, RL-zoo PPO settings, {steps} steps, {len(seeds)} seeds each; "
             "final deterministic evaluation (10 episodes)",
             f"{'config':18s} {'mean':>7s} {'median':>7s} {'= 500':>8s} {'>= 475':>8s} "
             f"{'95% interval':>15s} {'worst':>7s}  seeds below 475"]
    counts = {}
    for name in names:
        evs = [results[name][s] for s in seeds]
        full = sum(e >= LIMIT for e in evs)
        k = sum(e >= SOLVED for e in evs)
        counts[name] = (full, k, len(evs))
        lo, hi = wilson(k, len(evs))
        below = [s for s in seeds if results[name][s] < SOLVED]
        lines.append(f"{name:18s} {statistics.mean(evs):7.1f} {statistics.median(evs):7.1f} "
                     f"{full:3d}/{len(evs):<4d} {k:3d}/{len(evs):<4d} [{lo:5.2f}, {hi:5.2f}] "
                     f"{min(evs):7.1f}  {below if below else '-'}")
    if len(names) > 1:
        lines += ["", "equal proportions? (two-sided Fisher exact test; 95 % Newcombe "
                  "interval of the difference)"]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for j, what in ((0, "= 500"), (1, ">= 475")):
                ka, kb, n = counts[a][j], counts[b][j], counts[a][2]
                lo, hi = newcombe(ka, n, kb, counts[b][2])
                lines.append(f"  {what:>6s}: {a} {ka}/{n} vs {b} {kb}/{counts[b][2]}: "
                             f"p = {fisher_exact(ka, n, kb, counts[b][2]):.3f}, difference "
                             f"{ka / n - kb / counts[b][2]:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0-39")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                   help=f"comma-separated, of: {', '.join(CONFIGS)}")
    p.add_argument("--json", default=None,
                   help="also write every run's final evaluation to this file")
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
    print(summary(results, seeds, a.steps))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": a.steps, "seeds": seeds, "eval_mean": results}, f, indent=1)


if __name__ == "__main__":
    main()
