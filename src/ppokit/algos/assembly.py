"""What an environment trainer is assembled from, in the order :class:`Trainer` builds it:
the process's seeds, the environments (a vector env, Ray actors or a self-play run's
games), the learner (the policy, the update's spec, the choice between the fused and the
eager minibatch step, the optimiser) and the collector with its normalisers."""

from __future__ import annotations

import random

import numpy as np
import torch

from ppokit.core import ENV_ADVANTAGES, POLICY_LOSSES, AdaptiveKLController
from ppokit.engine import UpdateSpec
from ppokit.engine.allocator import keep_freed_memory
from ppokit.engine.flat import FlatParameters
from ppokit.engine.fused import supports
from ppokit.engine.recipe import spec_of
from ppokit.engine.updater import Schedule, Updater
from ppokit.envs import ObsNormalizer, RewardScaler
from ppokit.envs.multiagent import state_space_of
from ppokit.envs.vec import training_vec
from ppokit.errors import UsageError
from ppokit.io.tracking import check_tracker
from ppokit.plugins import require
from ppokit.policies import is_recurrent, policy_for_config
from ppokit.policies.encoders import precision_note
from ppokit.rollout import Collector, RecurrentCollector

from .config import TrainConfig, check_memory
from .masks import mask_source_for
from .optim import Adam

__all__ = ["update_spec", "seed_process", "make_envs", "make_learner", "make_collector"]


def update_spec(c: TrainConfig) -> UpdateSpec:
    """The engine's spec of a configuration's update (:func:`ppokit.engine.recipe.spec_of`;
    the clip range and the KL coefficient are per-iteration values: the schedule's and the
    controller's). The policy loss's registration declares whether it carries PPO-KL's
    penalty to the old policy."""
    require(POLICY_LOSSES, c.policy_loss, "policy_loss", "ppokit train --resume RUN_DIR")
    require(ENV_ADVANTAGES, c.advantage_estimator, "advantage_estimator",
            "ppokit train --resume RUN_DIR")
    anchor = POLICY_LOSSES.entry(c.policy_loss)["kl_anchor"]
    return spec_of(c, kl_anchor=anchor, kl_coef=c.kl_coef if anchor == "old" else 0.0)


def seed_process(c: TrainConfig) -> None:
    """The tracker checked, the allocator set, torch's threads and every global random
    stream seeded from ``c.seed``."""
    check_tracker(c.track)
    keep_freed_memory()  # engine/allocator.py: no kernel round trip per activation
    if c.torch_threads:
        torch.set_num_threads(c.torch_threads)
    random.seed(c.seed)
    np.random.seed(c.seed % 2**32)  # noqa: NPY002 (legacy global state, saved too)
    torch.manual_seed(c.seed)


def make_envs(tr, c: TrainConfig):
    """``tr.env`` (and ``tr.selfplay``): a self-play run's games, the environments in Ray
    actors (ppokit.distributed), or a vector env here. Returns the Ray collector or
    ``None``."""
    remote = None
    tr.selfplay = None  # a self-play run's games and pool (ppokit.selfplay.coach)
    if c.selfplay:
        from ppokit.selfplay.coach import SelfPlay

        tr.selfplay = SelfPlay(c, tr.run_dir, tr.log)
        tr.env = tr.selfplay.vec()
    elif c.vectorization == "ray":
        from ppokit.distributed import RayCollector

        remote = RayCollector(c, tr.env_maker, log=tr.log)
        tr.env = remote.env
    else:
        tr.env = training_vec(tr.env_maker, c.n_envs, vectorization=c.vectorization,
                              autoreset=c.autoreset_mode, env_kwargs=c.env_kwargs,
                              agent_id=c.agent_id, global_state=c.centralised_critic,
                              agent_groups=c.agent_groups)
    # the memory bound again, now with the real observation and action sizes
    check_memory(c, int(np.prod(tr.env.single_observation_space.shape or (1,))),
                 int(np.prod(tr.env.single_action_space.shape or (1,))))
    return remote


