"""Token training on 1 process vs N data-parallel ranks (torchrun, gloo), side by side.

    python -m bench.llm_ranks [--algo grpo] [--iterations 30] [--nproc 2] [--repeats 2]

Each configuration is ``ppokit llm train`` on the built-in task with the same seed and
the same global batch (the preset's prompts_per_iter × samples_per_prompt), run
``--repeats`` times, alternating, every process with one torch thread. Per-iteration
seconds are read from the run's metrics.jsonl (rank 0's clock; the first two iterations
are left out as warm-up): generation, scoring (rewards, the frozen forward passes, the
gathering of the batch across ranks and the labels), training (the update), and the
total. The ratios
are 1 process ÷ N ranks (above 1: the ranks are faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("time_generation", "time_scoring", "time_training")


def _run(algo: str, iterations: int, nproc: int, seed: int, run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "ppokit", "llm", "train", "--algo", algo, "--set",
           f"iterations={iterations}", "--set", f"seed={seed}", "--set",
           f"checkpoint_every={iterations}", "--run-dir", str(run_dir), "--no-progress",
           "--no-eval"]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    rows = rows[2:]
    out = {p: statistics.mean(r[p] for r in rows) for p in PHASES}
    out["iteration"] = sum(out[p] for p in PHASES)
    out["tokens"] = statistics.mean(r["response_tokens"] for r in rows)
    out["process_wall"] = wall
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", default="grpo")
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    res: dict[int, list[dict]] = {1: [], a.nproc: []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            for n in (1, a.nproc):
                res[n].append(_run(a.algo, a.iterations, n, a.seed, Path(tmp) / f"r{rep}n{n}"))
    keys = (*PHASES, "iteration")
    mean = {n: {k: statistics.mean(r[k] for r in runs) for k in (*keys, "tokens",
                                                                   "process_wall")}
            for n, runs in res.items()}
    print(f"ppokit llm train --algo {a.algo}, built-in task, {a.iterations} iterations, "
          f"{a.repeats} alternating runs each, one torch thread per process")
    print(f"{'seconds per iteration':26s} {'1 process':>10s} {f'{a.nproc} ranks':>10s} "
          f"{'ratio':>7s}")
    for k in keys:
        one, many = mean[1][k], mean[a.nproc][k]
        print(f"{k:26s} {one:10.3f} {many:10.3f} {one / max(many, 1e-12):7.2f}")
    print(f"{'response tokens / iteration':26s} {mean[1]['tokens']:10.0f} "
          f"{mean[a.nproc]['tokens']:10.0f}")
    print(f"{'process wall (s, incl. start)':26s} {mean[1]['process_wall']:10.1f} "
          f"{mean[a.nproc]['process_wall']:10.1f}")


if __name__ == "__main__":
    main()
