"""The environment trainer's presets: each algorithm's values (``--algo``), the tuned PPO
values of known environments (the RL Baselines3 Zoo's), and the Atari and MinAtar
families'. :func:`ppokit.algos.config.resolve_config` layers them under the user's
values."""

from __future__ import annotations

from typing import Any

__all__ = ["ALGORITHMS", "ENV_PRESETS", "ATARI_PRESET", "ATARI_PREFIX", "MINATAR_PRESET",
           "MINATAR_PREFIX", "IMAGE_PRESET", "SMALL_IMAGE_PRESET", "env_preset",
           "image_preset"]

ALGORITHMS: dict[str, dict[str, Any]] = {
    # PPO with Stable-Baselines3's defaults, 8 envs.
    "ppo": dict(n_steps=256, batch_size=64, n_epochs=10, learning_rate=3e-4, gamma=0.99,
                gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, vf_coef=0.5,
                max_grad_norm=0.5, policy_loss="clip"),
    # A2C: one vanilla-gradient step per 5-step rollout, RMSprop (SB3's defaults).
    "a2c": dict(n_steps=5, batch_size=0, n_epochs=1, learning_rate=7e-4, gamma=0.99,
                gae_lambda=1.0, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
                policy_loss="vanilla", optimizer="rmsprop", normalize_advantage=False),
    # REINFORCE: reward-to-go with a learned value baseline (use_critic=false: none).
    "reinforce": dict(n_steps=512, batch_size=0, n_epochs=1, learning_rate=1e-3, gamma=0.99,
                      advantage_estimator="reward_to_go", policy_loss="vanilla",
                      normalize_advantage=True, advantage_norm_scope="batch",
                      max_grad_norm=None),
    # PPO with the adaptive KL penalty instead of clipping (PPO paper §4).
    "ppo-kl": dict(n_steps=256, batch_size=64, n_epochs=10, learning_rate=3e-4, gamma=0.99,
                   gae_lambda=0.95, policy_loss="kl_penalty", kl_coef=1.0, kl_target=0.01,
                   max_grad_norm=0.5),
}

# Tuned PPO values from the RL Baselines3 Zoo (hyperparams/ppo.yml).
# CleanRL's MuJoCo values (ppo_continuous_action.py): one env of 2,048 steps, minibatches
# of 64, 10 epochs, learning rate 3e-4, gamma 0.99, lambda 0.95, tanh 64x64, log-std 0,
# both normalisers
_CLEANRL_MUJOCO = dict(n_envs=1, total_timesteps=1_000_000, normalize_obs=True,
                       normalize_reward=True, n_steps=2048, batch_size=64, n_epochs=10,
                       learning_rate=3e-4, gamma=0.99, gae_lambda=0.95, clip_range=0.2,
                       ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5, log_std_init=0.0,
                       ortho_init=True, activation="tanh", net_arch=(64, 64))

