"""The action spaces ppokit's policies act in, and the one conversion of a policy's actions
into actions the environment's space contains.

A policy samples, stores (rollouts) and scores (log-probabilities) actions in its own
coordinates, the same for every shape and offset of a space:

==============================  ==========================================================
Gymnasium space                 the policy's action (one row of a batch)
==============================  ==========================================================
``Discrete(n, start=s)``        the index ``a − s`` in ``[0, n)``, int64 ``[]``
``MultiDiscrete(nvec, start)``  the indices ``a − start`` per entry, int64 ``nvec.shape``
                                (any shape; the heads read it flattened, row-major)
``MultiBinary(n or shape)``     the bits, int64 ``shape`` (read flattened)
``Box`` of floats               the unclipped Gaussian sample, float32 ``shape`` (read
                                flattened); its log-probability is of exactly this sample
==============================  ==========================================================

:func:`env_actions` is the one place those become the environment's actions — the start
offsets added, Box samples clipped to the bounds, the space's dtype and shape — used by the
rollout collectors (local, Ray actors, EnvPool), evaluation, video and ``predict``; what it
returns is what ``space.contains`` accepts. :func:`check_action_space` refuses every other
space (``Tuple``, ``Dict``, ``Graph``, ``Sequence``, ``Text``, ``OneOf``, a Box of
integers, a space without entries) with one line naming it, before any training.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

__all__ = ["check_action_space", "env_actions", "ActionConverter", "space_text"]

SUPPORTED = "Discrete, MultiDiscrete, MultiBinary or a Box of floats"


def space_text(space) -> str:
    """A one-line description of ``space`` (its repr, shortened) for messages."""
    text = " ".join(repr(space).split())
    return text if len(text) <= 100 else text[:97] + "..."


def check_action_space(space, recurrent: bool = False) -> None:
    """Raise a one-line :class:`ValueError` naming ``space`` unless ppokit's policies act
    in it (``recurrent``: the LSTM policy, which has no MultiBinary head)."""
    why = None
    if isinstance(space, spaces.Box):
        if not np.issubdtype(space.dtype, np.floating):
            why = (f"a Box of {space.dtype} (the Gaussian policy samples real numbers; "
                   "use Discrete or MultiDiscrete for integer actions)")
        elif int(np.prod(space.shape)) == 0:
            why = "a Box without entries"
    elif isinstance(space, spaces.MultiBinary):
        if recurrent:
            why = "MultiBinary (the LSTM policy has no Bernoulli head; recurrent=none has)"
        elif int(np.prod(space.shape)) == 0:
            why = "a MultiBinary space without entries"
    elif isinstance(space, spaces.MultiDiscrete):
        if space.nvec.size == 0:
            why = "a MultiDiscrete space without entries"
    elif not isinstance(space, spaces.Discrete):
        why = f"{type(space).__name__} spaces"
    if why is not None:
        raise ValueError(f"action space {space_text(space)} is not supported: {why}; "
                         f"ppokit's policies act in {SUPPORTED}")


class ActionConverter:
    """:func:`env_actions` for one space, with what it needs computed once (the rollout
    calls it every step)."""

    def __init__(self, space):
        check_action_space(space)
        self.space = space
        self.shape = tuple(space.shape)
        self.dtype = space.dtype
        self.box = isinstance(space, spaces.Box)
        start = getattr(space, "start", None)
        self.start = None
        if start is not None and np.any(np.asarray(start) != 0):
            self.start = np.asarray(start, np.int64)
        if self.box:
            self.low, self.high = space.low, space.high

    def __call__(self, actions) -> np.ndarray:
        """``[B, ...]`` policy actions → ``[B, *space.shape]`` actions of the space."""
        a = np.asarray(actions)
        a = a.reshape(a.shape[0], *self.shape)
        if self.box:  # to the space's dtype, then clipped: its bounds are in that dtype
            return np.clip(a.astype(self.dtype, copy=False), self.low, self.high)
        if self.start is not None:
            a = a + self.start
        return a.astype(self.dtype, copy=False)


def env_actions(actions, space) -> np.ndarray:
    """A batch of a policy's actions (module doc) as the environment's actions
    ``[B, *space.shape]``: start offsets added, Box samples clipped to the bounds, in the
    space's dtype — each row one that ``space.contains`` accepts."""
    return ActionConverter(space)(actions)