def make_learner(tr, c: TrainConfig) -> None:
    """``tr.policy``, ``tr.spec``, ``tr.mask_source``, the fused step's verdict
    (``tr.fused_reason``, ``None`` when it runs, with the flat parameter storage
    ``tr.flat``), the optimiser and the sampling and shuffling generators."""
    state_sp = state_space_of(tr.env, c.env_id) if c.centralised_critic else None
    tr.policy = policy_for_config(c, tr.env.single_observation_space,
                                  tr.env.single_action_space, state_sp)
    note = precision_note(tr.policy, c.precision)
    if note:
        tr.log(note)
    tr.spec = update_spec(c)
    tr.flat = None
    tr.mask_source = mask_source_for(c, tr.env, tr.env_maker, tr.log)
    tr.fused_reason = "fast=false" if not c.fast else (
        "one policy per agent group (agent_groups)" if c.agent_groups != "shared"
        else supports(tr.spec, tr.policy, masked=tr.mask_source is not None))
    if tr.fused_reason is None:
        # flat parameter storage, created before the optimiser, the sampler and the
        # checkpoint code see the parameters (the fused step works on it)
        tr.flat = FlatParameters(tr.policy.parameters())
    elif c.fast:
        tr.log(f"fused minibatch step not used ({tr.fused_reason}); using the eager step")
    params = list(tr.policy.parameters())
    # Adam: torch's fused kernel (one pass over all parameters, 3-4x faster than the
    # per-tensor loop for small MLPs) through ppokit's Adam, which spares the import of
    # torch._dynamo that constructing any torch.optim optimiser costs (~70 MB)
    if c.optimizer == "adam":
        tr.opt = Adam(params, lr=c.learning_rate, eps=c.optimizer_eps, flat=tr.flat)
    else:
        tr.opt = torch.optim.RMSprop(params, lr=c.learning_rate, alpha=0.99,
                                     eps=c.optimizer_eps, foreach=True)
    tr.sample_gen = torch.Generator().manual_seed(c.seed * 2 + 1)
    tr.shuffle_gen = torch.Generator().manual_seed(c.seed * 2 + 2)


def make_collector(tr, c: TrainConfig, remote) -> None:
    """The observation and reward normalisers, ``tr.collector`` (the Ray one when
    ``remote``, the recurrent one for an LSTM policy) and ``tr.updater``."""
    if c.normalize_obs and getattr(tr.policy, "encoder", None) is not None:
        raise UsageError("normalize_obs: the observation encoder (cnn / multi_input) "
                         "scales its inputs itself (pixels to [0, 1]); a running "
                         "normalisation in front of it would distort them: set "
                         "normalize_obs=false")
    tr.obs_norm = (ObsNormalizer(tr.env.single_observation_space.shape, c.clip_obs)
                   if c.normalize_obs else None)
    tr.reward_scaler = (RewardScaler(c.n_envs, c.gamma, c.clip_reward)
                        if c.normalize_reward else None)
    if remote is not None:
        tr.collector = remote.attach(tr.policy, tr.obs_norm, tr.reward_scaler)
    else:
        collector = RecurrentCollector if is_recurrent(tr.policy) else Collector
        tr.collector = collector(tr.env, tr.policy, generator=tr.sample_gen,
                                 obs_normalizer=tr.obs_norm, reward_scaler=tr.reward_scaler,
                                 use_critic=c.use_critic, fast=c.fast,
                                 mask_source=tr.mask_source)
    # the update policy (engine/updater.py): schedules, PPO-KL's adaptive beta, observers
    tr.updater = Updater(tr.spec, lr=Schedule(c.learning_rate, c.lr_schedule),
                         clip=Schedule(c.clip_range, c.clip_schedule),
                         kl=(AdaptiveKLController(c.kl_coef, c.kl_target)
                             if tr.spec.kl_anchor == "old" else None))
