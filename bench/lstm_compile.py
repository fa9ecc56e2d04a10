"""The recurrent update's LSTM three ways, on the minibatch shapes of ppokit's LSTM presets:
torch's ``nn.LSTM`` (what runs with the kernels off), ppokit's C kernel
(:mod:`ppokit.kernels.lstm`, the default where it is built) and ``torch.compile`` of the
same recurrence written step by step in torch (inductor's CPU code for the gates).

    python -m bench.lstm_compile --rounds 7

One process, one torch thread; each timed call is the forward over every step and the
backward of a fixed random projection of the outputs (what the update does per minibatch,
twice: the actor's LSTM and the critic's). The three run in turn within each round, so a
change of the machine's speed hits them alike; the compiled function is compiled (and
warmed) before the first round and its compilation time printed apart. Each variant's
outputs and gradients are checked against ``nn.LSTM``'s first.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

# (sequences, steps, features, hidden): CartPoleNoVel-v1's preset (8 envs x 32 steps, one
# minibatch of 8 sequences), and PendulumNoVel-v1's (minibatches of 256 samples cut from
# 4 envs x 1024 steps: sequences of up to 64 steps here)
SHAPES = {"cartpole-novel": (8, 32, 2, 64), "pendulum-novel": (4, 64, 2, 64)}


def loop_lstm(x, h, c, w_ih, w_hh, b):
    """torch's LSTM recurrence, one step at a time (gates i, f, g, o)."""
    xs = x @ w_ih.t() + b
    outs = []
    for t in range(x.shape[1]):
        gates = xs[:, t] + h @ w_hh.t()
        i, f, g, o = gates.chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs.append(h)
    return torch.stack(outs, 1)


def variants(module: nn.LSTM):
    from ppokit.kernels import lstm as native

    compiled = torch.compile(loop_lstm, dynamic=False)

    def run_torch(x, h0, c0):
        return module(x, (h0.unsqueeze(0), c0.unsqueeze(0)))[0]

    def run_c(x, h0, c0):
        return native.lstm(module, x, h0, c0)

    def run_compiled(x, h0, c0):
        return compiled(x, h0, c0, module.weight_ih_l0, module.weight_hh_l0,
                        module.bias_ih_l0 + module.bias_hh_l0)
    return {"nn.LSTM": run_torch, "C kernel": run_c, "torch.compile": run_compiled}


def fwd_bwd(fn, module, x, h0, c0, proj):
    module.zero_grad(set_to_none=True)
    y = fn(x, h0, c0)
    (y * proj).sum().backward()
    return y.detach(), [p.grad.clone() for p in module.parameters()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=50, help="timed calls per variant per round")
    a = ap.parse_args()
    torch.set_num_threads(1)
    from ppokit.kernels import lstm as native

    for name, (S, L, F, H) in SHAPES.items():
        torch.manual_seed(0)
        module = nn.LSTM(F, H, batch_first=True)
        x, h0, c0 = torch.randn(S, L, F), torch.randn(S, H), torch.randn(S, H)
        proj = torch.randn(S, L, H)
        if not native.supports(module, x, h0):
            print(f"{name}: the C kernel is not available here ({native.__name__})")
            return
        fns = variants(module)
        t0 = time.perf_counter()
        ref = fwd_bwd(fns["nn.LSTM"], module, x, h0, c0, proj)
        for v, fn in fns.items():
            t = time.perf_counter()
            y, grads = fwd_bwd(fn, module, x, h0, c0, proj)
            if v == "torch.compile":
                print(f"{name}: torch.compile's first call (compiling) "
                      f"{time.perf_counter() - t:.1f} s")
            torch.testing.assert_close(y, ref[0], rtol=1e-4, atol=1e-5)
            for g, r in zip(grads, ref[1]):
                torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-4)
        times: dict[str, list[float]] = {v: [] for v in fns}
        for _ in range(a.rounds):
            for v, fn in fns.items():
                t = time.perf_counter()
                for _ in range(a.calls):
                    fwd_bwd(fn, module, x, h0, c0, proj)
                times[v].append((time.perf_counter() - t) / a.calls * 1e3)
        base = statistics.median(times["C kernel"])
        print(f"\n{name}: {S} sequences x {L} steps, {F} features, hidden {H}; "
              f"ms per forward+backward, median of {a.rounds} rounds of {a.calls} "
              f"(checked against nn.LSTM; {time.perf_counter() - t0:.0f} s in all)")
        for v, ts in times.items():
            m = statistics.median(ts)
            print(f"  {v:14s} {m:8.3f} ms  ({min(ts):.3f}-{max(ts):.3f})  "
                  f"{m / base:5.2f}x the C kernel")


if __name__ == "__main__":
    main()
