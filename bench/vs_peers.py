"""ppokit's CartPole PPO side by side with the peer libraries', in one invocation.

    python -m bench.vs_peers [--seeds 0,1,2] [--steps 100000] [--libs ppokit,sb3,rlox,...]
                             [--cpu N] [--skip-gae]

What runs: for every seed, one training run of each library in turn (round-robin over the
libraries within a seed, the order rotated from seed to seed), each a fresh process pinned
to one CPU (``--cpu``, default the last) with one thread (OMP/MKL/Rayon/torch):

- ``ppokit``: its default (``vectorization=auto``, for CartPole Gymnasium's NumPy
  ``CartPoleVectorEnv``), and ``ppokit sync`` (``vectorization=sync``: Gymnasium's
  ``CartPoleEnv`` in a ``SyncVectorEnv``), through ``bench._ppokit_worker``;
- ``sb3``: Stable-Baselines3 through ``bench._sb3_worker`` (``--threads 1``);
- the peers through ``bench._peer_worker``, each with its own PPO: ``rlox`` (on Gymnasium's
  CartPole), ``rlox-rust`` (on rlox's own Rust CartPole), ``skrl``, ``tianshou``,
  ``torchrl``, ``pufferlib`` (pufferlib-core).

Every run trains PPO with the RL-zoo's CartPole-v1 settings (8 envs, n_steps 32, batch 256,
20 epochs, gamma 0.98, GAE lambda 0.8, linear lr 1e-3 -> 0 and clip 0.2 -> 0, 64x64 tanh)
for ``--steps`` environment steps; what a peer cannot express is its row's deviations (and
the notes under the table say how the rest was set). Measured, from inside each process:
seconds of the training call alone (not imports, construction or evaluation) per 100k
environment steps; the table gives the median over the seeds, min–max, and each median
divided by ppokit's default median (``× ppokit``; above 1 is slower than ppokit) and by
``ppokit sync``'s; and the final deterministic evaluation (10 episodes, mean over the
seeds). The peers and ppokit seed evaluation episode ``k`` with ``10000 + seed + k``; SB3's
worker seeds its first evaluation episode with ``10000 + seed`` and plays on. The table has
two groups: the same environment code for every library (Gymnasium's ``CartPoleEnv``), and
each library's fastest environment where that is another one (ppokit's default, rlox's Rust
CartPole). Libraries not installed are listed as such with their install command; a library
whose worker reports an error is listed as unavailable with the reason.

Then ``bench.env_gae`` (pinned the same way) times ppokit's environment GAE against rlox's
Rust GAE on 8x2048 and 64x4096 and gives their largest differences from ppokit's reference
loop. Installs nothing: the peers come with the ``bench`` extra (see pyproject.toml for the
two that need ``--no-deps``). The machine should be otherwise idle.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

SAME = "same"  # Gymnasium's CartPoleEnv, one Python object per environment
FASTEST = "fastest"  # a library's fastest environment, where that is another one
GROUP_TITLES = {
    SAME: "The same environment code: Gymnasium's CartPoleEnv (one Python object per env)",
    FASTEST: "Each library's fastest CartPole (where that is not Gymnasium's CartPoleEnv)",
}
BASE, BASE_SYNC = "ppokit", "ppokit sync"
# name -> (group, worker module, worker arguments, module that must import, install hint,
#          label in the table)
ENTRIES = {
    "ppokit": (FASTEST, "bench._ppokit_worker", ["--env", "CartPole-v1"], "ppokit",
               "pip install -e .", "ppokit (default: Gymnasium's NumPy CartPoleVectorEnv)"),
    "ppokit sync": (SAME, "bench._ppokit_worker",
                    ["--env", "CartPole-v1", "--set", "vectorization=sync"], "ppokit",
                    "pip install -e .", "ppokit (vectorization=sync)"),
    "sb3": (SAME, "bench._sb3_worker", ["--env", "CartPole-v1", "--threads", "1"],
            "stable_baselines3", "pip install stable-baselines3", "Stable-Baselines3"),
    "rlox": (SAME, "bench._peer_worker", ["--lib", "rlox"], "rlox", "pip install rlox",
             "rlox"),
    "rlox-rust": (FASTEST, "bench._peer_worker", ["--lib", "rlox-rust"], "rlox",
                  "pip install rlox", "rlox (its Rust CartPole)"),
    "skrl": (SAME, "bench._peer_worker", ["--lib", "skrl"], "skrl", "pip install skrl",
             "skrl"),
    "tianshou": (SAME, "bench._peer_worker", ["--lib", "tianshou"], "tianshou",
                 "pip install --no-deps tianshou, and its deps but pandas<3: see pyproject.toml",
                 "tianshou"),
    "torchrl": (SAME, "bench._peer_worker", ["--lib", "torchrl"], "torchrl",
                "pip install torchrl", "torchrl"),
    "pufferlib": (SAME, "bench._peer_worker", ["--lib", "pufferlib"], "pufferlib",
                  "pip install --no-deps pufferlib-core, and its deps but torch: see "
                  "pyproject.toml", "PufferLib (pufferlib-core)"),
}
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")


def installed(name: str) -> bool:
    return importlib.util.find_spec(ENTRIES[name][3]) is not None


def normalize(rec: dict) -> dict:
    """A worker's JSON line as the table reads it: ``s_per_100k``, ``eval_mean``,
    ``deviations``, ``notes`` (ppokit's and SB3's workers report ``train_s``)."""
    if "error" in rec:
        return rec
    seconds = rec["seconds"] if "seconds" in rec else rec["train_s"]
    return {**rec, "seconds": seconds, "s_per_100k": seconds / rec["steps"] * 1e5,
            "deviations": rec.get("deviations", []), "notes": rec.get("notes", [])}


def summarize(recs: list[dict]) -> dict:
    """Median (and min, max) seconds per 100k steps and mean evaluation over the runs."""
    per = [r["s_per_100k"] for r in recs]
    return {"median": statistics.median(per), "min": min(per), "max": max(per),
            "eval": statistics.mean(r["eval_mean"] for r in recs), "n": len(recs)}


def _ratio(x: float, base: dict | None) -> str:
    return f"{x / base['median']:.2f}" if base else "–"


def markdown_table(results: dict[str, dict]) -> str:
    """The table for ``results[name] = {"recs": [...], "error": str | None}`` (the names of
    ``ENTRIES``, in their order); ratios against ppokit's default and ``ppokit sync``."""
    summ = {n: summarize(r["recs"]) for n, r in results.items()
            if r["recs"] and not r.get("error")}
    base, base_sync = summ.get(BASE), summ.get(BASE_SYNC)
    head = ("| library | s/100k (median) | min–max | × ppokit | × ppokit sync | "
            "eval (mean over seeds) | deviations |\n|---|---:|---:|---:|---:|---:|---|")
    out = []
    for group in (SAME, FASTEST):
        names = [n for n in ENTRIES if n in results and ENTRIES[n][0] == group]
        if not names:
            continue
        out += ["", f"**{GROUP_TITLES[group]}**", "", head]
        for n in names:
            label = ENTRIES[n][5]
            if n not in summ:
                out.append(f"| {label} | {results[n].get('error') or 'no runs'} | | | | | |")
                continue
            s = summ[n]
            dev = "; ".join(results[n]["recs"][0]["deviations"]) or "none"
            out.append(f"| {label} | {s['median']:.2f} | {s['min']:.2f}–{s['max']:.2f} | "
                       f"{_ratio(s['median'], base)} | {_ratio(s['median'], base_sync)} | "
                       f"{s['eval']:.1f} | {dev} |")
    return "\n".join(out)


