"""A trained policy acting on a batch of raw observations: the run's normalisation, the
most likely / mean action or a sample, a recurrent policy's state carried along (used by
evaluation, videos and ``predict``)."""

from __future__ import annotations

import numpy as np
import torch

from ppokit.policies import is_recurrent
from ppokit.policies.actions import env_actions

__all__ = ["Memory", "new_memory", "policy_actions"]


class Memory:
    """The state of a recurrent policy playing ``n`` episodes side by side: ``state`` (the
    actor's ``(h, c)``) and ``episode_start`` (``[n]`` bool: the next observation begins an
    episode, so it is seen with the zero state). A caller that resets an env sets its row
    of ``episode_start``; :func:`policy_actions` clears it after the step."""

    def __init__(self, policy, n: int):
        self.state = policy.actor_state(policy.initial_state(n))
        self.episode_start = np.ones(n, bool)


def new_memory(policy, n: int) -> Memory | None:
    """A :class:`Memory` of ``n`` rows for a recurrent policy, ``None`` for the others."""
    return Memory(policy, n) if is_recurrent(policy) else None


def policy_actions(policy, obs, space, obs_norm, deterministic: bool, gen,
                   memory: Memory | None = None, masks: np.ndarray | None = None
                   ) -> np.ndarray:
    """Actions ``[n, *space.shape]`` of ``policy`` for a batch of raw observations
    ``[n, ...]``: the run's normalisation applied, the most likely / mean action or a
    sample, as actions of ``space`` (:func:`ppokit.policies.actions.env_actions`: start
    offsets added, Box actions clipped; the one place evaluation and video recording
    take actions).
    A recurrent policy needs its ``memory`` (:func:`new_memory`), which is carried on.
    ``masks``: ``[n, W]`` bool action masks (:mod:`ppokit.envs.masks`), or ``None``."""
    o = obs if obs_norm is None else obs_norm(obs)
    o = torch.as_tensor(np.asarray(o, np.float32))
    if is_recurrent(policy):
        if memory is None:
            raise ValueError("memory: a recurrent policy needs its state (new_memory)")
        a, memory.state = policy.predict(o, memory.state, memory.episode_start,
                                         deterministic, gen)
        memory.episode_start[:] = False
    else:
        extra = () if masks is None else (torch.from_numpy(masks),)
        a = (policy.deterministic_action(o, *extra) if deterministic
             else policy.act(o, gen, *extra)[0])
    return env_actions(a.numpy(), space)
