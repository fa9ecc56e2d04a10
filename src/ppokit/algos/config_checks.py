"""The checks a training configuration passes as it is built (:class:`ppokit.algos.config.
TrainConfig`'s ``__post_init__``): each field against the bounds and choices of its metadata
(:func:`ppokit.settings.check_fields`), the fields whose form metadata cannot express
(``torch_threads``, ``env_kwargs``, ``net_arch``, ``cnn_channels``, ``env_id``,
``wandb_project``), the combinations of fields, and the memory the run would need.
Each failure is a :class:`~ppokit.errors.UsageError` naming the key.
"""

from __future__ import annotations

import os
import re
from dataclasses import fields
from typing import Any

from ppokit.core.registry import ENV_ADVANTAGES
from ppokit.engine.recipe import checked_options
from ppokit.errors import UsageError
from ppokit.selfplay.settings import check_selfplay
from ppokit.settings import check_fields, fail, range_text

from .memory import check_memory

__all__ = ["validate", "max_torch_threads"]

NET_ARCH_MAX_LAYERS = 64
NET_ARCH_MAX_WIDTH = 65_536
ENV_ID_MAX_LEN = 256
_ENV_ID = re.compile(r"[\w.:/-]+")
_PROJECT = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def max_torch_threads() -> int:
    """The most torch threads a config may ask for: 4 per CPU core (at least 64, at most
    1024). Far more threads than that only crash or thrash."""
    return min(1024, max(64, 4 * (os.cpu_count() or 1)))


def validate(c) -> None:
    """Check a :class:`~ppokit.algos.config.TrainConfig` as it is built: each field against
    its metadata, the fields the metadata cannot express, and the combinations."""
    check_fields(c, skip=("env_kwargs", "net_arch", "cnn_channels", "torch_threads"),
                 texts={"batch_size": "an integer in [0, n_steps * n_envs] (0 = the whole "
                                      "rollout)"})
    threads = (0, max_torch_threads(), False)
    if not isinstance(c.torch_threads, int) or isinstance(c.torch_threads, bool) or not (
            0 <= c.torch_threads <= threads[1]):
        fail("torch_threads", "expected " + range_text(threads), c.torch_threads)
    from ppokit.envs.source import check_env_kwargs

    try:
        object.__setattr__(c, "env_kwargs", check_env_kwargs(c.env_kwargs, "env_kwargs"))
    except UsageError as exc:
        exc.field = "env_kwargs"  # resolve_config names the flag that set it
        raise
    if not (isinstance(c.cnn_channels, tuple) and len(c.cnn_channels) == 3 and all(
            _positive_int(x, 4096) for x in c.cnn_channels)):
        fail("cnn_channels", "expected " + _expected(c, "cnn_channels"), c.cnn_channels)
    if not (isinstance(c.net_arch, tuple) and len(c.net_arch) <= NET_ARCH_MAX_LAYERS
            and all(_positive_int(x, NET_ARCH_MAX_WIDTH) for x in c.net_arch)):
        fail("net_arch", "expected " + _expected(c, "net_arch"), c.net_arch)
    if not (0 < len(c.env_id) <= ENV_ID_MAX_LEN and _ENV_ID.fullmatch(c.env_id)):
        fail("env_id", "expected a Gymnasium environment id such as CartPole-v1", c.env_id)
    if not _PROJECT.fullmatch(c.wandb_project):
        fail("wandb_project", "expected a W&B project name: 1 to 128 letters, digits, "
             "'-', '_' or '.'", c.wandb_project)
    _check_combinations(c)
    for table, value in checked_options(c).items():  # typed by the parts' declarations
        object.__setattr__(c, table, value)
    check_selfplay(c)
    check_memory(c)


def _positive_int(x: Any, most: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= most


def _expected(c, name: str) -> str:
    return next(f for f in fields(c) if f.name == name).metadata["expected"]


def _check_combinations(c) -> None:
    if c.batch_size > c.rollout_size:
        fail("batch_size", f"{c.batch_size} is larger than the rollout (n_steps * n_envs = "
             f"{c.n_steps} * {c.n_envs} = {c.rollout_size})", show=False)
    if c.total_timesteps < c.rollout_size:
        fail("total_timesteps", f"{c.total_timesteps} is smaller than one rollout "
             f"(n_steps * n_envs = {c.rollout_size})", show=False)
    if c.stop_at_return is not None and c.eval_every == 0:
        fail("stop_at_return", "needs eval_every > 0 (it is compared with the evaluations "
             "during training)", show=False)
    if c.vectorization != "ray" and (c.num_workers != 1 or c.envs_per_worker):
        fail("num_workers" if c.num_workers != 1 else "envs_per_worker",
             "applies only with vectorization=ray (the environments in Ray actors)",
             show=False)
    if c.vectorization == "ray" and c.n_envs % c.num_workers:
        fail("n_envs", f"{c.n_envs} environments do not split evenly over num_workers = "
             f"{c.num_workers} Ray actors (vectorization=ray)", show=False)
    if c.vectorization == "ray" and c.envs_per_worker \
            and c.n_envs != c.num_workers * c.envs_per_worker:
        fail("n_envs", f"{c.n_envs} is not num_workers * envs_per_worker = "
             f"{c.num_workers} * {c.envs_per_worker} (vectorization=ray)", show=False)
    if c.recurrent == "lstm" and c.policy not in ("auto", "mlp"):
        what = (c.policy if c.policy in ("cnn", "multi_input")
                else f"{c.policy!r} (a features extractor of your own)")
        fail("recurrent", f"lstm runs on the MLP encoder, which flattens the observation; "
             f"policy={what} with an LSTM is not supported: use policy=auto or mlp with "
             "recurrent=lstm, or recurrent=none with that encoder", show=False)
    if c.shared_lstm and c.enable_critic_lstm:
        fail("shared_lstm", "true shares the actor's LSTM with the critic, so it needs "
             "enable_critic_lstm = false (the critic's own LSTM)", show=False)
    if c.centralised_critic and (c.recurrent != "none" or not c.use_critic or c.selfplay):
        fail("centralised_critic", "true needs the feed-forward policy (recurrent = none), "
             "a critic (use_critic = true) and no self-play", show=False)
    if c.agent_groups != "shared" and (c.recurrent != "none" or c.selfplay
                                       or c.normalize_obs):
        fail("agent_groups", f"{c.agent_groups} (one policy per agent group) needs the "
             "feed-forward policy (recurrent = none), no self-play and normalize_obs = false "
             "(the rows' group index is part of the observation)", show=False)
    if not c.use_critic and ENV_ADVANTAGES.entry(c.advantage_estimator)["needs_critic"]:
        fail("use_critic", f"false needs an advantage estimator without a critic, e.g. "
             f"reward_to_go ({c.advantage_estimator} reads the critic's values)", show=False)
