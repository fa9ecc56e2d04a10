"""Stable-Baselines3's shape over ppokit: ``PPO`` and ``A2C`` classes whose constructor,
``learn``, ``save``, ``load`` and ``predict`` take what Stable-Baselines3's do, so that a
script written for it runs with ``from ppokit import PPO`` in place of ``from
stable_baselines3 import PPO`` (docs/from_sb3.md maps every habit).

Underneath is :func:`ppokit.train` and its :class:`ppokit.Agent`, reached as ``.agent``.
What differs, on purpose:

* hyperparameters not given keep ppokit's values — the RL zoo's tuned preset for the
  environments that have one (CartPole-v1: 8 environments, ``n_steps`` 32), else ppokit's
  defaults — where Stable-Baselines3 uses its generic ones (``n_steps`` 2048, one
  environment for an instance);
* an environment instance is the first of the run's environments; the others are copies
  (``gymnasium.make(env.spec)`` for a registered one, else deep copies:
  :class:`ppokit.envs.source.InstanceEnvs`);
* the run directory training writes is kept in a temporary directory (removed with the
  model) unless you name one: ``run_dir=``, or ``tensorboard_log=DIR`` (then
  ``DIR/TB_LOG_NAME-<time>``, with the TensorBoard scalars in it); ``verbose=1`` prints
  the progress on stdout, plain lines when it is not a terminal;
* ``save(path)`` writes a run directory (configuration and a verified checkpoint,
  safetensors and JSON: nothing in it is ever executed on ``load``), not a zip file of
  pickles, and never overwrites a directory that holds something;
* :func:`evaluate_policy` plays whole episodes on separate copies of the environment,
  each seeded (the run's seed + 1000000 + k), the same episodes ``ppokit eval`` plays;
* a callback is ppokit's ``(metrics, agent) -> False | "stop" | None``; Stable-Baselines3's
  callback objects are refused with that said.

``MaskablePPO`` is sb3-contrib's name for PPO with invalid-action masks. ppokit's ``PPO``
applies the masks an environment gives by itself (an ``action_masks()`` method, as
sb3-contrib's ``ActionMasker`` provides, ``info["action_mask"]`` or an ``"action_mask"``
observation key: :mod:`ppokit.envs.masks`), so ``MaskablePPO`` is ``PPO`` under that name,
with ``predict(obs, action_masks=...)`` and ``evaluate_policy(..., use_masking=...)``
taking what sb3-contrib's take.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import weakref
from typing import Any

from ppokit.errors import UsageError

__all__ = ["PPO", "A2C", "MaskablePPO", "evaluate_policy"]

# Stable-Baselines3's policy names: ppokit chooses the network from the observation space
POLICY_NAMES = {"MlpPolicy": "mlp", "CnnPolicy": "cnn", "MultiInputPolicy": "multi_input"}
# policy_kwargs keys with a ppokit configuration key of the same meaning
POLICY_KWARGS = {"net_arch": "net_arch", "ortho_init": "ortho_init",
                 "log_std_init": "log_std_init", "activation_fn": "activation"}


def _policy_kwargs(kw: dict | None) -> dict:
    if kw is None:
        return {}
    if not isinstance(kw, dict):
        raise UsageError(f"policy_kwargs: expected a dict, got {type(kw).__name__}")
    out = {}
    for k, v in kw.items():
        if k not in POLICY_KWARGS:
            raise UsageError(f"policy_kwargs: {k!r} has no ppokit equivalent (known: "
                             f"{', '.join(POLICY_KWARGS)}); ppokit's configuration keys are "
                             "listed by ppokit train --help")
        if k == "activation_fn":
            name = getattr(v, "__name__", str(v)).lower()
            if name not in ("tanh", "relu"):
                raise UsageError(f"policy_kwargs: activation_fn {name!r}; ppokit offers "
                                 "torch.nn.Tanh and torch.nn.ReLU")
            v = name
        if k == "net_arch" and isinstance(v, dict):
            pi, vf = v.get("pi"), v.get("vf")
            if pi != vf or set(v) - {"pi", "vf"}:
                raise UsageError("policy_kwargs: net_arch with different pi and vf layers; "
                                 "ppokit's actor and critic share one net_arch (a list)")
            v = pi
        out[POLICY_KWARGS[k]] = v
    return out


class _SB3Shaped:
    algo = "ppo"

    def __init__(self, policy: Any = "MlpPolicy", env: Any = None, *, seed: int | None = None,
                 verbose: int = 0, device: str = "auto", policy_kwargs: dict | None = None,
                 tensorboard_log: str | None = None, run_dir: str | os.PathLike | None = None,
                 **config):
        if env is None or isinstance(env, str) and not env:
            raise UsageError("env: expected a Gymnasium id, an environment instance, a "
                             "factory or a VectorEnv")
        if isinstance(policy, str):
            if policy not in POLICY_NAMES:
                raise UsageError(f"policy: expected one of {', '.join(POLICY_NAMES)} (or a "
                                 f"features-extractor class), got {policy!r}")
            policy = POLICY_NAMES[policy]
        if device not in ("auto", "cpu"):
            raise UsageError(f"device: ppokit trains where torch puts its tensors; expected "
                             f"'auto' or 'cpu', got {device!r}")
        if tensorboard_log is not None and (not isinstance(tensorboard_log, (str, os.PathLike))
                                            or not str(tensorboard_log)):
            raise UsageError(f"tensorboard_log: expected a directory, got {tensorboard_log!r}")
        if tensorboard_log is not None and run_dir is not None:
            raise UsageError("tensorboard_log: the run directory is run_dir; give one of them")
        if not isinstance(verbose, int) or isinstance(verbose, bool):
            raise UsageError(f"verbose: expected 0, 1 or 2, got {verbose!r}")
        self.env = env
        self.verbose = verbose
        self.run_dir = run_dir
        self.tensorboard_log = tensorboard_log
        self.config = {**config, **_policy_kwargs(policy_kwargs), "policy": policy}
        if seed is not None:
            self.config["seed"] = seed
        self.agent = None

    # ------------------------------------------------------------------ training
    def learn(self, total_timesteps: int, callback: Any = None, log_interval: int = 1,
              tb_log_name: str = "", reset_num_timesteps: bool = True,
              progress_bar: bool = False):
        """Train ``total_timesteps`` environment steps (whole rollouts); a second call
        trains that many more in the same run directory. Returns ``self``."""
        from ppokit.api import train

        callbacks = () if callback is None else (
            tuple(callback) if isinstance(callback, (list, tuple)) else (callback,))
        for cb in callbacks:
            if hasattr(cb, "on_step") or hasattr(cb, "_on_step"):
                raise UsageError("callback: a Stable-Baselines3 callback object; ppokit's "
                                 "callbacks are functions (metrics, agent) -> False | 'stop' "
                                 "| None, called after every iteration (docs/from_sb3.md)")
        # verbose: progress on stdout, as Stable-Baselines3's (plain lines in a log)
        progress = True if progress_bar else (sys.stdout if self.verbose else False)
        if self.agent is None:
            run_dir, scratch = self._run_dir(tb_log_name)
            try:
                self.agent = train(self.env, self.algo, total_timesteps, run_dir=run_dir,
                                   callbacks=callbacks, progress=progress, **self.config)
            except BaseException:
                if scratch is not None:
                    shutil.rmtree(scratch, ignore_errors=True)
                raise
            if scratch is not None:  # removed with the agent; save() keeps what you ask
                weakref.finalize(self.agent, shutil.rmtree, scratch, ignore_errors=True)
        else:
            self.agent.learn(total_timesteps, callbacks=callbacks, progress=progress)
        return self

    def _run_dir(self, tb_log_name: str):
        """``(run_dir, scratch)``: the directory the user named (``run_dir``, or a new
        ``TB_LOG_NAME-<time>`` under ``tensorboard_log``), else one in a temporary
        directory (``scratch``, removed with the agent): as Stable-Baselines3, a model
        writes nothing in the working directory unless asked."""
        from ppokit.io import unique_run_dir

        if self.run_dir is not None:
            return self.run_dir, None
        if self.tensorboard_log is not None:
            return unique_run_dir(self.tensorboard_log, tb_log_name or type(self).__name__
                                  ), None
        scratch = tempfile.mkdtemp(prefix="ppokit-")
        return os.path.join(scratch, "run"), scratch

    # ------------------------------------------------------------------ acting
    def predict(self, observation, state=None, episode_start=None,
                deterministic: bool = False, action_masks=None):
        """``(action, state)``, as Stable-Baselines3's (sampled unless ``deterministic``);
        ``action_masks``: the allowed actions, as sb3-contrib's ``MaskablePPO`` takes them
        (:meth:`ppokit.Agent.predict`)."""
        return self._trained("predict").predict(observation, state, episode_start,
                                                deterministic=deterministic,
                                                action_masks=action_masks)

    @property
    def policy(self):
        return self._trained("policy").policy

    @property
    def num_timesteps(self) -> int:
        return 0 if self.agent is None else self.agent.num_timesteps

    def get_env(self):
        return self.env

    def _trained(self, what: str):
        if self.agent is None:
            raise UsageError(f"{what}: the model has not been trained or loaded yet (learn() "
                             f"or {type(self).__name__}.load(path) first)")
        return self.agent

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> None:
        """A run directory at ``path`` (new or empty): what :meth:`load` reads."""
        self._trained("save").save(path)

    @classmethod
    def load(cls, path: str | os.PathLike, env: Any = None, **kwargs):
        """The model saved at ``path`` (a run directory); ``env`` is needed for further
        ``learn`` only when it trained on a factory or an instance."""
        from ppokit.api import load

        if kwargs:
            raise UsageError(f"load: {', '.join(sorted(kwargs))} not taken (ppokit's load "
                             "takes the path and env)")
        agent = load(path, env=env)
        model = cls.__new__(cls)
        model.env, model.verbose, model.run_dir = env, 0, agent.run_dir
        model.tensorboard_log = None
        model.config, model.agent = {}, agent
        if agent.cfg.algo != cls.algo:
            raise UsageError(f"path: {path} holds a {agent.cfg.algo} run; load it with "
                             f"ppokit.load(path)")
        return model

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.agent!r})"


class PPO(_SB3Shaped):
    """PPO with Stable-Baselines3's calling conventions (see the module)."""

    algo = "ppo"