ENV_PRESETS: dict[str, dict[str, Any]] = {
    "CartPole-v1": dict(n_envs=8, total_timesteps=100_000, n_steps=32, batch_size=256,
                        gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                        learning_rate=1e-3, lr_schedule="linear", clip_range=0.2,
                        clip_schedule="linear"),
    "Acrobot-v1": dict(n_envs=16, total_timesteps=1_000_000, normalize_obs=True,
                       normalize_reward=True, n_steps=256, gae_lambda=0.94, gamma=0.99,
                       n_epochs=4, ent_coef=0.0),
    "LunarLander-v3": dict(n_envs=16, total_timesteps=1_000_000, n_steps=1024, batch_size=64,
                           gae_lambda=0.98, gamma=0.999, n_epochs=4, ent_coef=0.01),
    # (the zoo's Pendulum entry normalises nothing, and its gSDE is left out as above)
    "Pendulum-v1": dict(n_envs=4, total_timesteps=100_000, n_steps=1024, gae_lambda=0.95,
                        gamma=0.9, n_epochs=10, ent_coef=0.0, learning_rate=1e-3,
                        clip_range=0.2),
    "HalfCheetah-v5": dict(n_envs=1, total_timesteps=1_000_000, normalize_obs=True,
                           normalize_reward=True, batch_size=64, n_steps=512, gamma=0.98,
                           learning_rate=2.0633e-05, ent_coef=0.000401762, clip_range=0.1,
                           n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096,
                           log_std_init=-2.0, ortho_init=False, activation="relu",
                           net_arch=(256, 256)),
    "MountainCar-v0": dict(n_envs=16, total_timesteps=1_000_000, normalize_obs=True,
                           normalize_reward=True, n_steps=16, gae_lambda=0.98, gamma=0.99,
                           n_epochs=4, ent_coef=0.0),
    # (the zoo adds gSDE exploration here, which ppokit does not have: its other values;
    # its batch_size 256 over a rollout of 8 steps is one minibatch of 8 in SB3, as here)
    "MountainCarContinuous-v0": dict(n_envs=1, total_timesteps=20_000, normalize_obs=True,
                                     normalize_reward=True, batch_size=8, n_steps=8,
                                     gamma=0.9999, learning_rate=7.77e-05,
                                     ent_coef=0.00429, clip_range=0.1, n_epochs=10,
                                     gae_lambda=0.9, max_grad_norm=5.0, vf_coef=0.19,
                                     log_std_init=-3.29, ortho_init=False),
    "LunarLanderContinuous-v3": dict(n_envs=16, total_timesteps=1_000_000, n_steps=1024,
                                     batch_size=64, gae_lambda=0.98, gamma=0.999, n_epochs=4,
                                     ent_coef=0.01),
    "BipedalWalker-v3": dict(n_envs=32, total_timesteps=5_000_000, normalize_obs=True,
                             normalize_reward=True, n_steps=2048, batch_size=64,
                             gae_lambda=0.95, gamma=0.999, n_epochs=10, ent_coef=0.0,
                             learning_rate=3e-4, clip_range=0.18),
    # MuJoCo: the zoo's entries for the -v4 tasks (the same tasks at -v5), except Hopper:
    # with the zoo's Hopper values every seed learned to stand still (about 1,000 at 1M
    # steps, ppokit's three seeds and SB3's seed 0 alike); CleanRL's MuJoCo values hop
    # (docs/benchmarks.md, "Hopper")
    "Hopper-v5": dict(_CLEANRL_MUJOCO),
    "Walker2d-v5": dict(n_envs=1, total_timesteps=1_000_000, normalize_obs=True,
                        normalize_reward=True, batch_size=32, n_steps=512, gamma=0.99,
                        learning_rate=5.05041e-05, ent_coef=0.000585045, clip_range=0.1,
                        n_epochs=20, gae_lambda=0.95, max_grad_norm=1.0, vf_coef=0.871923),
    # (SB3's defaults, 1 env of 2048 steps, with normalisation; Swimmer from them too)
    "Ant-v5": dict(n_envs=1, total_timesteps=1_000_000, normalize_obs=True,
                   normalize_reward=True, n_steps=2048, batch_size=64, n_epochs=10),
    "Swimmer-v5": dict(n_envs=4, total_timesteps=1_000_000, normalize_obs=True,
                       normalize_reward=True, gamma=0.9999, n_steps=1024, batch_size=256,
                       learning_rate=6e-4, gae_lambda=0.98, n_epochs=10),
    # InvertedPendulum and InvertedDoublePendulum: CleanRL's MuJoCo values too (the
    # references on these rows are CleanRL's and Tianshou's). With the zoo's entries one
    # of three InvertedPendulum seeds ended at 64, and InvertedDoublePendulum's three at
    # 4,268, 4,008 and 6,097 against Tianshou's 9,231 (docs/benchmarks.md, "Inverted
    # pendulums")
    "InvertedPendulum-v5": dict(_CLEANRL_MUJOCO),
    "InvertedDoublePendulum-v5": dict(_CLEANRL_MUJOCO),
    "Reacher-v5": dict(n_envs=1, total_timesteps=1_000_000, normalize_obs=True,
                       normalize_reward=True, batch_size=32, n_steps=512, gamma=0.9,
                       learning_rate=0.000104019, ent_coef=7.52585e-08, clip_range=0.3,
                       n_epochs=5, gae_lambda=1.0, max_grad_norm=0.9, vf_coef=0.950368),
    "Humanoid-v5": dict(n_envs=1, total_timesteps=10_000_000, normalize_obs=True,
                        normalize_reward=True, batch_size=256, n_steps=512, gamma=0.95,
                        learning_rate=3.56987e-05, ent_coef=0.00238306, clip_range=0.3,
                        n_epochs=5, gae_lambda=0.9, max_grad_norm=2.0, vf_coef=0.431892,
                        log_std_init=-2.0, ortho_init=False, activation="relu",
                        net_arch=(256, 256)),
    # The velocity-hidden tasks (ppokit.envs.pomdp) with an LSTM policy. CartPole: the
    # RL-zoo's RecurrentPPO values for CartPoleNoVel-v1 (the PPO CartPole values, a 64-unit
    # LSTM for actor and critic, one 64-unit ReLU layer after it, observations and rewards
    # normalised as the zoo's `normalize: True` does), trained for 200k steps (the zoo:
    # 100k). Without the reward normalisation 2 seeds of 4 ended at 265-284, late in a swing
    # between 150 and 500; with it 4 of 4 held 500 (docs/benchmarks.md, "The LSTM row").
    "ppokit/CartPoleNoVel-v1": dict(n_envs=8, total_timesteps=200_000, n_steps=32,
                                    batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                                    ent_coef=0.0, learning_rate=1e-3, lr_schedule="linear",
                                    clip_range=0.2, clip_schedule="linear",
                                    normalize_obs=True, normalize_reward=True,
                                    recurrent="lstm",
                                    lstm_hidden_size=64, net_arch=(64,), activation="relu",
                                    ortho_init=False),
    # Pendulum-v1's values above with the same LSTM policy.
    "ppokit/PendulumNoVel-v1": dict(n_envs=4, total_timesteps=200_000, normalize_obs=True,
                                    normalize_reward=True, n_steps=1024, batch_size=256,
                                    gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0,
                                    learning_rate=1e-3, clip_range=0.2, recurrent="lstm",
                                    lstm_hidden_size=64, net_arch=(64,), activation="relu",
                                    ortho_init=False),
}

