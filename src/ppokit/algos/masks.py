"""Whether a run's environments give action masks, found once when the trainer is set up
(:func:`mask_source_for`), and the masks of the observations evaluation plays
(:class:`EvalMasks`). Where masks come from: :mod:`ppokit.envs.masks`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ppokit.envs.checked import label_of
from ppokit.envs.masks import MASK_KEY, MaskSource, find_mask_source, mask_columns
from ppokit.errors import UsageError

__all__ = ["mask_source_for", "EvalMasks"]


def mask_source_for(cfg, env, maker, log: Callable[[str], None]) -> MaskSource | None:
    """The :class:`MaskSource` of the training envs ``env`` (``None``: they give no masks).
    The envs are reset once to see the reset's info (every run resets them again, with its
    seed, before collecting; EnvPool's are not). Masks need the feed-forward policy on local
    envs (Ray's actors apply none: an observation's mask key is refused there)."""
    if cfg.vectorization == "ray":  # (the environments live in Ray actors)
        _refuse_masks_on_ray(cfg, env, maker)
        return None
    # (EnvPool's envs give no masks, and a second reset would move its generator on)
    info = None if cfg.vectorization == "envpool" else env.reset(seed=cfg.seed)[1]
    src = find_mask_source(env, info, label_of(maker))
    if src is None:
        return None
    if getattr(cfg, "recurrent", "none") != "none":
        raise UsageError(f"recurrent: the environment gives action masks ({src.where}), "
                         "which the LSTM policy does not apply; use recurrent=none")
    log(f"{src.where}: the policy samples, scores and learns over the allowed actions only")
    return src


def _refuse_masks_on_ray(cfg, env, maker) -> None:
    """Ray's actors collect without masks: an env that gives them (an observation key, an
    ``action_masks()`` method, ``info["action_mask"]`` — the last two seen on one local
    copy of the env) is refused rather than trained as if it gave none."""
    where = None
    if mask_columns(env.single_observation_space) is not None:
        where = f'the observation has an "{MASK_KEY}" key'
    else:
        from ppokit.envs.vec import training_vec

        try:
            probe = training_vec(maker, 1, vectorization="sync",
                                 autoreset=cfg.autoreset_mode, env_kwargs=cfg.env_kwargs)
        except UsageError:  # (a module:Id this process was not asked to import: the
            return          # actors import it; nothing here can look at its masks)
        try:
            src = find_mask_source(probe, probe.reset(seed=cfg.seed)[1], label_of(maker))
        finally:
            probe.close()
        if src is not None:
            where = f"{label_of(maker)} gives {src.where}"
    if where is not None:
        raise UsageError(f"vectorization: {where}, and the Ray actors' collection applies "
                         "no action masks; use sync or async")


class EvalMasks:
    """The action masks of the observations an evaluation plays (``None`` where the env
    gives none, or ``use`` is false): :meth:`read` after each reset and step; an env that
    has finished (its actions are not counted) may give a mask that allows nothing."""

    def __init__(self, env, info: dict | None, maker, use: bool = True):
        self.src = find_mask_source(env, info, label_of(maker)) if use else None

    def read(self, obs, info: dict | None, done: np.ndarray | None = None):
        if self.src is None:
            return None
        return self.src.read(obs, info, dummy=done)


def given_masks(action_masks, obs: np.ndarray, observation_space, action_space):
    """The ``[n, W]`` bool tensor of masks for a batch of ``n`` flat observations ``obs``
    acted on by ``predict``: ``action_masks`` as given (one mask, or one per observation),
    else the observations' own ``"action_mask"`` entries where the space has that key;
    ``None`` when there are none."""
    import torch

    from ppokit.envs.masks import check_masks, mask_columns

    n = obs.shape[0]
    if action_masks is None:
        cols = mask_columns(observation_space)
        if cols is None:
            return None
        action_masks = obs.reshape(n, -1)[:, cols[0]:cols[1]]
    return torch.from_numpy(check_masks(action_masks, n, action_space, "predict",
                                        "action_masks"))
