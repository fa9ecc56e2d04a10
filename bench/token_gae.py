"""token_gae against the plain position loop, side by side in one run.

    python -m bench.token_gae [--batch 64] [--length 4096] [--repeats 7]

Prints the median and min–max wall time of each, the speed ratio, and the max absolute
difference (float32, and the float64 result for scale).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ppokit.core import token_gae, token_gae_reference


def _time(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--lam", type=float, default=0.95)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads for both sides (default 1: steady timings on a shared box)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    b, n = a.batch, a.length
    # An RLHF-like layout: left-padded prompts, responses of random length, a score on the
    # last action token and small per-token KL rewards, plus a masked tool span in half the
    # rows (non-contiguous masks).
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

    fast = _time(lambda: token_gae(rewards, values, mask, a.gamma, a.lam), a.repeats)
    loop = _time(lambda: token_gae_reference(rewards, values, mask, a.gamma, a.lam),
                 max(3, a.repeats // 2))
    adv, _ = token_gae(rewards, values, mask, a.gamma, a.lam)
    ref, _ = token_gae_reference(rewards, values, mask, a.gamma, a.lam)
    exact, _ = token_gae_reference(rewards.double(), values.double(), mask, a.gamma, a.lam)
    fmt = lambda ts: (f"median {statistics.median(ts) * 1e3:8.2f} ms  "  # noqa: E731
                      f"(min {min(ts) * 1e3:.2f}, max {max(ts) * 1e3:.2f})")
    print(f"token_gae benchmark: B={b} L={n} gamma={a.gamma} lam={a.lam} float32 "
          f"threads={torch.get_num_threads()} actions={int(mask.sum())}")
    print(f"  token_gae (chunked scan)  {fmt(fast)}")
    print(f"  position loop (reference) {fmt(loop)}")
    print(f"  speed-up                  {statistics.median(loop) / statistics.median(fast):8.1f}x")
    print(f"  max |fast - loop|         {float((adv - ref).abs().max()):.2e}  (float32)")
    print(f"  max |fast - float64|      {float((adv.double() - exact).abs().max()):.2e}")
    print(f"  max |loop - float64|      {float((ref.double() - exact).abs().max()):.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
