"""Policies: torch modules implementing the :class:`Policy` interface (see ``base``)."""

from .base import Policy
from .mlp import ACTIVATIONS, MLPActorCritic, NumpySampler, make_policy

__all__ = ["ACTIVATIONS", "MLPActorCritic", "NumpySampler", "Policy", "make_policy"]