class A2C(_SB3Shaped):
    """A2C with Stable-Baselines3's calling conventions (see the module)."""

    algo = "a2c"


class MaskablePPO(PPO):
    """sb3-contrib's ``MaskablePPO``: PPO over the actions the environment's masks allow
    (see the module)."""


def evaluate_policy(model: Any, env: Any, n_eval_episodes: int = 10,
                    deterministic: bool = True, return_episode_rewards: bool = False,
                    reward_threshold: float | None = None, warn: bool = True,
                    use_masking: bool = True):
    """Stable-Baselines3's ``evaluate_policy``: ``(mean, std)`` of the undiscounted returns
    of ``n_eval_episodes`` whole episodes of ``model`` (a :class:`PPO` / :class:`A2C` or a
    :class:`ppokit.Agent`) on ``env`` (an id, an environment instance, a factory or a
    ``gymnasium.vector.VectorEnv``); ``(returns, lengths)``, one per episode, with
    ``return_episode_rewards``. An instance given is played as it is and not closed; the
    other copies are built as training builds them
    (:class:`ppokit.envs.source.InstanceEnvs`). ``use_masking`` (sb3-contrib's): apply the
    action masks the environment gives; ``reward_threshold``: an error when the mean return
    is below it; ``warn`` is accepted and unused (every episode is counted whole)."""
    import dataclasses

    import numpy as np

    from ppokit.agent import Agent
    from ppokit.algos.evaluate import evaluate_policy as play
    from ppokit.api import env_maker
    from ppokit.cliutil import in_range

    agent = model._trained("evaluate_policy") if isinstance(model, _SB3Shaped) else model
    if not isinstance(agent, Agent):
        raise UsageError(f"model: expected a ppokit PPO/A2C model or a ppokit.Agent, got "
                         f"{type(model).__name__}")
    if not in_range(n_eval_episodes, True, 1, 10**6):
        raise UsageError(f"n_eval_episodes: expected an integer in [1, 1000000], got "
                         f"{n_eval_episodes!r}")
    for name, flag in (("deterministic", deterministic), ("warn", warn),
                       ("return_episode_rewards", return_episode_rewards),
                       ("use_masking", use_masking)):
        if not isinstance(flag, bool):
            raise UsageError(f"{name}: expected True or False, got {flag!r}")
    cfg = agent.cfg
    if isinstance(env, str) and env != cfg.env_id:  # the run's env_kwargs are its own env's
        cfg = dataclasses.replace(cfg, env_kwargs={})
    lengths: list[int] = []
    returns = play(agent.policy, cfg, episodes=n_eval_episodes, seed=cfg.seed + 1_000_000,
                   deterministic=deterministic, obs_norm=agent.obs_norm,
                   env=_evaluation_env(env, env_maker), lengths=lengths,
                   spaces=(agent.observation_space, agent.action_space),
                   use_masking=use_masking)
    mean = float(np.mean(returns))
    if reward_threshold is not None and not mean >= reward_threshold:
        raise AssertionError(f"mean return {mean:.2f} is below the threshold "
                             f"{reward_threshold:.2f}")
    if return_episode_rewards:
        return returns, lengths
    return mean, float(np.std(returns))



def _evaluation_env(env: Any, env_maker) -> Any:
    """What builds the evaluation environments of ``env``; a user's instance is played as
    it is, and left open (:class:`ppokit.envs.source.InstanceEnvs`)."""
    import gymnasium as gym

    if isinstance(env, gym.Env) and not isinstance(env, type):
        from ppokit.envs.source import InstanceEnvs

        return InstanceEnvs(env, keep_open=True)
    return env_maker(env)
