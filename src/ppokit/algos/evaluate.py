"""Evaluating a trained run: load its latest checkpoint and play whole episodes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ppokit.envs import ObsNormalizer, make_vec
from ppokit.envs.checked import label_of
from ppokit.envs.multiagent import agents_of
from ppokit.errors import UsageError, UserCodeError

from .acting import Memory, new_memory, policy_actions  # noqa: F401 (re-exported)
from .config import TrainConfig
from .masks import EvalMasks
from .runs import open_run, policy_from_checkpoint  # noqa: F401 (re-exported)

# steps of one evaluation episode: an environment without an end is an error, not a hang
MAX_EPISODE_STEPS = 10**6

__all__ = ["load_policy", "policy_from_checkpoint", "evaluate_policy", "evaluate_run",
           "Memory", "new_memory", "policy_actions"]


def load_policy(run_dir: str | Path, env=None, where: str = "--env", *, best: bool = False):
    """``(config, policy, obs_normalizer | None, env_maker)`` of a run directory
    (:func:`ppokit.algos.runs.open_run`: its newest intact checkpoint, or ``best/`` with
    ``best``). ``env`` is what the user passed again (an id or a factory);
    ``env_maker`` is what builds the run's environments."""
    run = open_run(run_dir, env, where, best=best)
    policy, norm, _ = run.policy()
    return run.cfg, policy, norm, run.env


def evaluate_policy(policy, cfg: TrainConfig, *, episodes: int = 10, seed: int = 0,
                    deterministic: bool = True, obs_norm: ObsNormalizer | None = None,
                    batch: int = 16, env=None, lengths: list[int] | None = None,
                    spaces: tuple | None = None, use_masking: bool = True) -> list[float]:
    """Undiscounted returns of ``episodes`` whole episodes (raw rewards; an Atari game is
    played whole, all lives, with unclipped rewards: the returns are game scores).

    Episodes run ``batch`` at a time, one per env, each env seeded ``seed + k`` for the
    k-th episode, so the result does not favour short episodes. ``env`` (an id or a
    factory) builds them instead of ``cfg.env_id``. The envs are separate copies (sync, or
    async when the run is), never a vectorised entry point, whose one generator for all
    copies would make episode k depend on the batch: so episode k is the episode a single
    env reset with ``seed + k`` plays (what :mod:`.video` records). ``lengths``: a list
    that receives each episode's number of steps, in the same order. ``spaces``: the
    policy's ``(observation_space, action_space)``, which the environment must have (an
    environment the user gives instead of the run's is checked against them).
    An environment that gives action masks (:mod:`ppokit.envs.masks`) has them applied
    unless ``use_masking`` is false.
    """
    maker = cfg.env_id if env is None else env
    if episodes < 1:
        raise UsageError(f"--episodes: expected an integer >= 1, got {episodes}")
    mode = "async" if cfg.vectorization == "async" else "sync"
    gen = torch.Generator().manual_seed(seed)
    returns: list[float] = []
    k = agents_of(maker, cfg.env_kwargs)  # a multi-agent env: k rows (agents) per copy
    while len(returns) < episodes:
        n = min(batch, episodes - len(returns))
        n = -(-n // k) * k  # (an agent's episode each row; the first ones are kept)
        # training=False: an Atari game is played whole, rewards unclipped (its score)
        env = make_vec(maker, n, vectorization=mode, autoreset="auto",
                       env_kwargs=cfg.env_kwargs, training=False, agent_id=cfg.agent_id,
                       agent_groups=cfg.agent_groups)
        if spaces is not None:
            _check_fits(env, spaces, maker)
        space = env.single_action_space
        obs, info = env.reset(seed=seed + len(returns))
        masks = EvalMasks(env, info, maker, use_masking)
        total = np.zeros(n)
        length = np.zeros(n, np.int64)
        done = np.zeros(n, bool)
        memory = new_memory(policy, n)  # (an env that has finished plays on, not counted)
        steps = 0
        with torch.inference_mode():
            while not done.all():
                a = policy_actions(policy, obs, space, obs_norm, deterministic, gen, memory,
                                   masks.read(obs, info, done))
                obs, r, te, tr, info = env.step(a)
                total += np.where(done, 0.0, r)
                length += ~done
                done |= te | tr
                steps += 1
                if steps >= MAX_EPISODE_STEPS:
                    env.close()
                    raise UserCodeError(
                        f"{label_of(maker)}: an evaluation episode did not end within "
                        f"{MAX_EPISODE_STEPS} steps; expected episodes that end (a time "
                        "limit: gymnasium.wrappers.TimeLimit or max_episode_steps)")
        env.close()
        keep = min(n, episodes - len(returns))
        returns.extend(total[:keep].tolist())
        if lengths is not None:
            lengths.extend(int(x) for x in length[:keep])
    return returns


def _check_fits(env, spaces: tuple, maker) -> None:
    """A :class:`UsageError` (the vector env closed) unless ``env``'s single observation and
    action spaces have the shapes and kinds of the policy's ``spaces``."""
    got = (env.single_observation_space, env.single_action_space)
    for what, want, have in zip(("observation", "action"), spaces, got):
        if type(want) is not type(have) or want.shape != have.shape or \
                getattr(want, "n", None) != getattr(have, "n", None):
            env.close()
            raise UsageError(f"env: the {what} space of {label_of(maker)} is "
                             f"{_brief(have)}; the policy was trained for {_brief(want)}")


def _brief(space) -> str:
    text = str(space)
    return text if len(text) <= 40 else f"{type(space).__name__} of shape {space.shape}"


def evaluate_run(run_dir: str | Path, *, episodes: int = 10, seed: int | None = None,
                 deterministic: bool = True, env=None, best: bool = False,
                 video: str | Path | None = None) -> dict:
    """Evaluate a run's newest intact checkpoint (``best``: its ``best/`` policy); ``env``
    as for :func:`load_policy`. ``video``: a directory that receives an MP4 of each
    episode (:func:`ppokit.algos.video.record_episodes`), described under ``"video"``."""
    if video is not None:
        from .video import check_video_dir, require_video_extra

        check_video_dir(video)
        require_video_extra()
    run = open_run(run_dir, env, best=best)
    cfg, maker = run.cfg, run.env
    if cfg.selfplay:  # (its games have an opponent: ppokit.algos.opponent_eval)
        raise UsageError(f"{run_dir} is a self-play run of {cfg.env_id}: evaluate it against "
                         "an opponent (--opponent random, heuristic, snapshot:N or RUN2)")
    policy, norm, spaces = run.policy()
    seed = cfg.seed + 1_000_000 if seed is None else seed
    rets = evaluate_policy(policy, cfg, episodes=episodes, seed=seed,
                           deterministic=deterministic, obs_norm=norm, env=maker,
                           spaces=spaces)
    # the environment played: the id given for a factory run, else the run's own
    res = _result(rets, episodes, seed, deterministic,
                  maker if isinstance(maker, str) else cfg.env_id)
    if video is not None:
        from .video import record_episodes

        res["video"] = record_episodes(policy, cfg, maker, video, episodes=episodes,
                                       seed=seed, deterministic=deterministic, obs_norm=norm)
    return res


def _result(rets: list[float], episodes: int, seed: int, deterministic: bool,
            env_id: str) -> dict:
    return {"mean_return": float(np.mean(rets)), "std_return": float(np.std(rets)),
            "episodes": episodes, "returns": rets, "seed": seed,
            "deterministic": deterministic, "env_id": env_id}
