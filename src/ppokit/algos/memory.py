"""What a configuration's run needs in memory, checked before any allocation: a lower
bound by part (parameters with optimiser state, the rollout, a minibatch's activations)
against what the machine has available, the error naming the key responsible."""

from __future__ import annotations

import os
from typing import Any

from ppokit.settings import brief, fail

__all__ = ["available_memory", "estimate_memory", "check_memory"]


def available_memory() -> int | None:
    """Bytes a new allocation can expect: ``MemAvailable`` (Linux), else the physical
    memory; the cgroup limit when that is smaller. ``None`` when neither can be read."""
    avail = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
    try:
        with open("/sys/fs/cgroup/memory.max") as fh:
            text = fh.read().strip()
        if text.isdigit():
            avail = min(avail, int(text))
    except OSError:
        pass
    return avail


def estimate_memory(c: Any, obs_size: int = 1, act_size: int = 1) -> dict[str, int]:
    """A lower bound of the bytes a run of ``c`` allocates, by part: ``parameters`` (actor
    and critic MLPs in float32 with gradients and Adam's two moments), ``rollout`` (one
    float32 observation, action and six per-step scalars per step) and ``minibatch`` (the
    hidden activations and their gradients of one minibatch). ``obs_size`` and
    ``act_size`` are the flat observation and action sizes (1 when not yet known)."""
    def mlp(sizes):
        return sum(a * b + b for a, b in zip(sizes, sizes[1:]))

    hidden = list(c.net_arch)
    n_params = mlp([obs_size, *hidden, act_size]) + mlp([obs_size, *hidden, 1])
    if c.recurrent == "lstm":  # the LSTMs' weights; their activations in the minibatch
        H, n_lstm = c.lstm_hidden_size, 1 + c.enable_critic_lstm
        n_params += n_lstm * 4 * H * (obs_size + H + 2 + (c.n_lstm_layers - 1) * (2 * H + 2))
        hidden = hidden + [6 * H * c.n_lstm_layers * n_lstm]
    return {"parameters": 4 * 4 * n_params,
            "rollout": 4 * c.rollout_size * (obs_size + act_size + 6),
            "minibatch": 4 * 2 * 2 * c.minibatch_size * sum(hidden)}


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def check_memory(c: Any, obs_size: int = 1, act_size: int = 1,
                 available: int | None = None) -> None:
    """Refuse a config whose :func:`estimate_memory` exceeds the available memory, naming
    the key responsible for the largest part. The trainer can call it again with the real
    observation and action sizes once the environment is built."""
    parts = estimate_memory(c, obs_size, act_size)
    total = sum(parts.values())
    avail = available_memory() if available is None else available
    if avail is None or total <= avail:
        return
    big = max(parts, key=parts.__getitem__)
    tail = f"; {_gib(total)} in all is more than the {_gib(avail)} of memory available"
    if big == "parameters":
        n = parts["parameters"] // 16
        fail("net_arch", f"{brief(list(c.net_arch))} makes about {n:,} parameters, "
              f"{_gib(parts['parameters'])} with gradients and optimiser state" + tail,
              show=False)
    name = "n_envs" if c.n_envs >= c.n_steps else "n_steps"
    if big == "minibatch" and c.batch_size:
        fail("batch_size", f"a minibatch of {c.batch_size:,} samples through hidden layers "
              f"{brief(list(c.net_arch))} needs at least {_gib(parts['minibatch'])}" + tail,
              show=False)
    fail(name, f"a rollout of n_steps * n_envs = {c.n_steps} * {c.n_envs} = "
          f"{c.rollout_size:,} steps needs at least {_gib(parts['rollout'])}" + tail,
          show=False)
