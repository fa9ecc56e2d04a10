"""A CartPole whose every step also costs a set amount of real CPU work — a stand-in for a
slow simulator, for measuring how rollouts scale (``bench/ray_scaling.py``) and for tests
that need a rollout to take a while.

Importing this module registers ``SlowCartPole-v0``; name it as
``ppokit.envs.slow:SlowCartPole-v0`` (``--env``, ``ppokit.train``), which imports it. The
keyword ``work_ms`` (default 1.0) sets the CPU time a step burns: a busy loop of NumPy
work, calibrated once per process, not a sleep, so two steps on one core really compete.
``work_units`` instead fixes the number of work units per step (:func:`units_per_ms` of one
process's calibration times the milliseconds), so that environments in different processes
— local, subprocesses, Ray actors — do exactly the same work, whatever their own
calibration would have said.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

__all__ = ["SlowCartPole", "burn", "burn_units", "units_per_ms", "ENV_ID"]

ENV_ID = "ppokit.envs.slow:SlowCartPole-v0"
_UNITS_PER_MS: float | None = None
_BUF = np.linspace(0.0, 1.0, 256)


def _unit() -> float:
    return float(np.sin(_BUF).sum())


def _calibrate() -> float:
    """Work units per millisecond of this process's CPU time (the fastest of a few
    tries, so a loaded machine makes steps longer, never shorter)."""
    best = 0.0
    for _ in range(5):
        n = 200
        t0 = time.process_time()
        for _ in range(n):
            _unit()
        dt = time.process_time() - t0
        if dt > 0:
            best = max(best, n / (dt * 1e3))
    return best or 100.0


def units_per_ms() -> float:
    """This process's calibration: work units per millisecond of CPU time."""
    global _UNITS_PER_MS
    if _UNITS_PER_MS is None:
        _UNITS_PER_MS = _calibrate()
    return _UNITS_PER_MS


def burn(ms: float) -> None:
    """Spend about ``ms`` milliseconds of CPU time (calibrated on first use)."""
    if ms > 0:
        burn_units(max(1, round(ms * units_per_ms())))


def burn_units(n: int) -> None:
    """Do ``n`` units of the work exactly (the same work in every process)."""
    for _ in range(n):
        _unit()


class SlowCartPole(CartPoleEnv):
    """CartPole-v1 (500-step limit) whose ``step`` also burns ``work_ms`` of CPU."""

    def __init__(self, work_ms: float = 1.0, work_units: int | None = None,
                 render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        if not isinstance(work_ms, (int, float)) or isinstance(work_ms, bool) \
                or not 0 <= work_ms <= 1000:
            raise ValueError(f"work_ms: expected a number of milliseconds in [0, 1000], "
                             f"got {work_ms!r}")
        if work_units is not None and (not isinstance(work_units, int)
                                       or isinstance(work_units, bool)
                                       or not 0 <= work_units <= 10**7):
            raise ValueError(f"work_units: expected an integer in [0, 10000000] or none, "
                             f"got {work_units!r}")
        self.work_ms = float(work_ms)
        self.work_units = work_units

    def step(self, action):
        if self.work_units is not None:
            burn_units(self.work_units)
        else:
            burn(self.work_ms)
        return super().step(action)


if "SlowCartPole-v0" not in gym.registry:
    gym.register("SlowCartPole-v0", entry_point=SlowCartPole, max_episode_steps=500,
                 reward_threshold=475.0)
