"""ppokit against Stable-Baselines3, side by side in one invocation.

    python -m bench.vs_sb3 [--cases cartpole,halfcheetah] [--seeds 0,1,2] [--steps N]

For each case both libraries train PPO with the RL-zoo's tuned settings for the same number
of environment steps, one run after the other, each in a fresh process, for every seed. The
table gives seconds per 100k environment steps of training (median, min–max), the split
between rollout and update, the end-to-end wall time of the whole process (interpreter
start, imports, training, evaluation, exit), peak resident memory, the final deterministic
evaluation (10 episodes) and the ratios ppokit/SB3. Installs nothing; needs the ``bench``
extra (stable-baselines3) and, for HalfCheetah, the ``mujoco`` extra.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from bench._split import have

CASES = {"cartpole": ("CartPole-v1", 100_000), "halfcheetah": ("HalfCheetah-v5", 100_000)}


def _run(module: str, env: str, seed: int, steps: int, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", module, "--env", env, "--seed", str(seed),
           "--steps", str(steps), *extra]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    rec["wall_s"] = wall
    return rec


def _med(xs):
    return statistics.median(xs)


def _summary(recs: list[dict]) -> dict:
    per100k = [r["train_s"] / r["steps"] * 1e5 for r in recs]
    return {
        "per100k": per100k,
        "rollout": _med([r["rollout_s"] / r["steps"] * 1e5 for r in recs]),
        "update": _med([r["update_s"] / r["steps"] * 1e5 for r in recs]),
        "wall": [r["wall_s"] for r in recs],
        "rss": max(r["peak_rss_mb"] for r in recs),
        "eval": [r["eval_mean"] for r in recs],
        "threads": recs[0]["threads"],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="cartpole,halfcheetah")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=None, help="override the per-case step count")
    p.add_argument("--ppokit-set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra ppokit config override (repeatable)")
    a = p.parse_args(argv)
    if not have("stable_baselines3"):
        return 2
    seeds = [int(s) for s in a.seeds.split(",")]
    rows = []
    for case in a.cases.split(","):
        env, steps = CASES[case]
        steps = a.steps or steps
        recs = {"sb3": [], "ppokit": []}
        for seed in seeds:
            extra = [x for kv in a.ppokit_set for x in ("--set", kv)]
            recs["sb3"].append(_run("bench._sb3_worker", env, seed, steps, []))
            recs["ppokit"].append(_run("bench._ppokit_worker", env, seed, steps, extra))
            print(f"  {env} seed {seed}: sb3 {recs['sb3'][-1]['train_s']:.1f}s "
                  f"eval {recs['sb3'][-1]['eval_mean']:.1f} | ppokit "
                  f"{recs['ppokit'][-1]['train_s']:.1f}s eval "
                  f"{recs['ppokit'][-1]['eval_mean']:.1f}", flush=True)
        rows.append((env, steps, _summary(recs["sb3"]), _summary(recs["ppokit"])))
    print()
    print(f"{'case':<16}{'lib':<8}{'s/100k median (min-max)':>26}{'rollout':>9}{'update':>9}"
          f"{'end-to-end s':>14}{'peak MB':>9}{'eval mean':>11}")
    for env, steps, sb3, pk in rows:
        for name, s in (("sb3", sb3), ("ppokit", pk)):
            per = s["per100k"]
            print(f"{env:<16}{name:<8}{_med(per):>10.2f} ({min(per):6.2f}-{max(per):6.2f})"
                  f"{s['rollout']:>9.2f}{s['update']:>9.2f}{_med(s['wall']):>14.2f}"
                  f"{s['rss']:>9.0f}{statistics.mean(s['eval']):>11.1f}")
        thr = _med(sb3["per100k"]) / _med(pk["per100k"])
        wall = _med(pk["wall"]) / _med(sb3["wall"])
        print(f"{env:<16}{'ratio':<8} throughput ppokit/SB3 = {thr:.2f}x, end-to-end wall "
              f"ppokit/SB3 = {wall:.2f}, peak memory ppokit/SB3 = {pk['rss'] / sb3['rss']:.2f}"
              f"  ({steps} steps, seeds {a.seeds}, torch threads sb3 {sb3['threads']} "
              f"ppokit {pk['threads']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
