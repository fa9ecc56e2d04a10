"""One Stable-Baselines3 PPO training run with the RL-zoo settings, timed from inside.

Run by ``bench.vs_sb3`` in a fresh process; prints one JSON line with the training time,
its rollout/update split, the process's peak memory and a deterministic evaluation.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

T_START = time.perf_counter()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench._split import sb3_rollout_clock  # noqa: E402


def linear(v0):
    return lambda progress_remaining: progress_remaining * v0


def zoo(env_id: str):
    """The RL-zoo's tuned PPO hyperparameters (hyperparams/ppo.yml) for the two cases."""
    if env_id == "CartPole-v1":
        return dict(n_envs=8, normalize=False, steps=100_000, kwargs=dict(
            n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
            learning_rate=linear(1e-3), clip_range=linear(0.2)))
    if env_id == "HalfCheetah-v5":
        return dict(n_envs=1, normalize=True, steps=1_000_000, kwargs=dict(
            batch_size=64, n_steps=512, gamma=0.98, learning_rate=2.0633e-05,
            ent_coef=0.000401762, clip_range=0.1, n_epochs=20, gae_lambda=0.92,
            max_grad_norm=0.8, vf_coef=0.58096,
            policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=torch.nn.ReLU,
                               net_arch=dict(pi=[256, 256], vf=[256, 256]))))
    raise SystemExit(f"unknown case {env_id}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--threads", type=int, default=0, help="0: torch's default")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    cfg = zoo(a.env)
    steps = a.steps or cfg["steps"]
    env = make_vec_env(a.env, n_envs=cfg["n_envs"], seed=a.seed)
    if cfg["normalize"]:
        env = VecNormalize(env, gamma=cfg["kwargs"]["gamma"])

    model = PPO("MlpPolicy", env, seed=a.seed, verbose=0, device="cpu", **cfg["kwargs"])
    split = sb3_rollout_clock()
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps, callback=split)
    train_s = time.perf_counter() - t0

    eval_env = make_vec_env(a.env, n_envs=1, seed=10_000 + a.seed)
    if cfg["normalize"]:
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False,
                                gamma=cfg["kwargs"]["gamma"])
        eval_env.obs_rms = env.obs_rms
    returns = []
    obs = eval_env.reset()
    ep_ret = 0.0
    while len(returns) < a.eval_episodes:
        action, _ = model.predict(obs, deterministic=True)
        obs, rew, done, info = eval_env.step(action)
        ep_ret += float(info[0].get("episode", {}).get("r", 0.0)) if done[0] else 0.0
        if done[0]:
            returns.append(ep_ret)
            ep_ret = 0.0
    print(json.dumps({
        "lib": "sb3", "env": a.env, "seed": a.seed, "steps": int(model.num_timesteps),
        "train_s": train_s, "rollout_s": split.rollout, "update_s": train_s - split.rollout,
        "eval_mean": float(np.mean(returns)), "eval_std": float(np.std(returns)),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "in_process_s": time.perf_counter() - T_START,
        "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
