"""Rollouts: the ``[T, N]`` container and the vector-env collector."""

from .buffer import ADVANTAGE_ESTIMATORS, Rollout
from .collector import Collector

__all__ = ["ADVANTAGE_ESTIMATORS", "Collector", "Rollout"]
