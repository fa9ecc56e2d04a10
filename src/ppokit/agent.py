"""The agent the Python API returns (:class:`Agent`: ``predict``, ``evaluate``, ``learn``,
``save``) and the argument checks ``ppokit.train`` and ``ppokit.load`` share with it
(:mod:`ppokit.api`)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ppokit.cliutil import check_callbacks
from ppokit.errors import UsageError

__all__ = ["Agent", "check_progress", "check_path", "log_line"]


def check_progress(progress: Any) -> Any:
    """``True`` / ``False``, or the text stream that receives the progress (``progress=
    sys.stdout``: a bar when it is a terminal, plain lines otherwise)."""
    if progress is None:
        return sys.stderr.isatty()
    if isinstance(progress, bool) or callable(getattr(progress, "write", None)):
        return progress
    raise UsageError(f"progress: expected True, False, None (a bar when stderr is a "
                     f"terminal) or a text stream such as sys.stdout, got {progress!r}")


def check_path(value: Any, name: str) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise UsageError(f"{name}: expected a directory path, got {value!r}")
    return Path(value)


def log_line(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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
    def predict(self, observation, state=None, episode_start=None, deterministic: bool = True,
                action_masks=None) -> tuple[np.ndarray, Any]:
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

        ``action_masks`` (Discrete and MultiDiscrete actions; :mod:`ppokit.envs.masks`):
        the allowed actions, one mask or ``[n, W]``, booleans or 0/1; only those are
        picked. A ``Dict`` observation with an ``"action_mask"`` key is masked by it
        when ``action_masks`` is not given.
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
        from ppokit.algos.masks import given_masks

        m = given_masks(action_masks, obs, self.observation_space, self.action_space)
        extra = () if m is None else (m,)
        with torch.inference_mode():
            if deterministic:
                a = self.policy.deterministic_action(t, *extra)
            else:
                if self._gen is None:
                    self._gen = torch.Generator().manual_seed(self.cfg.seed + 2_000_000)
                a = self.policy.act(t, self._gen, *extra)[0]
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
                               env=self._env,
                               spaces=(self.observation_space, self.action_space))
        res = {"mean_return": float(np.mean(rets)), "std_return": float(np.std(rets)),
               "episodes": episodes, "returns": rets, "seed": seed,
               "deterministic": deterministic,
               "env_id": self._env if isinstance(self._env, str) else self.cfg.env_id}
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
        show = check_progress(progress)
        if self._trainer is None:
            from ppokit.algos import Trainer

            self._need_env("learn")

            self._trainer = Trainer(self.cfg, self.run_dir, resume=True, env=self._env,
                                    log=log_line)
            self._checkpoint = None
            self._writable = True
            self.policy, self.obs_norm = self._trainer.policy, self._trainer.obs_norm
        self._trainer.extend(more_steps)
        self._run(callbacks, show)
        return self

    def _run(self, callbacks: tuple[Callable, ...], show: Any) -> None:
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
            with GracefulStop(log_line) as stop:
                if show:
                    from ppokit.algos.progress import train_with_progress

                    console = None
                    if show is not True:  # a stream of the caller's (sys.stdout)
                        from rich.console import Console

                        console = Console(file=show)
                    train_with_progress(tr, stop, on_iteration=on_iteration,
                                        console=console)
                else:
                    tr.train(on_iteration, stop=stop)
        except Interrupted as exc:
            where = exc.checkpoint.name if exc.checkpoint else "a checkpoint"
            log_line(f"{exc}; {where} written in {self.run_dir}; continue with agent.learn(...) "
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

        path = check_path(path, "path")
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
