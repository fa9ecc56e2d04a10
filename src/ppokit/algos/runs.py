"""A run directory read back: its newest intact checkpoint, the configuration it was
trained with, the policy rebuilt from it and what builds its environments (the trainer
writes them; ``ppokit.load``, ``ppokit eval``, ``--resume`` and ``--best`` read them
through :func:`open_run`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppokit.errors import UsageError
from ppokit.io.checkpoint import find_checkpoint, load_checkpoint, no_checkpoint_message
from ppokit.plugins import reading_run

from .config import TrainConfig, saved_config

__all__ = ["BEST_DIR", "SavedRun", "open_run", "policy_from_checkpoint",
           "load_run_checkpoint", "load_run_config"]

BEST_DIR = "best"  # the best policy of the evaluations during training (a checkpoint root)


def load_run_checkpoint(run_dir: str | Path, log: Callable[[str], None] | None = None,
                        *, best: bool = False) -> tuple[TrainConfig, dict, dict, dict]:
    """``(config, tensors, arrays, state)`` of a run's newest intact checkpoint (``best``:
    of the best policy the evaluations during training kept, ``best/``). The config is the
    checkpoint's own (verified with it), never ``config.json``, which is a copy for people
    to read."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"RUN_DIR: no such run directory {str(run_dir)!r}")
    if best and not (run_dir / BEST_DIR).is_dir():
        raise UsageError(f"--best: {run_dir} has no best/ policy (it is kept when the run "
                         "evaluates during training: eval_every > 0)")
    ckpt, damaged = find_checkpoint(run_dir / (BEST_DIR if best else "checkpoints"), log=log)
    if ckpt is None:
        raise UsageError(no_checkpoint_message(run_dir, damaged))
    tensors, arrays, st = load_checkpoint(ckpt)
    if not isinstance(st.get("config"), dict):
        raise UsageError(f"run dir: checkpoint {ckpt} holds no configuration")
    with reading_run():  # a loss or estimator of the user's is needed to train, not to read
        cfg = saved_config(st["config"])
    return cfg, tensors, arrays, st


def load_run_config(run_dir: str | Path) -> TrainConfig:
    """The configuration a run's newest intact checkpoint was trained with."""
    return load_run_checkpoint(run_dir)[0]


@dataclass
class SavedRun:
    """A run directory opened by :func:`open_run`: its checkpoint (``tensors``, ``arrays``,
    ``state``), the configuration in it, the observation and action spaces it recorded
    (``None`` for a checkpoint written before they were), and ``env``, what builds the
    run's environments (an id or a factory), or ``None`` with ``env_missing`` saying what
    to pass when the run cannot name its environment itself."""

    run_dir: Path
    cfg: TrainConfig
    tensors: dict
    arrays: dict
    state: dict
    spaces: tuple | None
    env: str | Callable[[], Any] | None
    env_missing: str | None = None

    def policy(self):
        """``(policy, obs_normalizer | None, (observation_space, action_space))`` of the
        checkpoint (:func:`policy_from_checkpoint`)."""
        if self.spaces is None and self.env is None:
            raise UsageError(self.env_missing or "env: the run's environment is needed")
        from ppokit.io.spaces import SpaceDataError, state_space_from_state

        try:
            state_space = state_space_from_state(self.state)
        except SpaceDataError as exc:
            raise UsageError(f"run dir: {self.run_dir}'s checkpoint records an unusable "
                             f"state space ({exc})") from None
        return policy_from_checkpoint(self.cfg, self.tensors, self.arrays, self.env,
                                      self.spaces, state_space)


def open_run(run_dir: str | Path, env: str | Callable[[], Any] | None = None,
             where: str = "--env", *, best: bool = False, need_env: bool = True,
             log: Callable[[str], None] | None = None) -> SavedRun:
    """The run directory ``run_dir`` read back (its ``best/`` policy with ``best``):
    configuration, checkpoint and the recipe of its environments. ``env`` is what the user
    gave again (an id or a factory; it wins over what the run records: see
    :func:`ppokit.envs.source.env_for_run`); ``where`` names that argument in messages.
    Without ``need_env`` a run whose environment must be given again opens anyway
    (``env=None``, ``env_missing`` says why) when its checkpoint recorded its spaces:
    its policy predicts, and evaluating or training says what to pass."""
    from ppokit.envs.source import env_for_run
    from ppokit.io.spaces import SpaceDataError, spaces_from_state

    run_dir = Path(run_dir)
    cfg, tensors, arrays, st = load_run_checkpoint(run_dir, log, best=best)
    try:
        spaces = spaces_from_state(st)
    except SpaceDataError as exc:
        raise UsageError(f"run dir: {run_dir}'s checkpoint records unusable spaces ({exc})"
                         ) from None
    run = SavedRun(run_dir, cfg, tensors, arrays, st, spaces, None)
    try:
        run.env = env_for_run(cfg.env_id, cfg.env_source, env, where)
    except UsageError as exc:
        if need_env or env is not None or spaces is None:
            raise
        run.env_missing = str(exc)
    return run


def policy_from_checkpoint(cfg: TrainConfig, tensors: dict, arrays: dict, maker,
                           spaces: tuple | None = None, state_space=None):
    """``(policy, obs_normalizer | None, (observation_space, action_space))`` rebuilt from a
    checkpoint's tensors and arrays, for ``spaces`` (the ones the checkpoint recorded,
    :func:`ppokit.io.spaces.spaces_from_state`) or, when ``None`` (a checkpoint written
    before spaces were recorded), those of one env ``maker`` builds. ``state_space``: the
    global state a centralised critic reads (``centralised_critic``; recorded with the
    spaces)."""
    from ppokit.envs import ObsNormalizer, make_vec
    from ppokit.policies import policy_for_config

    if spaces is None:
        env = make_vec(maker, 1, vectorization="sync", env_kwargs=cfg.env_kwargs)
        spaces = env.single_observation_space, env.single_action_space
        env.close()
    obs_space, act_space = spaces
    if cfg.centralised_critic and state_space is None:
        raise UsageError("run dir: the run's critic is centralised (centralised_critic), "
                         "but its checkpoint records no global state space")
    policy = policy_for_config(cfg, obs_space, act_space, state_space)
    try:
        policy.load_state_dict(tensors["model"])
        norm = None
        if cfg.normalize_obs:
            norm = ObsNormalizer(tuple(arrays["obs_norm"]["mean"].shape), cfg.clip_obs)
            norm.load_state_dict(arrays["obs_norm"])
    except (KeyError, RuntimeError, ValueError) as exc:
        raise UsageError(f"run dir: the checkpoint does not fit {cfg.env_id}'s spaces "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
    policy.eval()
    return policy, norm, (obs_space, act_space)
