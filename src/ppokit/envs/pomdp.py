"""Partially observable versions of classic-control tasks: the velocities hidden.

:class:`HideVelocity` keeps only some entries of a flat Box observation. Registered ids
(in ppokit's Gymnasium namespace, available once ``ppokit.envs`` is imported, as every
entry point that builds environments does):

* ``ppokit/CartPoleNoVel-v1``: CartPole-v1 observing only the cart position x and the pole
  angle θ (not ẋ, θ̇); 500 steps, as CartPole-v1.
* ``ppokit/PendulumNoVel-v1``: Pendulum-v1 observing only cos θ and sin θ (not θ̇);
  200 steps, as Pendulum-v1.

One observation then does not give the state: a policy has to estimate the velocities
from the observations it has seen, which is what a recurrent policy (``recurrent = "lstm"``)
can do and a feed-forward one cannot. The wrapper holds no state of its own, so the
environments' state is still saved for exact resume (:func:`ppokit.envs.env_state`).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["HideVelocity", "POMDP_IDS", "register_pomdps"]

POMDP_IDS = ("ppokit/CartPoleNoVel-v1", "ppokit/PendulumNoVel-v1")


class HideVelocity(gym.ObservationWrapper):
    """Observe only the entries ``keep`` of a flat Box observation (in that order)."""

    def __init__(self, env: gym.Env, keep: tuple[int, ...]):
        super().__init__(env)
        box = env.observation_space
        if not isinstance(box, spaces.Box) or len(box.shape) != 1:
            raise ValueError(f"env: HideVelocity needs a flat Box observation, got {box}")
        self.keep = np.asarray(keep, np.int64)
        if self.keep.size == 0 or self.keep.min() < 0 or self.keep.max() >= box.shape[0]:
            raise ValueError(f"keep: expected indices in [0, {box.shape[0]}), got {keep}")
        self.observation_space = spaces.Box(box.low[self.keep], box.high[self.keep],
                                            dtype=box.dtype)

    def observation(self, observation):
        return np.asarray(observation)[self.keep]


def make_cartpole_novel(**kwargs) -> gym.Env:
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    return HideVelocity(CartPoleEnv(**kwargs), keep=(0, 2))  # x, theta


def make_pendulum_novel(**kwargs) -> gym.Env:
    from gymnasium.envs.classic_control.pendulum import PendulumEnv

    return HideVelocity(PendulumEnv(**kwargs), keep=(0, 1))  # cos theta, sin theta


def register_pomdps() -> None:
    """Register :data:`POMDP_IDS` with Gymnasium (once)."""
    if POMDP_IDS[0] in gym.registry:
        return
    gym.register(POMDP_IDS[0], entry_point="ppokit.envs.pomdp:make_cartpole_novel",
                 max_episode_steps=500, reward_threshold=475.0)
    gym.register(POMDP_IDS[1], entry_point="ppokit.envs.pomdp:make_pendulum_novel",
                 max_episode_steps=200)
