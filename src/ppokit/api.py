"""The Python API: ``ppokit.train``, ``ppokit.load`` and :class:`Agent`.

::

    agent = ppokit.train("CartPole-v1", total_steps=50_000)
    action, _ = agent.predict(obs)                # NumPy in, NumPy out, batched or not
    agent.evaluate(episodes=10)                   # deterministic; writes eval.json
    agent.learn(20_000)                           # the same run, 20k steps more
    agent.save("my_agent")                        # a run directory of its own
    agent = ppokit.load("my_agent")               # read-only; nothing in it is executed

Training writes the run directory the command line writes (``metrics.jsonl``,
checkpoints, ``learning_curve.png``; ``eval.json`` from :meth:`Agent.evaluate`), with the
same guarantees (docs/training.md). An environment is a registered Gymnasium id, Gymnasium's
``module:Id`` (``module`` is imported because you named it), a factory
``() -> gymnasium.Env``, or a ``gymnasium.vector.VectorEnv`` (trained as it is, its
``num_envs`` being the run's; evaluation builds single copies from its ``env_fns`` or
registered spec). A factory or a vector env cannot be recorded in a run directory, so
resuming or evaluating such a run needs it again: ``ppokit.load(path, env=make_env)``;
the run records its observation and action spaces, so ``ppokit.load(path)`` alone gives
an agent that predicts.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ppokit.cliutil import check_callbacks
from ppokit.errors import UsageError

__all__ = ["Agent", "train", "load"]

_RENAMED = {"env_id": "env"}  # keyword -> the argument's name
_ARG_OF = {"total_timesteps": "total_steps", "env_id": "env"}  # config key -> argument


def _env_arg(env: Any) -> tuple[Any, str, str]:
    """``(maker, env_id, env_source)`` of the ``env`` argument."""
    import gymnasium as gym

    if isinstance(env, str):
        from ppokit.envs.source import import_env_module

        return import_env_module(env, "env"), env, "id"
    if isinstance(env, type):
        raise UsageError(f"env: got the class {env.__name__}; pass a factory that builds one "
                         f"(env=lambda: {env.__name__}(...)) or a registered id")
    if isinstance(env, gym.vector.VectorEnv):
        from ppokit.envs.source import GivenVectorEnv

        given = GivenVectorEnv(env)
        return given, given.__qualname__, "factory"
    if isinstance(env, gym.Env):  # Stable-Baselines3's habit: one instance
        from ppokit.envs.source import InstanceEnvs

        maker = InstanceEnvs(env)
        return maker, maker.label, "factory"
    if callable(env):
        name = getattr(env, "__qualname__", None) or type(env).__name__
        label = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._-")[:100] or "factory"
        return env, label, "factory"
    raise UsageError(f"env: expected a Gymnasium id or a factory () -> gymnasium.Env, got "
                     f"{type(env).__name__}")


def _check_progress(progress: Any) -> bool:
    if progress is None:
        return sys.stderr.isatty()
    if not isinstance(progress, bool):
        raise UsageError(f"progress: expected True, False or None (a bar when stderr is a "
                         f"terminal), got {progress!r}")
    return progress


def _check_path(value: Any, name: str) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise UsageError(f"{name}: expected a directory path, got {value!r}")
    return Path(value)


def _resolve(env_id: str, algo: Any, total_steps: Any, env_kwargs: Any, env_source: str,
             config: dict, maker: Any = None):
    from ppokit.algos.config import resolve_config, unknown_key, valid_keys

    if "total_timesteps" in config:  # Stable-Baselines3's name for total_steps
        if total_steps is not None:
            raise UsageError("total_timesteps: the same as total_steps; give one of them")
        total_steps = config.pop("total_timesteps")
    for k in config:
        if k not in valid_keys() or k in _RENAMED:
            if k in _RENAMED:
                raise UsageError(f"{k}: pass it as {_RENAMED[k]}=")
            raise unknown_key(k, "ppokit.train")
    overrides = dict(config)
    for key, value in (("algo", algo), ("total_timesteps", total_steps),
                       ("env_kwargs", env_kwargs)):
        if value is not None:
            overrides[key] = value
    if env_source == "factory":
        if env_kwargs:
            raise UsageError("env_kwargs: apply to a registered id; a factory takes its own "
                             "arguments (env=lambda: MyEnv(size=8))")
        overrides["env_source"] = "factory"
    from ppokit.envs.source import GivenVectorEnv

    if isinstance(maker, GivenVectorEnv):
        n = maker.vec.num_envs
        if "n_envs" in config and config["n_envs"] != n:
            raise UsageError(f"n_envs: {config['n_envs']!r}, but the VectorEnv given has {n} "
                             "environments (leave n_envs out)")
        overrides["n_envs"] = n
    try:
        return resolve_config(env_id=env_id, toml_values={}, overrides=overrides)
    except UsageError as exc:
        name = getattr(exc, "field", None)
        if name in _ARG_OF and str(exc).startswith(name + ":"):
            raise UsageError(f"{_ARG_OF[name]} ({name}):{str(exc)[len(name) + 1:]}") from None
        raise


class Agent:
    """A trained (or loaded) policy with its run directory.

    ``predict`` applies the run's observation normalisation; ``evaluate`` plays whole
    episodes; ``learn`` continues the same run; ``save`` writes a run directory of its own.
    """

    def __init__(self, cfg, run_dir: Path, policy, obs_norm, spaces: tuple, env_maker, *,
                 trainer=None, checkpoint: tuple | None = None, writable: bool = True):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.policy = policy
        self.obs_norm = obs_norm
        self.observation_space, self.action_space = spaces
        self._env = env_maker
        self._trainer = trainer
        self._checkpoint = checkpoint  # (tensors, arrays, state) of a loaded agent
        self._writable = writable
        self._gen = None
        # why there is no env_maker (a loaded run's factory or module:Id not given again)
        self._env_missing: str | None = None

    def __repr__(self) -> str:
        return (f"Agent({self.cfg.algo} on {self.cfg.env_id}, {self.num_timesteps} steps, "
                f"run_dir={str(self.run_dir)!r})")

    # ------------------------------------------------------------------ facts
    @property
    def num_timesteps(self) -> int:
        """Environment steps trained so far."""
        if self._trainer is not None:
            return self._trainer.global_step
        return int(self._checkpoint[2]["global_step"])

    @property
    def mean_training_return(self) -> float | None:
        """Mean raw return of the last 100 finished training episodes (None before any)."""
        if self._trainer is not None:
            return self._trainer.mean_recent_return
        recent = self._checkpoint[2].get("recent_returns") or []
        return float(np.mean(recent)) if recent else None

    @property
    def stopped_early(self) -> bool:
        """Whether the last training call ended because a callback asked it to."""
        return bool(self._trainer is not None and self._trainer.stopped_early)

    # ------------------------------------------------------------------ acting
    def predict(self, observation, state=None, episode_start=None, deterministic: bool = True
                ) -> tuple[np.ndarray, Any]:
        """``(action, state)`` for one observation or a batch ``[n, *obs_shape]`` (NumPy).

        The run's observation normalisation is applied (its statistics are not updated);
        the action is one of the action space (``action_space.contains`` accepts it: Box
        actions clipped to the bounds, the ``start`` of a Discrete or MultiDiscrete space
        added, the space's shape and dtype). ``deterministic=False`` samples from the
        policy.

        A recurrent policy (``recurrent = "lstm"``) carries its memory in ``state``: pass
        back the state it returned, ``None`` at the start (the zero state), and
        ``episode_start`` (a bool, or ``[n]`` bools for a batch) set where an observation
        begins a new episode, so that its row starts from the zero state again. The state
        is the actor's ``(h, c)``, NumPy arrays ``[n_lstm_layers, n, lstm_hidden_size]``.
        For the other policies ``state`` is returned as it was given. A ``Dict``
        observation is a dict of arrays (one observation, or ``[n, ...]`` per key).
        """
        import torch
        from gymnasium import spaces

        from ppokit.policies.actions import env_actions

        if not isinstance(deterministic, bool):
            raise UsageError(f"deterministic: expected True or False, got {deterministic!r}")
        shape = tuple(self.observation_space.shape or ())
        discrete_obs = isinstance(self.observation_space, spaces.Discrete)
        dict_space = getattr(self.observation_space, "dict_space", None)
        if dict_space is not None:  # a Dict observation: stored (and read) flat
            observation = _flatten_dict_obs(dict_space, observation)
        try:
            obs = np.asarray(observation, dtype=np.int64 if discrete_obs else np.float32)
        except (TypeError, ValueError):
            raise UsageError(f"observation: expected a NumPy array of shape {shape} or "
                             f"(n, *{shape}), got {type(observation).__name__}") from None
        if obs.shape == shape:
            batched = False
            obs = obs[None]
        elif obs.ndim == len(shape) + 1 and obs.shape[1:] == shape and obs.shape[0] >= 1:
            batched = True
        else:
            raise UsageError(f"observation: expected shape {shape} or (n, *{shape}), got "
                             f"{obs.shape}")
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        t = torch.as_tensor(obs)
        if getattr(self.policy, "recurrent", False):
            return self._predict_recurrent(t, state, episode_start, deterministic, batched)
        with torch.inference_mode():
            if deterministic:
                a = self.policy.deterministic_action(t)
            else:
                if self._gen is None:
                    self._gen = torch.Generator().manual_seed(self.cfg.seed + 2_000_000)
                a = self.policy.act(t, self._gen)[0]
        a = env_actions(a.numpy(), self.action_space)
        return (a if batched else _one(a, self.action_space)), state

    def _predict_recurrent(self, t, state, episode_start, deterministic: bool, batched: bool):
        import torch

        from ppokit.policies.actions import env_actions

        pol = self.policy
        n = t.shape[0]
        want = (pol.n_lstm_layers, n, pol.lstm_hidden_size)
        if state is None:
            st = pol.actor_state(pol.initial_state(n))
        else:
            ok = isinstance(state, (tuple, list)) and len(state) == 2
            st = tuple(np.asarray(s, np.float32) for s in state) if ok else ()
            if not ok or any(s.shape != want for s in st):
                raise UsageError(f"state: expected None or the (h, c) pair predict returned, "
                                 f"two arrays of shape {want}")
            st = tuple(torch.from_numpy(s.copy()) for s in st)
        if episode_start is None:
            start = np.zeros(n, bool)
        else:
            start = np.asarray(episode_start)
            if start.dtype != bool or start.size != n or start.ndim > 1:
                raise UsageError(f"episode_start: expected {n} bool(s), one per observation "
                                 f"(True where it begins an episode), got "
                                 f"{str(episode_start)[:60]}")
            start = start.reshape(n)
        gen = None
        if not deterministic:
            if self._gen is None:
                self._gen = torch.Generator().manual_seed(self.cfg.seed + 2_000_000)
            gen = self._gen
        with torch.inference_mode():
            a, st = pol.predict(t, st, start, deterministic, gen)
            a = env_actions(a.numpy(), self.action_space)
            new_state = tuple(s.numpy().copy() for s in st)
        return (a if batched else _one(a, self.action_space)), new_state

    def evaluate(self, episodes: int = 10, *, deterministic: bool = True,
                 seed: int | None = None, video: str | os.PathLike | None = None) -> dict:
        """Play ``episodes`` whole episodes (seeds ``seed + k``; default: the run's seed +
        1000000, as ``ppokit eval``) and return ``mean_return``, ``std_return``,
        ``returns``, ... A trained agent also writes them to its run directory's
        ``eval.json`` (``eval_stochastic.json`` with ``deterministic=False``); a loaded
        agent writes nothing. ``video``: a directory (new, empty or a previous video
        output) that also receives an MP4 of each episode, the same seeds and policy, and
        ``video.json``; the result then has a ``"video"`` entry with the file names (needs
        ``pip install 'ppokit[video]'``)."""
        import json

        from ppokit.algos.evaluate import evaluate_policy
        from ppokit.cliutil import in_range

        if not in_range(episodes, True, 1, 10**6):
            raise UsageError(f"episodes: expected an integer in [1, 1000000], got {episodes!r}")
        if seed is not None and not in_range(seed, True, 0, 2**32 - 1):
            raise UsageError(f"seed: expected an integer in [0, {2**32 - 1}], got {seed!r}")
        if not isinstance(deterministic, bool):
            raise UsageError(f"deterministic: expected True or False, got {deterministic!r}")
        if video is not None:
            from ppokit.algos.video import check_video_dir, require_video_extra

            check_video_dir(video, "video")
            require_video_extra("video")
        self._need_env("evaluate")
        seed = self.cfg.seed + 1_000_000 if seed is None else seed
        rets = evaluate_policy(self.policy, self.cfg, episodes=episodes, seed=seed,
                               deterministic=deterministic, obs_norm=self.obs_norm,
                               env=self._env)
        res = {"mean_return": float(np.mean(rets)), "std_return": float(np.std(rets)),
               "episodes": episodes, "returns": rets, "seed": seed,
               "deterministic": deterministic, "env_id": self.cfg.env_id}
        if self._writable:
            from ppokit.io import RunLock
            from ppokit.io.atomic import atomic_write_text

            name = "eval.json" if deterministic else "eval_stochastic.json"
            with RunLock(self.run_dir, "eval"):
                atomic_write_text(self.run_dir / name, json.dumps(res, indent=2) + "\n")
        if video is not None:
            from ppokit.algos.video import record_episodes

            res["video"] = record_episodes(self.policy, self.cfg, self._env, video,
                                           episodes=episodes, seed=seed,
                                           deterministic=deterministic,
                                           obs_norm=self.obs_norm, where="video")
        return res

    def _need_env(self, what: str) -> None:
        """A loaded agent without its run's environment: ``what`` needs it (one line
        saying what to pass to ``ppokit.load``)."""
        if self._env is None:
            why = self._env_missing or "no environment was given"
            raise UsageError(f"{what}: needs the run's environment, which ppokit.load was "
                             f"not given ({why.split(': ', 1)[-1]})")

    def log(self, name: str, value: float) -> None:
        """Log a scalar of your own from a callback: it joins the iteration's metrics
        record (``metrics.jsonl``, TensorBoard, W&B) under ``name``, which may not be one of
        ppokit's own metric names."""
        if self._trainer is None:
            raise UsageError("log: scalars are logged during training, from a callback")
        self._trainer.record(name, value)

    # ------------------------------------------------------------------ training
    def learn(self, more_steps: int, *, callbacks: Iterable[Callable] = (),
              progress: bool | None = None) -> Agent:
        """Train the same run ``more_steps`` environment steps more (whole rollouts), into
        the same run directory; returns the agent. A loaded agent resumes its run directory
        from the newest intact checkpoint first."""
        from ppokit.cliutil import in_range

        if not in_range(more_steps, True, 1, 10**12):
            raise UsageError(f"more_steps: expected an integer in [1, 10**12], got "
                             f"{more_steps!r}")
        callbacks = check_callbacks(callbacks)
        show = _check_progress(progress)
        if self._trainer is None:
            from ppokit.algos import Trainer

            self._need_env("learn")

            self._trainer = Trainer(self.cfg, self.run_dir, resume=True, env=self._env,
                                    log=_log)
            self._checkpoint = None
            self._writable = True
            self.policy, self.obs_norm = self._trainer.policy, self._trainer.obs_norm
        self._trainer.extend(more_steps)
        self._run(callbacks, show)
        return self

    def _run(self, callbacks: tuple[Callable, ...], show: bool) -> None:
        tr = self._trainer

        def on_iteration(rec: dict):
            stop = False
            for cb in callbacks:
                r = cb(rec, self)
                if r is False or (isinstance(r, str) and r == "stop"):
                    stop = True
            return "stop" if stop else None

        from ppokit.io import GracefulStop, Interrupted

        try:
            # Ctrl-C (or SIGTERM) ends training at the iteration boundary with a checkpoint,
            # as on the command line; then KeyboardInterrupt (SystemExit for SIGTERM)
            # reaches the caller and the agent is still usable (learn continues it)
            with GracefulStop(_log) as stop:
                if show:
                    from ppokit.algos.progress import train_with_progress

                    train_with_progress(tr, stop, on_iteration=on_iteration)
                else:
                    tr.train(on_iteration, stop=stop)
        except Interrupted as exc:
            where = exc.checkpoint.name if exc.checkpoint else "a checkpoint"
            _log(f"{exc}; {where} written in {self.run_dir}; continue with agent.learn(...) "
                 f"or ppokit.train(env, run_dir={str(self.run_dir)!r}, resume=True)")
            if exc.signum == signal.SIGINT:
                raise KeyboardInterrupt from None
            raise SystemExit(exc.exit_code) from None
        self.cfg = tr.cfg
        from ppokit.io.plots import plot_learning_curve

        plot_learning_curve(self.run_dir)

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> Path:
        """Write this agent as a run directory of its own at ``path`` (a new directory, or
        an empty one): its configuration and a verified checkpoint of the whole state, so
        ``ppokit.load(path)``, ``ppokit eval path`` and ``ppokit train --resume path`` work
        on it. Saving to the agent's own run directory writes a checkpoint there."""
        import json

        from ppokit.io import RunDir, save_checkpoint
        from ppokit.io.atomic import atomic_write_text

        path = _check_path(path, "path")
        if path.exists() and path.resolve() == self.run_dir.resolve():
            if self._trainer is None:
                raise UsageError("path: a loaded agent's run directory already holds this "
                                 "checkpoint")
            self._trainer.rundir.reacquire()
            try:
                return self._trainer.save()
            finally:
                self._trainer.rundir.close()
        rd = RunDir(path, new=True, purpose="save")
        try:
            atomic_write_text(path / "config.json", json.dumps(self.cfg.to_dict(), indent=2)
                              + "\n")
            if self._trainer is not None:
                ckpt = self._trainer.save(path / "checkpoints")
            else:
                tensors, arrays, state = self._checkpoint
                ckpt = save_checkpoint(path / "checkpoints", int(state["iteration"]),
                                       tensors=tensors, arrays=arrays, state=state,
                                       keep=self.cfg.keep_checkpoints)
        except BaseException:
            rd.abort()
            raise
        rd.started()
        rd.close()
        return ckpt

    def close(self) -> None:
        """Close the training environments (a later ``learn`` cannot continue then)."""
        if self._trainer is not None:
            self._trainer.close()
            self._trainer = None
            from ppokit.algos.runs import load_run_checkpoint

            _, tensors, arrays, st = load_run_checkpoint(self.run_dir)
            self._checkpoint = (tensors, arrays, st)

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _one(actions: np.ndarray, space):
    """The one action of a batch of one: a NumPy integer for a Discrete space, else an
    array of the space's shape (0-d for a scalar Box, which ``contains`` expects)."""
    from gymnasium import spaces

    return actions[0] if isinstance(space, spaces.Discrete) else actions[0, ...]


