"""The fused minibatch step's backends side by side: the native step (C, Adam included)
against the TorchScript kernel (+ ppokit's Adam), one minibatch step at a time, one torch
thread, interleaved rounds in one process.

    python -m bench.native_step [--shapes 64x256,64x64,128x64,256x64] [--rounds 7]

Each shape is ``hidden width × minibatch rows`` of a two-layer MLP actor-critic: the
categorical CartPole policy (4 observations, 2 actions) and a Gaussian one (17
observations, 6 actions, as HalfCheetah). Prints the median µs per step of each backend and
their ratio; ``ppokit.engine.native.NATIVE_MAX_WIDTH`` is chosen from it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ppokit.algos.optim import Adam
from ppokit.engine.flat import FlatParameters
from ppokit.engine.fused import FusedStep
from ppokit.engine.native import available, why_not
from ppokit.engine.update import UpdateSpec
from ppokit.policies.mlp import MLPActorCritic


def _step(kind: str, hidden: int, rows: int, backend: str):
    obs, act = (4, 2) if kind == "categorical" else (17, 6)
    torch.manual_seed(0)
    pol = MLPActorCritic(obs, kind, act, hidden=(hidden, hidden))
    flat = FlatParameters(pol.parameters())
    opt = Adam(list(pol.parameters()), lr=1e-4, flat=flat)
    step = FusedStep(UpdateSpec(minibatch_size=rows), pol, flat, opt, backend=backend,
                     parallel=False)
    g = torch.Generator().manual_seed(0)
    mb = {"obs": torch.randn(rows, obs, generator=g),
          "actions": (torch.randint(0, act, (rows,), generator=g) if kind == "categorical"
                      else torch.randn(rows, act, generator=g)),
          "logp": torch.full((rows,), -0.7), "advantages": torch.randn(rows, generator=g),
          "returns": torch.randn(rows, generator=g), "values": torch.randn(rows, generator=g)}
    return lambda: step.step(mb, 0.2)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="64x256,64x64,128x64,256x64")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args(argv)
    if not available():
        raise SystemExit(f"bench.native_step: {why_not()}")
    torch.set_num_threads(1)
    print("| policy | hidden × rows | native µs | TorchScript µs | TorchScript ÷ native |")
    print("|---|---|---:|---:|---:|")
    for kind in ("categorical", "gaussian"):
        for shape in a.shapes.split(","):
            hidden, rows = (int(x) for x in shape.split("x"))
            fns = {b: _step(kind, hidden, rows, b) for b in ("native", "script")}
            times: dict[str, list[float]] = {b: [] for b in fns}
            for fn in fns.values():
                for _ in range(20):  # warm-up (TorchScript optimises over its first runs)
                    fn()
            for _ in range(a.rounds):
                for b, fn in fns.items():
                    t = time.perf_counter()
                    for _ in range(a.calls):
                        fn()
                    times[b].append((time.perf_counter() - t) / a.calls * 1e6)
            med = {b: statistics.median(x) for b, x in times.items()}
            print(f"| {kind} | {hidden} × {rows} | {med['native']:.0f} | {med['script']:.0f} "
                  f"| {med['script'] / med['native']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
