"""ppokit's recurrent PPO against sb3-contrib's ``RecurrentPPO``, side by side in one run.

    python -m bench.vs_sb3_contrib [--cases cartpole-novel,pendulum-novel] [--seeds 0]
                                   [--steps N]

Each case trains an LSTM policy on a velocity-hidden task (``ppokit/CartPoleNoVel-v1``,
``ppokit/PendulumNoVel-v1``: the same environment for both libraries) with the same
settings — ppokit's preset, which follows the RL-zoo's RecurrentPPO values — for the same
number of environment steps, one library after the other, each in a fresh process, both
with one torch thread (``--sb3-threads`` changes sb3-contrib's). The table gives seconds
per 100k environment steps of training (median, min–max), the rollout / update split, peak
resident memory, the final deterministic evaluation (10 episodes) and the throughput ratio
ppokit / sb3-contrib.
Installs nothing; needs the ``bench`` extra (sb3-contrib).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench._split import have
from bench.vs_sb3 import _med, _run, _summary

CASES = {"cartpole-novel": ("ppokit/CartPoleNoVel-v1", 50_000),
         "pendulum-novel": ("ppokit/PendulumNoVel-v1", 50_000)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="cartpole-novel")
    p.add_argument("--seeds", default="0")
    p.add_argument("--steps", type=int, default=None, help="override the per-case step count")
    p.add_argument("--sb3-threads", type=int, default=1,
                   help="sb3-contrib's torch threads (default 1, as ppokit; 0: torch's own)")
    a = p.parse_args(argv)
    if not have("sb3_contrib"):
        return 2
    seeds = [int(s) for s in a.seeds.split(",")]
    rows = []
    for case in a.cases.split(","):
        if case not in CASES:
            print(f"--cases: unknown case {case!r} (known: {', '.join(CASES)})",
                  file=sys.stderr)
            return 2
        env, steps = CASES[case]
        steps = a.steps or steps
        recs = {"sb3": [], "ppokit": []}
        for seed in seeds:
            recs["sb3"].append(_run("bench._sb3_contrib_worker", env, seed, steps,
                                    ["--threads", str(a.sb3_threads)]))
            recs["ppokit"].append(_run("bench._ppokit_worker", env, seed, steps, []))
            print(f"  {env} seed {seed}: sb3-contrib {recs['sb3'][-1]['train_s']:.1f}s "
                  f"eval {recs['sb3'][-1]['eval_mean']:.1f} | ppokit "
                  f"{recs['ppokit'][-1]['train_s']:.1f}s eval "
                  f"{recs['ppokit'][-1]['eval_mean']:.1f}", flush=True)
        rows.append((env, steps, _summary(recs["sb3"]), _summary(recs["ppokit"])))
    print()
    print(f"{'case':<26}{'lib':<13}{'s/100k median (min-max)':>26}{'rollout':>9}"
          f"{'update':>9}{'peak MB':>9}{'eval mean':>11}")
    for env, steps, sb3, pk in rows:
        for name, s in (("sb3-contrib", sb3), ("ppokit", pk)):
            per = s["per100k"]
            print(f"{env:<26}{name:<13}{_med(per):>10.2f} ({min(per):6.2f}-{max(per):6.2f})"
                  f"{s['rollout']:>9.2f}{s['update']:>9.2f}{s['rss']:>9.0f}"
                  f"{statistics.mean(s['eval']):>11.1f}")
        thr = _med(sb3["per100k"]) / _med(pk["per100k"])
        print(f"{env:<26}{'ratio':<13} throughput ppokit/sb3-contrib = {thr:.2f}x "
              f"(rollout {sb3['rollout'] / pk['rollout']:.2f}x, update "
              f"{sb3['update'] / pk['update']:.2f}x; {steps} steps, seeds {a.seeds}, "
              f"torch threads sb3-contrib {sb3['threads']} ppokit {pk['threads']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
