"""ppokit: policy-gradient reinforcement learning centred on PPO.

``ppokit.train``, ``ppokit.load`` and ``ppokit.Agent`` (:mod:`ppokit.api`), and
``ppokit.check_env`` (:mod:`ppokit.checks.environment`) are imported on first use, so
``import ppokit`` stays light (no torch, no Gymnasium).
"""

__version__ = "0.1.0"

__all__ = ["Agent", "check_env", "load", "train", "__version__"]


def __getattr__(name: str):
    if name in ("Agent", "load", "train"):
        from . import api

        return getattr(api, name)
    if name == "check_env":
        from .checks.environment import check_env

        return check_env
    raise AttributeError(f"module 'ppokit' has no attribute {name!r}")
