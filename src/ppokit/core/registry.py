"""Named registries of interchangeable parts that share one signature.

The names are the configuration values: ``policy_loss = "clip"`` selects
``POLICY_LOSSES.get("clip")``, ``advantage_estimator = "gae"`` selects
``ENV_ADVANTAGES.get("gae")``, and the configurations' allowed values are these registries'
names (docs/theory.md#one-idea).

An unknown name raises a ``ValueError`` listing the known names; registering a name twice
is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from . import advantage as _gae
from . import group as _group
from . import losses as _losses
from . import returns as _returns

F = TypeVar("F", bound=Callable)

__all__ = ["Registry", "POLICY_LOSSES", "GROUP_ADVANTAGES", "ENV_ADVANTAGES", "NO_CLIP"]


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


def _ratio_surrogate(logp, logp_old, advantages, mask=None, **options):
    """``−ρ Â`` without clipping: PPO-KL's surrogate (its KL penalty is a separate term).
    The clipped loss with a clip range no ratio reaches, so the statistics are the same."""
    return _losses.clipped_surrogate_loss(logp, logp_old, advantages, mask,
                                          clip_eps=NO_CLIP, **options)


NO_CLIP = 1e9  # a clip range no ratio reaches

POLICY_LOSSES: Registry = Registry(
    "policy loss", "(logp, logp_old, advantages, mask=None, **options) -> PolicyLoss")
POLICY_LOSSES.register("clip", _losses.clipped_surrogate_loss)
POLICY_LOSSES.register("vanilla", _losses.vanilla_pg_loss)
POLICY_LOSSES.register("kl_penalty", _ratio_surrogate)

GROUP_ADVANTAGES: Registry = Registry(
    "group advantage estimator", "(scores, group_size=None, **options) -> advantages")
GROUP_ADVANTAGES.register("grpo", _group.grpo_advantages)
GROUP_ADVANTAGES.register("dr_grpo", _group.dr_grpo_advantages)
GROUP_ADVANTAGES.register("rloo", _group.rloo_advantages)

ENV_ADVANTAGES: Registry = Registry(
    "advantage estimator",
    "(rewards, values, next_values, terminated, episode_end, gamma, lam) -> (adv, returns)")
ENV_ADVANTAGES.register("gae", _gae.gae)
ENV_ADVANTAGES.register("reward_to_go", _returns.reward_to_go_advantages)
