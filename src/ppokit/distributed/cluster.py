"""Connecting to Ray: a local Ray started on this machine by default, an existing cluster
when ``RAY_ADDRESS`` names one (``ray start --head`` prints the address)."""

from __future__ import annotations

import os
from collections.abc import Callable

from ppokit.errors import UsageError

__all__ = ["ensure_ray", "import_ray"]


def import_ray(where: str = "vectorization=ray"):
    try:
        import ray
    except ImportError:
        raise UsageError(f"{where}: needs Ray, which is not installed (pip install "
                         "'ppokit[ray]')") from None
    return ray


def ensure_ray(log: Callable[[str], None] | None = None, where: str = "vectorization=ray"):
    """The ``ray`` module, connected: left as it is when this process already called
    ``ray.init``; otherwise ``ray.init()`` — to the cluster at ``RAY_ADDRESS`` when that is
    set, else a new local Ray of this machine's cores (no dashboard)."""
    ray = import_ray(where)
    if ray.is_initialized():
        return ray
    address = os.environ.get("RAY_ADDRESS") or None
    try:
        if address:
            ray.init(address=address, log_to_driver=True)
        else:
            ray.init(include_dashboard=False, log_to_driver=True)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"{where}: cannot start or reach Ray"
                         f"{' at RAY_ADDRESS=' + address if address else ''} ({msg})") from None
    if log is not None:
        res = ray.cluster_resources()
        log(f"Ray: {'cluster at ' + address if address else 'local'}, "
            f"{res.get('CPU', 0):g} CPUs")
    return ray
