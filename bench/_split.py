"""The rollout/update split every benchmark worker reports, measured from inside each
library: ppokit's collector calls, and SB3's (and sb3-contrib's) rollout phases."""

from __future__ import annotations

import sys
import time


def train_ppokit(tr) -> tuple[float, float]:
    """``tr.train()`` for a ppokit ``Trainer``, timing its collector's ``collect`` calls:
    ``(training seconds, of which rollout seconds)``."""
    collect = tr.collector.collect
    spent = [0.0]

    def timed_collect(n):
        t = time.perf_counter()
        out = collect(n)
        spent[0] += time.perf_counter() - t
        return out

    tr.collector.collect = timed_collect
    t0 = time.perf_counter()
    tr.train()
    return time.perf_counter() - t0, spent[0]


def sb3_rollout_clock(on_step=None):
    """An SB3 callback adding the wall time of every rollout phase to ``.rollout``;
    ``on_step(locals)``, if given, sees each step's ``locals`` (infos, rewards...)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class RolloutClock(BaseCallback):
        def __init__(self):
            super().__init__()
            self.rollout = 0.0
            self._t = 0.0

        def _on_rollout_start(self):
            self._t = time.perf_counter()

        def _on_rollout_end(self):
            self.rollout += time.perf_counter() - self._t

        def _on_step(self):
            if on_step is not None:
                on_step(self.locals)
            return True

    return RolloutClock()


def have(module: str) -> bool:
    """Whether the comparison library ``module`` imports; says how to install it if not."""
    try:
        __import__(module)
    except ImportError:
        name = module.replace("_", "-")
        print(f"{name} is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return False
    return True


def sb3_atari_ppo(env_id: str, n_envs: int, seed: int):
    """SB3's PPO (``CnnPolicy``) on ppokit's Atari wrappers with ppokit's Atari preset:
    the same environments and settings a ppokit run of ``env_id`` gets."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from ppokit.algos.config import ATARI_PRESET
    from ppokit.envs import atari
    from ppokit.envs.vec import check_env_id

    check_env_id(env_id)  # registers ale-py's ids
    env = DummyVecEnv(atari.env_fns(env_id, n_envs, training=True))
    env.seed(seed)
    return _sb3_ppo(env, ATARI_PRESET, seed)


def sb3_minatar_ppo(env_id: str, seed: int):
    """SB3's PPO (``CnnPolicy`` with a small-image extractor: SB3's Nature CNN does not fit
    10x10 maps) on a MinAtar game with ppokit's MinAtar preset: the same convolutions
    (three 3x3, the preset's filters, stride 1), features, linear heads and settings a
    ppokit run of ``env_id`` gets; each env in SB3's Monitor (episode returns)."""
    import gymnasium as gym
    import torch
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from ppokit.algos.config import MINATAR_PRESET as P
    from ppokit.envs.vec import check_env_id

    check_env_id(env_id)  # registers MinAtar's ids

    class SmallImageExtractor(BaseFeaturesExtractor):
        """Boolean HxWxC planes -> three 3x3 convolutions (stride 1), ReLU, a linear
        layer to ``features_dim``, ReLU."""

        def __init__(self, space, features_dim: int):
            super().__init__(space, features_dim)
            h, w, c = space.shape
            layers = []
            for out in P["cnn_channels"]:
                layers += [torch.nn.Conv2d(c, out, 3), torch.nn.ReLU()]
                c, h, w = out, h - 2, w - 2
            self.conv = torch.nn.Sequential(*layers, torch.nn.Flatten())
            self.linear = torch.nn.Sequential(torch.nn.Linear(c * h * w, features_dim),
                                              torch.nn.ReLU())

        def forward(self, obs):
            return self.linear(self.conv(obs.permute(0, 3, 1, 2)))

    env = DummyVecEnv([lambda: Monitor(gym.make(env_id))] * P["n_envs"])
    env.seed(seed)
    kwargs = dict(features_extractor_class=SmallImageExtractor, net_arch=[],
                  features_extractor_kwargs=dict(features_dim=P["features_dim"]),
                  normalize_images=False)
    return _sb3_ppo(env, P, seed, policy_kwargs=kwargs)


def _sb3_ppo(env, preset: dict, seed: int, policy_kwargs: dict | None = None):
    """SB3's PPO with ``CnnPolicy`` and a ppokit preset's settings (linear schedules)."""
    from stable_baselines3 import PPO

    def linear(v0):
        return lambda progress_remaining: progress_remaining * v0

    P = preset
    return PPO("CnnPolicy", env, seed=seed, verbose=0, device="cpu",
               n_steps=P["n_steps"], batch_size=P["batch_size"], n_epochs=P["n_epochs"],
               learning_rate=linear(P["learning_rate"]), clip_range=linear(P["clip_range"]),
               ent_coef=P["ent_coef"], vf_coef=P["vf_coef"], gamma=P["gamma"],
               gae_lambda=P["gae_lambda"], max_grad_norm=P["max_grad_norm"],
               policy_kwargs=policy_kwargs)
