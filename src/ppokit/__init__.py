"""ppokit: policy-gradient reinforcement learning centred on PPO.

``ppokit.train``, ``ppokit.load`` and ``ppokit.Agent`` (:mod:`ppokit.api`), ``ppokit.PPO``,
``ppokit.A2C``, ``ppokit.MaskablePPO`` and ``ppokit.evaluate_policy`` (Stable-Baselines3's
and sb3-contrib's calling conventions, :mod:`ppokit.sb3`), and
``ppokit.check_env`` (:mod:`ppokit.checks.environment`), and
``ppokit.register_policy_loss`` / ``ppokit.register_advantage_estimator``
(:mod:`ppokit.core.registry`) and ``ppokit.register_features_extractor``
(:mod:`ppokit.policies.encoders`) — a part of your own, then a configuration value — are
imported
on first use, so ``import ppokit`` stays light (no torch, no Gymnasium).
"""

__version__ = "0.1.0"

__all__ = ["A2C", "Agent", "MaskablePPO", "PPO", "check_env", "evaluate_policy", "load",
           "register_advantage_estimator", "register_features_extractor",
           "register_policy_loss", "train", "__version__"]


def __dir__() -> list[str]:
    """The lazy attributes too, so that ``dir(ppokit)`` and tab completion show them."""
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str):
    if name in ("Agent", "load", "train"):
        from . import api

        return getattr(api, name)
    if name in ("PPO", "A2C", "MaskablePPO", "evaluate_policy"):
        from . import sb3

        return getattr(sb3, name)
    if name in ("register_policy_loss", "register_advantage_estimator"):
        from .core import registry

        return getattr(registry, name)
    if name == "register_features_extractor":
        from .policies.encoders import register_features_extractor

        return register_features_extractor
    if name == "check_env":
        from .checks.environment import check_env

        return check_env
    raise AttributeError(f"module 'ppokit' has no attribute {name!r}")
