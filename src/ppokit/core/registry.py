"""Named registries of interchangeable parts that share one signature (design.md "one idea").

An unknown name raises a ``ValueError`` listing the known names; registering a name twice
is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from . import advantage as _gae
from . import group as _group
from . import losses as _losses

F = TypeVar("F", bound=Callable)

__all__ = ["Registry", "POLICY_LOSSES", "GROUP_ADVANTAGES", "ENV_ADVANTAGES"]


class Registry(Generic[F]):
    """A name → function map for functions of one documented signature (its ``signature``
    string gives the argument names and shapes, e.g. ``[T, N]`` or ``[B, L]`` tensors)."""

    def __init__(self, kind: str, signature: str):
        self.kind = kind
        self.signature = signature
        self._items: dict[str, F] = {}

    def register(self, name: str, fn: F | None = None):
        def deco(f: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.kind}: {name!r} is already registered")
            self._items[name] = f
            return f

        return deco(fn) if fn is not None else deco

    def get(self, name: str) -> F:
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; known: "
                             f"{', '.join(sorted(self._items))}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items


POLICY_LOSSES: Registry = Registry(
    "policy loss", "(logp, logp_old, advantages, mask=None, **options) -> PolicyLoss")
POLICY_LOSSES.register("ppo-clip", _losses.clipped_surrogate_loss)
POLICY_LOSSES.register("vanilla-pg", _losses.vanilla_pg_loss)

GROUP_ADVANTAGES: Registry = Registry(
    "group advantage estimator", "(scores, group_size=None) -> advantages")
GROUP_ADVANTAGES.register("grpo", _group.grpo_advantages)
GROUP_ADVANTAGES.register(
    "grpo-no-std", lambda scores, group_size=None: _group.grpo_advantages(
        scores, group_size, normalize_std=False))
GROUP_ADVANTAGES.register("dr-grpo", _group.dr_grpo_advantages)
GROUP_ADVANTAGES.register("rloo", _group.rloo_advantages)


def _td0(rewards, values, next_values, terminated, episode_end, gamma, lam=0.0):
    return _gae.gae(rewards, values, next_values, terminated, episode_end, gamma, 0.0)


def _mc(rewards, values, next_values, terminated, episode_end, gamma, lam=1.0):
    return _gae.gae(rewards, values, next_values, terminated, episode_end, gamma, 1.0)


ENV_ADVANTAGES: Registry = Registry(
    "advantage estimator",
    "(rewards, values, next_values, terminated, episode_end, gamma, lam) -> (adv, returns)")
ENV_ADVANTAGES.register("gae", _gae.gae)
ENV_ADVANTAGES.register("td0", _td0)
ENV_ADVANTAGES.register("monte-carlo", _mc)
