"""The environment GAE (``ppokit.core.gae``: a chunked scan in NumPy) against the plain loop
over time steps (``gae_reference``), side by side in one run, at one torch thread; and
against rlox's Rust GAE (``rlox.compute_gae_batched_f32``) when rlox is installed, on the
problem rlox expresses (one done flag a step, bootstrapping from the next step's value).

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
    """rlox's Rust GAE over a batch of environments, float32 where it has it:
    ``(name, function, dtype)``, or None without rlox."""
    try:
        import rlox
    except ImportError:
        return None
    for name, dtype in (("compute_gae_batched_f32", np.float32),
                        ("compute_gae_batched", np.float64)):
        fn = getattr(rlox, name, None)
        if fn is not None:
            return name, fn, dtype
    return None


def _measure_rlox(r, v, end, repeats: int, rlox) -> None:
    """ppokit's ``gae`` against rlox's on the problem rlox can express, and both against
    ``gae_reference``. rlox takes one done flag a step (it stops the bootstrap and the carry)
    and bootstraps from the next step's value (``last_values`` after the last step), in an
    env-major flat layout ``[N * T]``: so ``terminated = episode_end = done`` and
    ``next_values`` = the values shifted by one step for ppokit."""
    name, fn, dtype = rlox
    t, n = r.shape
    last = torch.randn(n, generator=torch.Generator().manual_seed(1))
    nv = torch.cat([v[1:], last[None]])
    done = end

    def flat(x: torch.Tensor) -> np.ndarray:  # [T, N] -> rlox's [N * T], its dtype
        return np.ascontiguousarray(x.numpy().T, dtype=dtype).ravel()

    rf, vf, df = flat(r), flat(v), flat(done.float())
    lastf = last.numpy().astype(dtype)

    def with_layout():  # from ppokit's [T, N] float32 tensors to advantages [T, N] and back
        adv, _ = fn(flat(r), flat(v), flat(done.float()), lastf, t, 0.99, 0.95)
        return torch.from_numpy(np.ascontiguousarray(adv.reshape(n, t).T, dtype=np.float32))

    runs: dict[str, list[float]] = {"gae": [], "rlox": [], "rlox+layout": []}
    for _ in range(3):  # alternating rounds
        runs["gae"] += _time(lambda: gae(r, v, nv, done, done, 0.99, 0.95), repeats)
        runs["rlox"] += _time(lambda: fn(rf, vf, df, lastf, t, 0.99, 0.95), repeats)
        runs["rlox+layout"] += _time(with_layout, repeats)
    ref = gae_reference(r, v, nv, done, done, 0.99, 0.95)[0]
    d_gae = float((gae(r, v, nv, done, done, 0.99, 0.95)[0] - ref).abs().max())
    d_rlox = float((with_layout() - ref).abs().max())
    med = {k: statistics.median(x) for k, x in runs.items()}
    print(f"  against rlox {_rlox_version()} (rlox.{name}; one done flag a step, the next "
          "step's value as bootstrap: ppokit's gae given terminated = episode_end and the "
          "values shifted)")
    for k, label in (("gae", "ppokit gae"), ("rlox", f"rlox {name}"),
                     ("rlox+layout", "rlox + layout")):
        x = runs[k]
        print(f"    {label:34s} {med[k]:9.3f}  ({min(x):.3f}–{max(x):.3f})")
    print(f"    time ppokit gae / rlox = {med['gae'] / med['rlox']:.2f} (rlox on its own "
          f"env-major layout, prepared beforehand; {med['gae'] / med['rlox+layout']:.2f} "
          "counting rlox's transposes from and to [T, N])")
    print(f"    max |difference| from ppokit's gae_reference: ppokit gae {d_gae:.2e}, "
          f"rlox {d_rlox:.2e}")


def _rlox_version() -> str:
    from importlib.metadata import version

    return version("rlox")


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
        _measure_rlox(r, v, end, repeats, rlox)


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
