"""MinAtar's games (the ``minatar`` extra): ``MinAtar/Breakout-v1`` and the others.

MinAtar (Young & Tian 2019) plays five Atari-like games on a 10×10 grid; an observation is
a ``Box`` of booleans ``10×10×C``, one plane per kind of object (Breakout: paddle, ball,
trail, bricks), which ppokit reads as an image (:mod:`ppokit.policies.encoders`: bool
planes, the small-image CNN). The package registers Gymnasium ids for them,
``MinAtar/<Game>-v0`` (all 6 actions) and ``MinAtar/<Game>-v1`` (the game's minimal action
set) for Asterix, Breakout, Freeway, Seaquest and SpaceInvaders, with MinAtar's own
defaults (sticky actions with probability 0.1, difficulty ramping, no time limit). It does
so in a function Gymnasium 1.x no longer calls by itself (an entry-point plugin), so ppokit
calls it (:func:`register`) when an id in the ``MinAtar/`` namespace is asked for — the
package is imported because the id names its games, as ale-py is for ``ALE/`` ids.
"""

from __future__ import annotations

from ppokit.errors import extra_hint

__all__ = ["register", "NAMESPACE", "EXTRA_HINT"]

NAMESPACE = "MinAtar/"
EXTRA_HINT = extra_hint("minatar")


def register() -> bool:
    """Register MinAtar's ids with Gymnasium; ``False`` when minatar is not installed."""
    try:
        from minatar.gym import register_envs
    except ImportError:
        return False
    import gymnasium as gym

    if "MinAtar/Breakout-v1" not in gym.registry:
        register_envs()
    return True
