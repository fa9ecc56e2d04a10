"""ppokit against an earlier version of itself, side by side: the same command run from a
checkout of ``--base`` (a git revision, checked out into a temporary worktree) and from
this working tree, alternately, each run in a fresh process with one torch thread, so a
change of the machine's speed hits both alike.

    python -m bench.before_after --base ea3bcfe --rounds 3

Cases: ``cartpole`` (``bench._ppokit_worker``: PPO on CartPole-v1 with the RL-zoo
settings, 100k steps, training seconds timed inside the process) and ``llm10m``
(``ppokit llm bench --model-size 10m --rounds 1 --iterations 3``, without TRL: tokens per
second of GRPO on the 10M-parameter model). The C extension is built in both trees first
(``setup.py build_ext --inplace``), so both run their kernels. Prints each round and the
medians, and the ratio after / before (above 1: the working tree is faster)."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env(tree: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{tree / 'src'}{os.pathsep}{tree}",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    env.pop("PPOKIT_LOG_EVERY", None)
    return env


def build_kernels(tree: Path) -> str:
    """Build the C extension in ``tree`` (a fresh checkout has none: without it ppokit runs
    its torch paths, which would compare the kernels' absence, not the change) and say
    whether ppokit there finds it."""
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree,
                   env=_env(tree), check=True, capture_output=True)
    out = subprocess.run([sys.executable, "-c", "import ppokit.kernels as k; "
                          "print(k.available())"], cwd=tree, env=_env(tree),
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def cartpole(tree: Path, seed: int) -> float:
    """Training seconds of one CartPole run (lower is better)."""
    out = subprocess.run([sys.executable, "-m", "bench._ppokit_worker", "--env", "CartPole-v1",
                          "--seed", str(seed), "--eval-episodes", "1"], cwd=tree,
                         env=_env(tree), capture_output=True, text=True, check=True)
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    return float(rec["train_s"])


def llm10m(tree: Path, seed: int) -> float:
    """Tokens per second of ppokit's GRPO iterations on the 10M model (higher is better)."""
    code = ("import sys; from ppokit.cli import main; sys.exit(main(['llm', 'bench', "
            "'--model-size', '10m', '--rounds', '1', '--iterations', '3']))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=_env(tree),
                         capture_output=True, text=True, check=True)
    m = re.search(r"total\s+([\d.]+) tokens/s", out.stdout)
    if m is None:
        raise RuntimeError(f"no total tokens/s in the bench's output:\n{out.stdout[-2000:]}")
    return float(m.group(1))


CASES = {"cartpole": (cartpole, "train s", False), "llm10m": (llm10m, "tokens/s", True)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the git revision to compare with")
    p.add_argument("--cases", default="cartpole,llm10m")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    cases = a.cases.split(",")
    with tempfile.TemporaryDirectory(prefix="ppokit-base-") as tmp:
        base = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), a.base],
                       cwd=ROOT, check=True)
        try:
            for name, tree in (("before", base), ("after", ROOT)):
                print(f"{name}: kernels available: {build_kernels(tree)}", flush=True)
            for case in cases:
                fn, unit, higher = CASES[case]
                got = {"before": [], "after": []}
                for r in range(a.rounds):
                    order = [("before", base), ("after", ROOT)]
                    for name, tree in (order if r % 2 == 0 else order[::-1]):
                        got[name].append(fn(tree, r))
                    print(f"{case} round {r}: before {got['before'][-1]:.2f}, "
                          f"after {got['after'][-1]:.2f} {unit}", flush=True)
                b, n = statistics.median(got["before"]), statistics.median(got["after"])
                ratio = n / b if higher else b / n
                # each round's two runs are adjacent: their ratio is the least touched by
                # a change of the machine's load between rounds
                pairs = [(y / x if higher else x / y)
                         for x, y in zip(got["before"], got["after"])]
                print(f"{case}: median before {b:.2f}, after {n:.2f} {unit}; "
                      f"after is {ratio:.3f}x as fast (median of the rounds' own ratios "
                      f"{statistics.median(pairs):.3f}x, {min(pairs):.3f}-{max(pairs):.3f})",
                      flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT,
                           check=False)


if __name__ == "__main__":
    main()
