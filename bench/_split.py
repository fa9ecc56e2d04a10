"""The rollout/update split every benchmark worker reports, measured from inside each
library: ppokit's collector calls, and SB3's (and sb3-contrib's) rollout phases."""

from __future__ import annotations

import sys
import time


def train_ppokit(tr) -> tuple[float, float]:
    """``tr.train()`` for a ppokit ``Trainer``, timing its collector's ``collect`` calls:
    ``(training seconds, of which rollout seconds)``."""
    collect = tr.collector.collect
    spent = [0.0]

    def timed_collect(n):
        t = time.perf_counter()
        out = collect(n)
        spent[0] += time.perf_counter() - t
        return out

    tr.collector.collect = timed_collect
    t0 = time.perf_counter()
    tr.train()
    return time.perf_counter() - t0, spent[0]


def sb3_rollout_clock(on_step=None):
    """An SB3 callback adding the wall time of every rollout phase to ``.rollout``;
    ``on_step(locals)``, if given, sees each step's ``locals`` (infos, rewards...)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class RolloutClock(BaseCallback):
        def __init__(self):
            super().__init__()
            self.rollout = 0.0
            self._t = 0.0

        def _on_rollout_start(self):
            self._t = time.perf_counter()

        def _on_rollout_end(self):
            self.rollout += time.perf_counter() - self._t

        def _on_step(self):
            if on_step is not None:
                on_step(self.locals)
            return True

    return RolloutClock()


def have(module: str) -> bool:
    """Whether the comparison library ``module`` imports; says how to install it if not."""
    try:
        __import__(module)
    except ImportError:
        name = module.replace("_", "-")
        print(f"{name} is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return False
    return True
