"""How many torch threads to use when the machine is shared.

torch's intra-op threads split each large operation between the cores and then wait for
all of them. When another process keeps a core busy, the thread on that core runs only
when the scheduler gives it a turn, and every operation waits for it: on this project's
2-core reference machine a pretrained model's training step at torch's default of two
threads took 1.5x as long as at one thread while another process held a core
(``python -m bench.load`` measures it). So where ppokit would use several threads, it
first looks at how busy the machine is and uses only the cores that are free.

:func:`busy_cores` reads the kernel's CPU time counters (``/proc/stat``) twice, a quarter
of a second apart: the non-idle time in between, in cores. Where the counters cannot be
read (not Linux), every core counts as free.
"""

from __future__ import annotations

import os
import time

__all__ = ["busy_cores", "usable_cores", "choose_threads"]


def _cpu_times() -> tuple[int, int] | None:
    """``(busy, total)`` jiffies of all CPUs since boot, or None."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    t = [int(x) for x in fields[1:]]
    idle = t[3] + (t[4] if len(t) > 4 else 0)  # idle + iowait
    total = sum(t[:8])  # user nice system idle iowait irq softirq steal (no guest: in user)
    return total - idle, total


def busy_cores(window: float = 0.25) -> float:
    """Cores' worth of CPU time the whole machine spent busy during ``window`` seconds
    (this process included, which is idle while it sleeps here); 0 where unknown."""
    a = _cpu_times()
    if a is None:
        return 0.0
    time.sleep(window)
    b = _cpu_times()
    if b is None or b[1] <= a[1]:
        return 0.0
    n = os.cpu_count() or 1
    return n * (b[0] - a[0]) / (b[1] - a[1])


def usable_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def choose_threads(want: int | None = None, window: float = 0.25) -> tuple[int, str]:
    """``(threads, why)``: ``want`` (default: the usable cores) less the cores other
    processes keep busy now (rounded: half a core's worth of busy time counts as a core),
    at least 1."""
    cores = usable_cores()
    want = cores if want is None else max(1, int(want))
    if want <= 1:
        return 1, "one thread"
    busy = busy_cores(window)
    total = os.cpu_count() or cores
    # the busy share of the machine, counted on this process's cores
    free = max(1, min(want, cores - int(busy * cores / total + 0.5)))
    if free >= want:
        return want, f"{want} threads"
    return free, (f"{free} thread{'s' if free > 1 else ''}: other processes keep "
                  f"{busy:.1f} of {total} cores busy")