def _flatten_dict_obs(space, observation) -> np.ndarray:
    """One Dict observation, or a batch (every key's array with a leading ``n``), as the
    flat vectors the policy reads (:class:`ppokit.envs.vec.FlattenDictObs`)."""
    from gymnasium import spaces

    keys = sorted(space.spaces)
    if not isinstance(observation, dict) or set(observation) != set(keys):
        raise UsageError(f"observation: expected a dict with the keys {keys}, got "
                         f"{type(observation).__name__}")
    sizes = set()
    for k in keys:
        v, want = np.asarray(observation[k]), tuple(space.spaces[k].shape or ())
        if v.shape == want:
            sizes.add(None)
        elif v.shape[1:] == want and v.ndim == len(want) + 1:
            sizes.add(v.shape[0])
        else:
            raise UsageError(f"observation: key {k!r} has shape {v.shape}, expected {want} "
                             f"or (n, *{want})")
    if len(sizes) != 1:
        raise UsageError("observation: the keys disagree on whether this is one observation "
                         "or a batch")
    n = sizes.pop()
    try:
        if n is None:
            return spaces.flatten(space, observation).astype(np.float32)
        return np.stack([spaces.flatten(space, {k: np.asarray(observation[k])[i]
                                               for k in keys})
                         for i in range(n)]).astype(np.float32)
    except (ValueError, TypeError, IndexError, AssertionError):
        raise UsageError(f"observation: values outside the observation space {space}"
                         ) from None


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def train(env, algo: str = "ppo", total_steps: int | None = None,
          run_dir: str | os.PathLike | None = None, callbacks: Iterable[Callable] = (),
          env_kwargs: dict | None = None, progress: bool | None = None, *,
          resume: bool = False, **config) -> Agent:
    """Train an agent and return it.

    ``env``: a registered Gymnasium id, ``"module:Id"`` (``module`` is imported first, the
    current directory included), a factory ``() -> gymnasium.Env``, or a
    ``gymnasium.vector.VectorEnv`` (trained as it is; ``n_envs`` is its ``num_envs``;
    ppokit closes it with the agent), or an environment instance (Stable-Baselines3's
    habit: it is the first environment, the others are ``gymnasium.make(env.spec)`` of a
    registered one or deep copies, :class:`ppokit.envs.source.InstanceEnvs`). A class is
    refused: pass ``lambda: MyEnv()``. ``algo``: ppo, a2c, reinforce or
    ppo-kl. ``total_steps``: environment steps (default: the preset's; Stable-Baselines3's
    ``total_timesteps=`` is the same). ``run_dir``: where
    the run is written (default: a new ``runs/ENV-ALGO-sSEED-TIME``); an existing run is
    continued only with ``resume=True`` (then ``env`` must be the run's: its id, or its
    factory again, and no configuration may be given). ``callbacks``: functions
    ``(metrics, agent)`` called after every iteration; returning ``False`` or ``"stop"``
    ends training with a checkpoint. ``env_kwargs``: keyword arguments of a registered
    environment. ``progress``: a progress bar (default: when stderr is a terminal).
    ``**config``: any configuration key (``ppokit train --help``), e.g. ``seed=1``,
    ``n_envs=4``, ``learning_rate=1e-3``.
    """
    from ppokit.algos import Trainer
    from ppokit.io import unique_run_dir

    maker, env_id, source = _env_arg(env)
    callbacks = check_callbacks(callbacks)
    show = _check_progress(progress)
    if not isinstance(resume, bool):
        raise UsageError(f"resume: expected True or False, got {resume!r}")
    fresh = False
    if resume:
        from ppokit.algos import load_run_config
        from ppokit.envs.source import env_for_run

        if run_dir is None:
            raise UsageError("resume: needs run_dir, the run directory to continue")
        if config or total_steps is not None or env_kwargs is not None or algo != "ppo":
            raise UsageError("resume: continues a run with its saved configuration; "
                             "algo/total_steps/env_kwargs/configuration keys cannot be given")
        run_dir = _check_path(run_dir, "run_dir")
        if not run_dir.is_dir():
            raise UsageError(f"run_dir: no such run directory {str(run_dir)!r}")
        cfg = load_run_config(run_dir)
        maker = env_for_run(cfg.env_id, cfg.env_source,
                            maker if source == "factory" else env_id, "env")
    else:
        if not isinstance(algo, str):
            raise UsageError(f"algo: expected a string, got {algo!r}")
        if "policy" in config and not isinstance(config["policy"], str):
            config["policy"] = _extractor_name(config["policy"])
        cfg = _resolve(env_id, algo, total_steps, env_kwargs, source, config, maker)
        if run_dir is None:
            run_dir = unique_run_dir("runs", f"{cfg.env_id}-{cfg.algo}-s{cfg.seed}")
            fresh = True
        else:
            run_dir = _check_path(run_dir, "run_dir")
    try:
        trainer = Trainer(cfg, run_dir, resume=resume, log=_log, fresh=fresh, env=maker)
    except UsageError as exc:
        if "already holds a run" not in str(exc):
            raise
        raise UsageError(f"run_dir: {run_dir} already holds a run; continue it with "
                         "ppokit.train(env, run_dir=..., resume=True) or choose another "
                         "directory") from None
    agent = Agent(cfg, trainer.run_dir, trainer.policy, trainer.obs_norm,
                  (trainer.env.single_observation_space, trainer.env.single_action_space),
                  maker, trainer=trainer)
    try:
        agent._run(callbacks, show)
    except BaseException:
        trainer.close()
        raise
    return agent


