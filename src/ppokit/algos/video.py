"""Video of evaluation episodes (``ppokit eval --video DIR``, ``Agent.evaluate(video=DIR)``).

The recorded episodes are the evaluation's episodes: one plain (non-vector) environment made
with ``render_mode="rgb_array"`` and wrapped in Gymnasium's ``RecordVideo``, reset with the
evaluation's seeds ``seed + k`` and driven by the same policy and observation normalisation,
so with deterministic actions their returns equal :func:`ppokit.algos.evaluate.evaluate_policy`'s.
(Sampled actions are drawn from their own generator, so ``--stochastic`` videos are episodes of
the same policy but not the same samples.)

``DIR`` is an output path chosen by the user: it is created if missing, reused only when it
holds nothing but a previous video output (``eval-episode-K.mp4``, ``video.json``), and never
written through a symbolic link. Files are encoded into a fresh private directory inside it and
then renamed into place; ``video.json`` records the returns, seeds and file names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces

from ppokit.envs.masks import env_mask, mask_kind
from ppokit.errors import UsageError, extra_hint

from .acting import new_memory, policy_actions

__all__ = ["NAME_PREFIX", "check_video_dir", "require_video_extra", "record_episodes"]

NAME_PREFIX = "eval"
_OUTPUT = re.compile(r"(eval-episode-\d+\.mp4|video\.json|\.recording-[A-Za-z0-9_]+)\Z")
_EXTRA = extra_hint("video")


def check_video_dir(value, where: str = "--video") -> Path:
    """``value`` as a video output directory, or a one-line :class:`UsageError` naming
    ``where``: an existing file, a link, or a non-empty directory that is not a previous
    video output is refused, as is a missing parent."""
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip() or "\0" in str(value):
        raise UsageError(f"{where}: expected a directory path, got {value!r}")
    path = Path(value)
    if path.is_symlink():
        raise UsageError(f"{where}: {str(path)!r} is a symbolic link; give a directory path")
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{where}: {str(path)!r} exists and is not a directory")
        try:
            names = os.listdir(path)
        except OSError as exc:
            raise UsageError(f"{where}: cannot read {str(path)!r} ({exc.strerror})") from None
        foreign = sorted(n for n in names if not _OUTPUT.match(n))
        if foreign:
            raise UsageError(f"{where}: {str(path)!r} is not empty and not a previous video "
                             f"output (it holds {foreign[0]!r}); give a new or empty directory")
    elif not path.parent.is_dir():
        raise UsageError(f"{where}: no such directory {str(path.parent)!r}")
    return path


def require_video_extra(where: str = "--video") -> None:
    """A one-line :class:`UsageError` naming the ``video`` extra if its encoder is missing."""
    try:
        import moviepy  # noqa: F401
    except ImportError:
        raise UsageError(f"{where}: writing videos needs the video extra: {_EXTRA} "
                         "(moviepy is not installed)") from None


def _make_env(maker, env_kwargs: dict, where: str):
    import gymnasium as gym

    if callable(maker):
        env = maker()
        if getattr(env, "render_mode", None) != "rgb_array":
            env.close()
            raise UsageError(f"{where}: the environment factory's env has render_mode "
                             f"{getattr(env, 'render_mode', None)!r}; a video needs one made "
                             "with render_mode='rgb_array'")
        return env
    from ppokit.envs import atari
    from ppokit.envs.source import gym_id
    from ppokit.envs.vec import check_env_id

    try:
        if atari.is_atari_spec(check_env_id(maker)):  # the evaluation's preprocessing
            return atari.make_env(gym_id(maker), training=False, render_mode="rgb_array",
                                  **dict(env_kwargs or {}))
        return gym.make(gym_id(maker), render_mode="rgb_array", **dict(env_kwargs or {}))
    except gym.error.DependencyNotInstalled as exc:
        raise UsageError(f"{where}: rendering {maker} needs a package that is missing: "
                         f"{_EXTRA} ({str(exc).splitlines()[0]})") from None
    except (gym.error.Error, TypeError, ValueError) as exc:
        raise UsageError(f"{where}: cannot build {maker!r} with render_mode='rgb_array' "
                         f"({str(exc).splitlines()[0]})") from None


def record_episodes(policy, cfg, maker, out: str | os.PathLike, *, episodes: int, seed: int,
                    deterministic: bool = True, obs_norm=None, where: str = "--video") -> dict:
    """Play ``episodes`` episodes (seeds ``seed + k``) in one rendering env wrapped in
    ``RecordVideo`` and move the MP4s into ``out`` (checked by :func:`check_video_dir`).
    Returns ``{"dir", "files", "returns", "seeds", "deterministic"}``, also written to
    ``out/video.json``."""
    import gymnasium as gym
    from gymnasium.wrappers import RecordVideo

    from ppokit.io.atomic import atomic_write_text

    out = check_video_dir(out, where)
    require_video_extra(where)
    created = not out.exists()
    if created:
        os.mkdir(out)  # a link planted since the check makes this fail rather than follow it
    work = Path(tempfile.mkdtemp(prefix=".recording-", dir=out))
    rec = work / "mp4"  # RecordVideo creates it (and warns about a folder that exists)
    gen = torch.Generator().manual_seed(seed)
    returns: list[float] = []
    try:
        env = _make_env(maker, cfg.env_kwargs, where)
        try:
            env = RecordVideo(env, str(rec), episode_trigger=lambda _: True,
                              name_prefix=NAME_PREFIX, disable_logger=True)
            space = env.action_space
            with torch.inference_mode():
                for k in range(episodes):
                    obs, info = env.reset(seed=seed + k)
                    total, done = 0.0, False
                    memory = new_memory(policy, 1)
                    kind = mask_kind(env, obs, info)  # the env's action masks, if any
                    while not done:
                        m = None if kind is None else env_mask(env, kind, obs, info)[None]
                        a = policy_actions(policy, np.asarray(obs)[None], space, obs_norm,
                                           deterministic, gen, memory, m)[0]
                        if isinstance(space, spaces.Discrete):
                            a = a.item()
                        obs, r, te, tr, info = env.step(a)
                        total += float(r)
                        done = bool(te or tr)
                    returns.append(total)
        except gym.error.DependencyNotInstalled as exc:
            raise UsageError(f"{where}: rendering needs a package that is missing: {_EXTRA} "
                             f"({str(exc).splitlines()[0]})") from None
        finally:
            env.close()  # writes the last episode's file
        files = [f"{NAME_PREFIX}-episode-{k}.mp4" for k in range(episodes)]
        missing = [f for f in files if not (rec / f).is_file()]
        if missing:
            raise UsageError(f"{where}: the encoder wrote no {missing[0]} (an empty episode "
                             "or a failed render)")
        for name in os.listdir(out):  # the previous output this one replaces
            p = out / name
            if p == work or not _OUTPUT.match(name):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        for f in files:
            os.replace(rec / f, out / f)  # replaces a link at the target, never follows it
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        if created:
            try:
                os.rmdir(out)  # only if still empty
            except OSError:
                pass
        raise
    shutil.rmtree(work, ignore_errors=True)
    res = {"dir": str(out), "files": files, "returns": returns,
           "seeds": [seed + k for k in range(episodes)], "deterministic": deterministic,
           "env_id": cfg.env_id}
    atomic_write_text(out / "video.json", json.dumps(res, indent=2) + "\n")
    return res
