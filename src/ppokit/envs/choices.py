"""A task that invalid-action masking makes learnable, registered as
``ppokit/MaskedChoice-v0`` when ``ppokit.envs`` is imported.

Each step offers ``choices`` (4) of the ``actions`` (32) actions, a new set every step,
drawn from the environment's own generator; an episode is truncated after ``steps`` (20). The
observation is a one-hot class ``x`` of ``classes`` (4); the set offered always holds one
action ``a`` with ``a % classes == x`` (reward 1; the other allowed actions: 0). Any action
not offered is catastrophic: reward −1 and the episode ends. The set offered is not in the
observation: it is the action mask, given in one of the ways ppokit reads
(:mod:`ppokit.envs.masks`), chosen by ``masks``:

* ``"method"`` (default): an ``action_masks()`` method;
* ``"info"``: ``info["action_mask"]`` of every reset and step;
* ``"obs"``: a ``Dict`` observation, ``{"obs": the class, "action_mask": the set}``;
* ``"none"``: no mask at all.

With the mask, a policy that samples among the allowed actions scores about 9 an episode
and one that learned the class rule 20 (the most there is). Without it, any action is
allowed with probability 4/32 whatever the policy learns, so episodes end after about a
step, below 0. The state is plain (numpy arrays, integers, the generator), so a run on it
resumes exactly (:func:`ppokit.envs.env_state`).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["MaskedChoice", "MaskedChoiceMethod", "CHOICE_IDS", "make_masked_choice",
           "register_choices"]

CHOICE_IDS = ("ppokit/MaskedChoice-v0",)
MASK_WAYS = ("method", "info", "obs", "none")


class MaskedChoice(gym.Env):
    """Pick the offered action of the observed class (module doc)."""

    metadata = {"render_modes": []}

    def __init__(self, actions: int = 32, choices: int = 4, classes: int = 4,
                 steps: int = 20, masks: str = "method"):
        if masks not in MASK_WAYS:
            raise ValueError(f"masks: expected one of {', '.join(MASK_WAYS)}, got {masks!r}")
        if not (2 <= choices <= actions and 1 <= classes <= actions and steps >= 1):
            raise ValueError(f"actions, choices, classes, steps: expected 2 <= choices <= "
                             f"actions, 1 <= classes <= actions, steps >= 1, got {actions}, "
                             f"{choices}, {classes}, {steps}")
        self.n, self.k, self.classes, self.steps, self.way = actions, choices, classes, steps, masks
        self.action_space = spaces.Discrete(actions)
        box = spaces.Box(0.0, 1.0, (classes,), np.float32)
        self.observation_space = (spaces.Dict({"obs": box,
                                               "action_mask": spaces.MultiBinary(actions)})
                                  if masks == "obs" else box)
        self.allowed = np.zeros(actions, bool)
        self.x = 0
        self.t = 0

    def _draw(self) -> None:
        rng = self.np_random
        self.x = int(rng.integers(self.classes))
        right = np.arange(self.x, self.n, self.classes)
        good = int(rng.choice(right))
        others = rng.choice(np.setdiff1d(np.arange(self.n), [good]), self.k - 1,
                            replace=False)
        self.allowed = np.zeros(self.n, bool)
        self.allowed[[good, *others]] = True

    def _out(self):
        x = np.zeros(self.classes, np.float32)
        x[self.x] = 1.0
        info = {"action_mask": self.allowed.copy()} if self.way == "info" else {}
        if self.way == "obs":
            return {"obs": x, "action_mask": self.allowed.astype(np.int8)}, info
        return x, info

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return self._out()

    def step(self, action):
        a = int(action)
        if not self.allowed[a]:  # catastrophic
            obs, info = self._out()
            return obs, -1.0, True, False, info
        reward = float(a % self.classes == self.x)
        self.t += 1
        self._draw()
        obs, info = self._out()
        return obs, reward, False, self.t >= self.steps, info  # (time runs out)


class MaskedChoiceMethod(MaskedChoice):
    """:class:`MaskedChoice` whose mask is its ``action_masks()`` method (``"method"``)."""

    def action_masks(self) -> np.ndarray:
        """The actions allowed in the current state."""
        return self.allowed.copy()


def make_masked_choice(**kwargs) -> MaskedChoice:
    """A :class:`MaskedChoice`; with ``masks="method"`` (the default) the class that has
    the ``action_masks()`` method (the others have none)."""
    way = kwargs.get("masks", "method")
    return (MaskedChoiceMethod if way == "method" else MaskedChoice)(**kwargs)


def register_choices() -> None:
    """Register :data:`CHOICE_IDS` with Gymnasium (once)."""
    if CHOICE_IDS[0] not in gym.registry:
        gym.register(CHOICE_IDS[0], entry_point="ppokit.envs.choices:make_masked_choice")