def _extractor_name(cls) -> str:
    """``policy=SomeExtractor`` (a class or function, as Stable-Baselines3's
    ``features_extractor_class``): registered under ``module.QualName`` (once), which is
    the run's configuration value; loading the run later needs it registered again."""
    from ppokit.policies.encoders import FEATURES_EXTRACTORS, register_features_extractor

    if not callable(cls):
        raise UsageError(f"policy: expected auto, mlp, cnn, multi_input, a registered "
                         f"features extractor's name or an extractor class, got {cls!r}")
    name = f"{getattr(cls, '__module__', 'user')}.{getattr(cls, '__qualname__', 'extractor')}"
    if name in FEATURES_EXTRACTORS:
        if FEATURES_EXTRACTORS.get(name) is not cls:
            raise UsageError(f"policy: another features extractor is registered as {name!r}; "
                             f"register yours under its own name "
                             f"(ppokit.register_features_extractor) and pass the name")
    else:
        register_features_extractor(name, cls)
    return name


def load(path: str | os.PathLike, env=None, *, best: bool = False) -> Agent:
    """The agent of a run directory's newest intact checkpoint: its policy and observation
    normaliser, read-only (safetensors and JSON only; nothing in the directory is imported
    or executed). The checkpoint records the observation and action spaces, so ``predict``
    needs no environment. ``env`` is what builds the run's environments for ``evaluate``
    and ``learn``: a registered id needs nothing; a run trained on a factory needs it
    again (``env=make_env``), and one trained on a ``"module:Id"`` needs the id named
    again (``env="module:Id"``: imported because you name it here). Without it the agent
    predicts, and ``evaluate`` / ``learn`` say what to pass. ``best=True``: the best
    policy the evaluations during training kept (``best/``); its ``learn`` continues the
    run itself, from the newest checkpoint."""
    from ppokit.algos.evaluate import policy_from_checkpoint
    from ppokit.algos.runs import load_run_checkpoint
    from ppokit.envs.source import env_for_run
    from ppokit.io.spaces import SpaceDataError, spaces_from_state

    path = _check_path(path, "path")
    if not path.is_dir():
        raise UsageError(f"path: no such run directory {str(path)!r}")
    if env is not None and not isinstance(env, str):
        env = _env_arg(env)[0]  # refuses a class with the same message
    if not isinstance(best, bool):
        raise UsageError(f"best: expected True or False, got {best!r}")
    cfg, tensors, arrays, st = load_run_checkpoint(path, best=best)
    try:
        recorded = spaces_from_state(st)
    except SpaceDataError as exc:
        raise UsageError(f"run dir: {path}'s checkpoint records unusable spaces ({exc})"
                         ) from None
    maker, missing = None, None
    try:
        maker = env_for_run(cfg.env_id, cfg.env_source, env, "env")
    except UsageError as exc:
        if env is not None or recorded is None:  # the spaces come from the env: needed
            raise
        missing = str(exc)  # said when evaluate or learn needs the environment
    policy, norm, spaces = policy_from_checkpoint(cfg, tensors, arrays, maker, recorded)
    agent = Agent(cfg, path, policy, norm, spaces, maker, checkpoint=(tensors, arrays, st),
                  writable=False)
    agent._env_missing = missing
    return agent
