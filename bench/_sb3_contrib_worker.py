"""One sb3-contrib RecurrentPPO training run on a velocity-hidden task, timed from inside.

Run by ``bench.vs_sb3_contrib`` in a fresh process with the settings of ppokit's preset for
the same environment (``ppokit.algos.config.ENV_PRESETS``); prints one JSON line with the
training time, its rollout/update split, peak memory and a deterministic evaluation (the
LSTM state carried through each episode).
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


def settings(env_id: str) -> dict:
    """ppokit's presets for these ids (``ppokit.algos.config.ENV_PRESETS``), in
    sb3-contrib's terms."""
    relu64 = dict(ortho_init=False, activation_fn=torch.nn.ReLU, lstm_hidden_size=64,
                  enable_critic_lstm=True, net_arch=dict(pi=[64], vf=[64]))
    if env_id == "ppokit/CartPoleNoVel-v1":
        return dict(n_envs=8, norm_reward=True, kwargs=dict(
            n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
            ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2),
            policy_kwargs=relu64))
    if env_id == "ppokit/PendulumNoVel-v1":
        return dict(n_envs=4, norm_reward=True, kwargs=dict(
            n_steps=1024, batch_size=256, gae_lambda=0.95, gamma=0.9, n_epochs=10,
            ent_coef=0.0, learning_rate=1e-3, clip_range=0.2, policy_kwargs=relu64))
    raise SystemExit(f"unknown case {env_id}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (ppokit's default: 1; 0: torch's own)")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    import ppokit.envs  # noqa: F401  (registers the ppokit/... ids)

    cfg = settings(a.env)
    gamma = cfg["kwargs"]["gamma"]
    env = VecNormalize(make_vec_env(a.env, n_envs=cfg["n_envs"], seed=a.seed),
                       norm_obs=True, norm_reward=cfg["norm_reward"], gamma=gamma)

    model = RecurrentPPO("MlpLstmPolicy", env, seed=a.seed, verbose=0, device="cpu",
                         **cfg["kwargs"])
    split = sb3_rollout_clock()
    t0 = time.perf_counter()
    model.learn(total_timesteps=a.steps, callback=split)
    train_s = time.perf_counter() - t0

    eval_env = VecNormalize(make_vec_env(a.env, n_envs=1, seed=10_000 + a.seed),
                            training=False, norm_obs=True, norm_reward=False, gamma=gamma)
    eval_env.obs_rms = env.obs_rms
    returns = []
    obs = eval_env.reset()
    state, start = None, np.ones(1, bool)
    while len(returns) < a.eval_episodes:
        action, state = model.predict(obs, state=state, episode_start=start,
                                      deterministic=True)
        obs, _, done, info = eval_env.step(action)
        start = done
        if done[0]:
            returns.append(float(info[0]["episode"]["r"]))
    print(json.dumps({
        "lib": "sb3-contrib", "env": a.env, "seed": a.seed, "steps": int(model.num_timesteps),
        "train_s": train_s, "rollout_s": split.rollout, "update_s": train_s - split.rollout,
        "eval_mean": float(np.mean(returns)), "eval_std": float(np.std(returns)),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "in_process_s": time.perf_counter() - T_START,
        "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
