"""token_gae against the plain position loop, side by side, at one torch thread and at the
machine's default thread count.

    python -m bench.token_gae [--batch 64] [--length 4096] [--repeats 9]
                              [--gamma 0.99] [--lam 0.95] [--masks rlhf,random]

For each mask pattern and each thread count, prints the median and min–max wall time of
both (steady state: consecutive calls, in two alternating rounds), the speed ratio of the
medians, and the max absolute difference (float32, and the float64 result for scale). The
first call after unrelated work is slower than these (memory cold). Mask patterns:
``rlhf`` (left-padded prompts, responses of random length, a masked tool span in half the
rows) and ``random`` (each position an action with probability 0.9).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ppokit.core import token_gae, token_gae_reference


def _inputs(pattern: str, b: int, n: int):
    g = torch.Generator().manual_seed(0)
    if pattern == "random":
        mask = torch.rand(b, n, generator=g) < 0.9
        rewards = torch.randn(b, n, generator=g) * 0.1
    else:  # RLHF-like: a score on the last action token, small per-token KL rewards
        prompt = n // 8
        lengths = torch.randint(n // 4, n - prompt + 1, (b,), generator=g)
        pos = torch.arange(n)[None, :]
        mask = (pos >= prompt) & (pos < prompt + lengths[:, None])
        tool = (pos >= prompt + 50) & (pos < prompt + 150) & (torch.arange(b)[:, None] % 2 == 0)
        mask &= ~tool
        rewards = -0.01 * torch.rand(b, n, generator=g)
        last = (prompt + lengths - 1)[:, None]
        rewards = rewards.scatter_add(1, last, torch.rand(b, 1, generator=g))
    values = torch.randn(b, n, generator=g) * 0.5
    return rewards, values, mask


def _time_pair(fast, loop, repeats: int, rounds: int = 2):
    """Steady-state timings: in each of ``rounds`` rounds, a warm-up call and ``repeats``
    consecutive calls of ``fast``, then (at least two) consecutive calls of ``loop``. The
    rounds alternate, so a burst of load from another process is unlikely to hit one side
    only."""
    tf, tl = [], []
    for _ in range(rounds):
        fast()
        for _ in range(repeats):
            t0 = time.perf_counter()
            fast()
            tf.append(time.perf_counter() - t0)
        for _ in range(max(2, repeats // 4)):
            t0 = time.perf_counter()
            loop()
            tl.append(time.perf_counter() - t0)
    return tf, tl


def measure(pattern: str, threads: int, *, batch: int = 64, length: int = 4096,
            gamma: float = 0.99, lam: float = 0.95, repeats: int = 9) -> dict:
    """One side-by-side measurement at ``threads`` torch threads (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        r, v, m = _inputs(pattern, batch, length)
        tf, tl = _time_pair(lambda: token_gae(r, v, m, gamma, lam),
                            lambda: token_gae_reference(r, v, m, gamma, lam), repeats)
    finally:
        torch.set_num_threads(before)
    adv, _ = token_gae(r, v, m, gamma, lam)
    ref, _ = token_gae_reference(r, v, m, gamma, lam)
    exact, _ = token_gae_reference(r.double(), v.double(), m, gamma, lam)
    return {"pattern": pattern, "threads": threads, "actions": int(m.sum()),
            "fast": tf, "loop": tl, "ratio": statistics.median(tl) / statistics.median(tf),
            "err_loop": float((adv - ref).abs().max()),
            "err_fast64": float((adv.double() - exact).abs().max()),
            "err_loop64": float((ref.double() - exact).abs().max())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--lam", type=float, default=0.95)
    p.add_argument("--masks", default="rlhf,random",
                   help="comma-separated mask patterns: rlhf, random")
    a = p.parse_args(argv)
    default = torch.get_num_threads()
    counts = [1] if default == 1 else [1, default]
    fmt = lambda ts: (f"median {statistics.median(ts) * 1e3:8.2f} ms  "  # noqa: E731
                      f"(min {min(ts) * 1e3:.2f}, max {max(ts) * 1e3:.2f})")
    print(f"token_gae benchmark: B={a.batch} L={a.length} gamma={a.gamma} lam={a.lam} float32; "
          f"torch threads: 1 and the default {default}")
    ratios = []
    for pattern in a.masks.split(","):
        for threads in counts:
            res = measure(pattern.strip(), threads, batch=a.batch, length=a.length,
                          gamma=a.gamma, lam=a.lam, repeats=a.repeats)
            ratios.append(res["ratio"])
            print(f"{res['pattern']} masks, {threads} thread{'s' if threads > 1 else ''} "
                  f"({res['actions']} actions)")
            print(f"  token_gae                 {fmt(res['fast'])}")
            print(f"  position loop (reference) {fmt(res['loop'])}")
            print(f"  speed-up                  {res['ratio']:8.1f}x")
            print(f"  max |fast - loop|         {res['err_loop']:.2e}  (float32)")
            print(f"  max |fast - float64|      {res['err_fast64']:.2e}")
            print(f"  max |loop - float64|      {res['err_loop64']:.2e}")
    print(f"lowest speed-up: {min(ratios):.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
