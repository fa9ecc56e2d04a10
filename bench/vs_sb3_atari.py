"""ppokit against Stable-Baselines3 on an Atari game, side by side in one invocation.

    python -m bench.vs_sb3_atari [--env ALE/Breakout-v5] [--iterations 8] [--repeats 1]

Both libraries train PPO with the Atari preset (8 envs x 128 steps, 4 epochs of
minibatches of 256, the Nature CNN) on the same preprocessed environments — ppokit's
Atari wrappers for both (SB3 through ``DummyVecEnv`` over the same constructors; see
``bench._atari_workers``) — for the same number of environment steps (default 8 envs x
128 x 8 iterations = 8192), each run in a fresh process with one torch thread, the two
libraries alternating. ppokit runs twice: as the preset has it (``precision = auto``: the
convolutional trunk in bfloat16 on a CPU that computes it natively, else float32) and in
float32 throughout (``precision = fp32``, SB3's number format), and, where EnvPool is
installed, as the preset on EnvPool's C++ Atari environments (``vectorization = envpool``:
the same preprocessing, stepped in EnvPool's threads; ppokit's fastest rollout path). The
table gives
environment steps per second of training, the rollout/update split (seconds per 1000
steps), peak resident memory and the ratios to SB3. No evaluation (a few thousand steps
learn nothing); this measures speed. Needs the ``bench`` and ``atari`` extras.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys

from bench._split import have


def _run(lib: str, env: str, seed: int, steps: int, envs: int, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "bench._atari_workers", "--lib", lib, "--env", env,
           "--seed", str(seed), "--steps", str(steps), "--envs", str(envs), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="ALE/Breakout-v5")
    p.add_argument("--iterations", type=int, default=8,
                   help="rollouts of 8 envs x 128 steps (default 8: 8192 steps)")
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--repeats", type=int, default=1, help="runs of each library")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ppokit-set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra ppokit config override (repeatable)")
    a = p.parse_args(argv)
    if not have("stable_baselines3"):
        return 2
    steps = a.iterations * a.envs * 128
    extra = [x for kv in a.ppokit_set for x in ("--set", kv)]
    from ppokit.policies.encoders import resolve_precision

    preset = resolve_precision("auto")
    runs = {"sb3": ("sb3", []), f"ppokit ({preset})": ("ppokit", extra)}
    if preset != "fp32":
        runs["ppokit (fp32)"] = ("ppokit", [*extra, "--set", "precision=fp32"])
    if importlib.util.find_spec("envpool") is not None and not any(k.startswith("vectorization=")
                                                for k in a.ppokit_set):
        # the preset's fastest rollout path: EnvPool's emulators and preprocessing in C++
        runs[f"ppokit ({preset}, EnvPool)"] = ("ppokit", [*extra, "--set",
                                                          "vectorization=envpool"])
    recs: dict[str, list[dict]] = {name: [] for name in runs}
    for k in range(a.repeats):
        for name, (lib, args) in runs.items():
            r = _run(lib, a.env, a.seed + k, steps, a.envs, args)
            recs[name].append(r)
            print(f"  {name:<14} run {k}: {r['steps']} steps in {r['train_s']:.1f} s "
                  f"({r['steps'] / r['train_s']:.0f} steps/s; rollout {r['rollout_s']:.1f} s, "
                  f"update {r['update_s']:.1f} s), peak {r['peak_rss_mb']:.0f} MB", flush=True)
    print()
    print(f"{'':<15}{'steps/s':>9}{'rollout s/1k':>14}{'update s/1k':>13}{'peak MB':>9}"
          f"{'x SB3':>8}")
    summ = {}
    for name, rs in recs.items():
        sps = statistics.median(r["steps"] / r["train_s"] for r in rs)
        ro = statistics.median(r["rollout_s"] / r["steps"] * 1e3 for r in rs)
        up = statistics.median(r["update_s"] / r["steps"] * 1e3 for r in rs)
        rss = max(r["peak_rss_mb"] for r in rs)
        summ[name] = (sps, ro, up, rss)
        ratio = sps / summ["sb3"][0]
        print(f"{name:<15}{sps:>9.1f}{ro:>14.3f}{up:>13.3f}{rss:>9.0f}{ratio:>7.2f}x")
    s = summ["sb3"]
    for name, k in summ.items():
        if name != "sb3":
            print(f"ratio {name}/SB3: throughput {k[0] / s[0]:.2f}x, rollout time "
                  f"{k[1] / s[1]:.2f}, update time {k[2] / s[2]:.2f}, peak memory "
                  f"{k[3] / s[3]:.2f}")
    print(f"({a.env}, {steps} steps, {a.envs} envs, {a.repeats} run(s) each, torch threads 1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