def _pin(cpu: int):
    return lambda: os.sched_setaffinity(0, {cpu})


def _child_env() -> dict:
    env = dict(os.environ)
    env.update({v: "1" for v in THREAD_VARS})
    return env


def run_one(name: str, seed: int, steps: int, cpu: int, timeout: float) -> dict:
    """One fresh, pinned worker process; its JSON line (normalised), or ``{"error": ...}``."""
    _, module, extra, *_ = ENTRIES[name]
    cmd = [sys.executable, "-m", module, "--seed", str(seed), "--steps", str(steps), *extra]
    if module == "bench._peer_worker":
        cmd += ["--cpu", str(cpu)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout,
                             preexec_fn=_pin(cpu), env=_child_env())
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout:.0f} s"}
    lines = [ln for ln in out.stdout.strip().splitlines() if ln.startswith("{")]
    if lines:
        rec = json.loads(lines[-1])
        if out.returncode == 0 or "error" in rec:
            return normalize(rec)
    tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"error": f"worker exited {out.returncode}: {tail[:300]}"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--libs", default=",".join(ENTRIES),
                   help=f"comma-separated, of: {', '.join(ENTRIES)}")
    p.add_argument("--cpu", type=int, default=None, help="CPU to pin every run to "
                   "(default: the last)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument("--skip-gae", action="store_true", help="leave out the GAE comparison")
    a = p.parse_args(argv)
    names = [n.strip() for n in a.libs.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENTRIES]
    if unknown:
        p.error(f"unknown libraries {unknown}; choose from {', '.join(ENTRIES)}")
    names = [n for n in ENTRIES if n in names]  # the table's order
    cpu = sorted(os.sched_getaffinity(0))[-1] if a.cpu is None else a.cpu
    seeds = [int(s) for s in a.seeds.split(",")]
    results: dict[str, dict] = {}
    for n in names:
        ok = installed(n)
        results[n] = {"recs": [], "error": None if ok else f"not installed ({ENTRIES[n][4]})"}
    runnable = [n for n in names if results[n]["error"] is None]
    print(f"CartPole-v1 PPO, RL-zoo settings, {a.steps} steps, seeds {a.seeds}, every run a "
          f"fresh process pinned to CPU {cpu} with one thread", flush=True)
    t0 = time.perf_counter()
    for i, seed in enumerate(seeds):
        k = i % len(runnable) if runnable else 0
        for n in runnable[k:] + runnable[:k]:  # round-robin, rotated per seed
            if results[n]["error"]:
                continue  # unavailable: its first failure is the reason
            rec = run_one(n, seed, a.steps, cpu, a.timeout)
            if "error" in rec:
                results[n]["error"] = f"unavailable: {rec['error']}"
                print(f"  [{time.perf_counter() - t0:6.0f} s] {n:12s} seed {seed}: "
                      f"{results[n]['error']}", flush=True)
                continue
            results[n]["recs"].append(rec)
            print(f"  [{time.perf_counter() - t0:6.0f} s] {n:12s} seed {seed}: "
                  f"{rec['s_per_100k']:7.2f} s/100k, eval {rec['eval_mean']:6.1f}", flush=True)
    print()
    print(f"### CartPole-v1 PPO (RL-zoo settings), {a.steps} steps, seeds {a.seeds}; "
          f"seconds of training per 100k steps on one pinned CPU, one thread")
    print(markdown_table(results))
    notes = [(n, results[n]["recs"][0]) for n in names if results[n]["recs"]]
    if any(r["notes"] for _, r in notes):
        print("\nNotes (how each peer was set up; versions):")
        for n, r in notes:
            if r["notes"] or r.get("versions"):
                vers = ", ".join(f"{k} {v}" for k, v in r.get("versions", {}).items())
                print(f"- {n}: " + "; ".join(r["notes"]) + (f" [{vers}]" if vers else ""))
    if not a.skip_gae:
        print("\n### Environment GAE: ppokit against rlox's Rust GAE (bench.env_gae)\n",
              flush=True)
        cmd = [sys.executable, "-m", "bench.env_gae", "--sizes", "8x2048,64x4096"]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False,
                             preexec_fn=_pin(cpu), env=_child_env())
        print(out.stdout.rstrip() or out.stderr[-2000:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
