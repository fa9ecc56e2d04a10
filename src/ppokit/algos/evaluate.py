"""Evaluating a trained run: load its latest checkpoint and play whole episodes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces

from ppokit.envs import ObsNormalizer, make_vec
from ppokit.errors import UsageError
from ppokit.policies import make_policy

from .config import TrainConfig
from .trainer import load_run_checkpoint

__all__ = ["load_policy", "evaluate_policy", "evaluate_run"]


def load_policy(run_dir: str | Path):
    """``(config, policy, obs_normalizer | None)`` from a run's latest good checkpoint."""
    cfg, tensors, arrays, _ = load_run_checkpoint(run_dir)
    env = make_vec(cfg.env_id, 1, vectorization="sync")
    policy = make_policy(env.single_observation_space, env.single_action_space,
                         hidden=cfg.net_arch, activation=cfg.activation,
                         ortho_init=cfg.ortho_init, log_std_init=cfg.log_std_init)
    env.close()
    policy.load_state_dict(tensors["model"])
    policy.eval()
    norm = None
    if cfg.normalize_obs:
        norm = ObsNormalizer(tuple(arrays["obs_norm"]["mean"].shape), cfg.clip_obs)
        norm.load_state_dict(arrays["obs_norm"])
    return cfg, policy, norm


def evaluate_policy(policy, cfg: TrainConfig, *, episodes: int = 10, seed: int = 0,
                    deterministic: bool = True, obs_norm: ObsNormalizer | None = None,
                    batch: int = 16) -> list[float]:
    """Undiscounted returns of ``episodes`` whole episodes (raw rewards).

    Episodes run ``batch`` at a time, one per env, each env seeded ``seed + k`` for the
    k-th episode, so the result does not favour short episodes.
    """
    if episodes < 1:
        raise UsageError(f"--episodes: expected an integer >= 1, got {episodes}")
    gen = torch.Generator().manual_seed(seed)
    returns: list[float] = []
    while len(returns) < episodes:
        n = min(batch, episodes - len(returns))
        env = make_vec(cfg.env_id, n, vectorization=cfg.vectorization, autoreset="auto")
        space = env.single_action_space
        obs, _ = env.reset(seed=seed + len(returns))
        total = np.zeros(n)
        done = np.zeros(n, bool)
        with torch.inference_mode():
            while not done.all():
                o = obs if obs_norm is None else obs_norm(obs)
                o = torch.as_tensor(np.asarray(o, np.float32))
                if deterministic:
                    a = policy.deterministic_action(o)
                else:
                    a = policy.act(o, gen)[0]
                a = a.numpy()
                if isinstance(space, spaces.Box):
                    a = np.clip(a.reshape(n, *space.shape), space.low, space.high)
                obs, r, te, tr, _ = env.step(a)
                total += np.where(done, 0.0, r)
                done |= te | tr
        env.close()
        returns.extend(total.tolist())
    return returns


def evaluate_run(run_dir: str | Path, *, episodes: int = 10, seed: int | None = None,
                 deterministic: bool = True) -> dict:
    cfg, policy, norm = load_policy(run_dir)
    seed = cfg.seed + 1_000_000 if seed is None else seed
    rets = evaluate_policy(policy, cfg, episodes=episodes, seed=seed,
                           deterministic=deterministic, obs_norm=norm)
    return {"mean_return": float(np.mean(rets)), "std_return": float(np.std(rets)),
            "episodes": episodes, "returns": rets, "seed": seed,
            "deterministic": deterministic, "env_id": cfg.env_id}
