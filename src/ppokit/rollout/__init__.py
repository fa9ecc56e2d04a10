"""Rollouts: the ``[T, N]`` container and the vector-env collector (and their recurrent
versions, which carry the policy's state)."""

from .buffer import ADVANTAGE_ESTIMATORS, Rollout
from .collector import Collector
from .recurrent import RecurrentCollector, RecurrentRollout, recurrent_forward

__all__ = ["ADVANTAGE_ESTIMATORS", "Collector", "RecurrentCollector", "RecurrentRollout",
           "Rollout", "recurrent_forward"]