# Every Atari game (an ALE id, "ALE/Name-v5": ppokit.envs.atari preprocesses it) gets the
# PPO settings used for Atari since the PPO paper and in the RL-zoo (hyperparams/ppo.yml,
# "atari"): 8 envs x 128 steps, 4 epochs of minibatches of 256, learning rate 2.5e-4 and
# clip range 0.1 both decayed linearly to 0, entropy bonus 0.01, 10M steps; the Nature CNN
# with the actor's and critic's linear heads directly on its 512 features (net_arch empty,
# as SB3's CnnPolicy).
ATARI_PRESET: dict[str, Any] = dict(
    n_envs=8, total_timesteps=10_000_000, n_steps=128, n_epochs=4, batch_size=256,
    learning_rate=2.5e-4, lr_schedule="linear", clip_range=0.1, clip_schedule="linear",
    ent_coef=0.01, vf_coef=0.5, gamma=0.99, gae_lambda=0.95, max_grad_norm=0.5,
    policy="cnn", net_arch=(), precision="auto")
ATARI_PREFIX = "ALE/"

# MinAtar's games ("MinAtar/Breakout-v1", ...: the minatar extra, ppokit.envs.minatar):
# 10x10 boolean object planes through the small-image CNN (three 3x3 convolutions of 16,
# 32, 32 filters, 256 features; linear heads on them), and PPO's Atari settings otherwise,
# with the larger learning rate and clip range of PPO on MinAtar's small games: 8 envs x
# 128 steps, 4 epochs of minibatches of 256, learning rate 5e-4 and clip range 0.2 decayed
# linearly, entropy bonus 0.01, 1M steps (docs/pixels.md: Breakout's learning curve).
MINATAR_PRESET: dict[str, Any] = dict(
    n_envs=8, total_timesteps=1_000_000, n_steps=128, n_epochs=4, batch_size=256,
    learning_rate=5e-4, lr_schedule="linear", clip_range=0.2, clip_schedule="linear",
    ent_coef=0.01, vf_coef=0.5, gamma=0.99, gae_lambda=0.95, max_grad_norm=0.5,
    policy="cnn", cnn_channels=(16, 32, 32), features_dim=256, net_arch=())
MINATAR_PREFIX = "MinAtar/"


# Any other environment whose observations are images (an image Box, or a Dict holding
# one) gets its family's update settings: the MinAtar preset's for images under 36 pixels
# a side (the small-image CNN, with MinAtar's 16/32/32 filters and 256 features), the
# Atari preset's for larger ones (the Nature CNN) -- but neither's budget, nor its empty
# net_arch (a Dict's features, an image's and a flag's say, need a hidden layer to be
# combined), nor Atari's bf16 trunk; and ReLU hidden layers after the CNN, as the CNN
# itself has (tanh units saturate on the CNN's unbounded features: the image-and-flag
# task stalled at 0.75 with tanh, reached 1.0 with ReLU). Without them a CNN of ~0.9M
# parameters took the generic settings' 320 Adam steps per 2,048 samples: approx_kl
# 0.2-0.5 per update, the return stalling near 0.7 (docs/benchmarks.md: the image family).
_NOT_INHERITED = ("total_timesteps", "policy", "net_arch", "precision")
SMALL_IMAGE_PRESET: dict[str, Any] = {
    **{k: v for k, v in MINATAR_PRESET.items() if k not in _NOT_INHERITED},
    "activation": "relu"}
IMAGE_PRESET: dict[str, Any] = {
    **{k: v for k, v in ATARI_PRESET.items() if k not in _NOT_INHERITED},
    "activation": "relu"}


def image_preset(obs_space: Any) -> dict[str, Any]:
    """The image family's settings for an observation space: :data:`SMALL_IMAGE_PRESET`
    when it is (or a Dict holds) an image smaller than the Nature CNN's 36 pixels a side,
    :data:`IMAGE_PRESET` for a larger one, else none."""
    from gymnasium import spaces

    from ppokit.policies.encoders import MIN_CNN_SIZE, image_layout, is_image_space

    parts = list(obs_space.spaces.values()) if isinstance(obs_space, spaces.Dict) else [
        obs_space]
    images = [s for s in parts if is_image_space(s)]
    if not images:
        return {}
    small = any(min(image_layout(s)[2:4]) < MIN_CNN_SIZE for s in images)
    return SMALL_IMAGE_PRESET if small else IMAGE_PRESET


def env_preset(env_id: str) -> dict[str, Any]:
    """The tuned PPO values of ``env_id``: its entry of :data:`ENV_PRESETS`, else
    :data:`ATARI_PRESET` for an ALE id (``ALE/...``) and :data:`MINATAR_PRESET` for a
    MinAtar game (``MinAtar/...``), else none."""
    if env_id in ENV_PRESETS:
        return ENV_PRESETS[env_id]
    if env_id.startswith(ATARI_PREFIX):
        return ATARI_PRESET
    return MINATAR_PRESET if env_id.startswith(MINATAR_PREFIX) else {}
