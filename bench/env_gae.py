"""The environment GAE (``ppokit.core.gae``: a chunked scan in NumPy) against the plain loop
over time steps (``gae_reference``), side by side in one run, at one torch thread; and
against rlox's Rust GAE when rlox is installed.

    python -m bench.env_gae [--repeats 15] [--sizes 8x2048,64x4096]

Each size is ``N`` environments × ``T`` steps, float32, episodes ending (by termination or
truncation) with probability 0.01 a step. Prints the median (and min–max) wall time of each
over alternating rounds, the ratio of the medians, the time of the input checks ``gae``
runs at its boundary, and the largest difference from the loop.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from ppokit.core.advantage import _reverse_scan_time, gae, gae_reference


def _inputs(n: int, t: int):
    g = torch.Generator().manual_seed(0)
    shape = (t, n)
    r, v, nv = (torch.randn(shape, generator=g) for _ in range(3))
    end = torch.rand(shape, generator=g) < 0.01
    term = end & (torch.rand(shape, generator=g) < 0.5)
    return r, v, nv, term, end


def _time(fn, repeats: int) -> list[float]:
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _rlox():
    try:
        import rlox  # noqa: F401
    except ImportError:
        return None
    for name in ("compute_gae_batched", "compute_gae"):
        fn = getattr(__import__("rlox"), name, None)
        if fn is not None:
            return name, fn
    return None


def _measure(n: int, t: int, repeats: int, rlox) -> None:
    """Time ``gae``, the loop and the scan alone on ``n`` × ``t`` and print them."""
    r, v, nv, term, end = _inputs(n, t)
    d = r + 0.99 * (~term).float() * nv - v
    c = 0.99 * 0.95 * (~end).float()
    runs: dict[str, list[float]] = {"gae": [], "loop": [], "scan alone": []}
    for _ in range(3):  # alternating rounds
        runs["gae"] += _time(lambda: gae(r, v, nv, term, end, 0.99, 0.95), repeats)
        runs["loop"] += _time(lambda: gae_reference(r, v, nv, term, end, 0.99, 0.95),
                              max(3, repeats // 3))
        runs["scan alone"] += _time(lambda: _reverse_scan_time(d, c), repeats)
    diff = float((gae(r, v, nv, term, end, 0.99, 0.95)[0]
                  - gae_reference(r, v, nv, term, end, 0.99, 0.95)[0]).abs().max())
    med = {k: statistics.median(x) for k, x in runs.items()}
    print(f"\n{n} envs x {t} steps: max |difference| from the loop {diff:.2e}")
    for k, x in runs.items():
        print(f"  {k:12s} {med[k]:9.3f}  ({min(x):.3f}–{max(x):.3f})")
    print(f"  gae is {med['loop'] / med['gae']:.1f}x the loop (the scan alone: "
          f"{med['loop'] / med['scan alone']:.1f}x; the rest is the input checks)")
    if rlox is not None:
        name, fn = rlox
        rn, vn = r.numpy().T.copy(), v.numpy().T.copy()
        dn = end.numpy().T.astype(np.float32).copy()
        try:
            xs = _time(lambda: fn(rn, vn, dn, 0.99, 0.95), repeats)
            print(f"  rlox.{name:10s} {statistics.median(xs):9.3f}  (its own layout; "
                  f"gae is {statistics.median(xs) / med['gae']:.2f}x its speed)")
        except Exception as exc:  # noqa: BLE001 - its signature differs by version
            print(f"  rlox.{name}: not comparable here ({type(exc).__name__}: {exc})")



def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--sizes", default="8x2048,64x4096")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rlox = _rlox()
    print(f"environment GAE, float32, one torch thread ({args.repeats} timed calls each, "
          "alternating); ms: median (min–max)")
    for size in args.sizes.split(","):
        n, t = (int(x) for x in size.lower().split("x"))
        _measure(n, t, args.repeats, rlox)

if __name__ == "__main__":
    main()
