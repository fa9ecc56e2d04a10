"""Building vector environments and snapshotting their state for exact resume.

:func:`make_vec` wraps :func:`gymnasium.make_vec`. ``vectorization="auto"`` uses the
environment's own vectorised implementation when it registers one (CartPole-v1 does: one
numpy array step for all N envs) and ``SyncVectorEnv`` otherwise. ``autoreset="auto"``
asks sync/async vector envs for ``SAME_STEP`` (the final observation arrives in
``info["final_obs"]``) and keeps whatever a vectorised implementation supports (CartPole's
is ``NEXT_STEP`` only). The collector handles both modes; see :mod:`ppokit.rollout`.

Environment state (:func:`env_state` / :func:`load_env_state`) can be saved for the
classic-control environments, whose whole state is numpy arrays, scalars and a numpy
generator: the vectorised CartPole and sync vector envs of classic-control envs. For any
other environment ``env_state`` returns ``None`` and a resumed run resets its envs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv

from ppokit.errors import UsageError, extra_hint

from . import atari, minatar
from .checked import checked_factory, label_of
from .multiagent import ParallelEnvs, is_pettingzoo_id, pettingzoo_factory
from .source import gym_id, split_env_id

__all__ = ["make_vec", "training_vec", "autoreset_mode_of", "env_state", "load_env_state",
           "check_env_id"]

VECTORIZATIONS = ("auto", "vector_entry_point", "sync", "async", "envpool")
AUTORESET_MODES = ("auto", "same_step", "next_step")
_MODE_NAMES = {AutoresetMode.SAME_STEP: "same_step", AutoresetMode.NEXT_STEP: "next_step",
               AutoresetMode.DISABLED: "disabled"}


def check_env_id(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registered spec of ``env_id``, or a :class:`UsageError` naming the problem. The
    module part of a ``module:Id`` is never imported here (see :mod:`ppokit.envs.source`)."""
    if is_pettingzoo_id(env_id):
        raise UsageError(f"env: {env_id!r} is a multi-agent environment, which ppokit train, "
                         "ppokit eval and ppokit.train run (docs/multiagent.md); this takes a "
                         "single-agent Gymnasium environment")
    bare = gym_id(env_id)
    try:
        return gym.spec(bare)
    except (gym.error.Error, ModuleNotFoundError, ImportError) as exc:
        if bare.startswith(minatar.NAMESPACE):  # MinAtar's games (the minatar extra)
            if not minatar.register():
                raise UsageError(f"env: {env_id!r} is a MinAtar game, which needs the "
                                 f"minatar extra: {minatar.EXTRA_HINT} (minatar is not "
                                 "installed)") from None
            try:
                return gym.spec(bare)
            except (gym.error.Error, ModuleNotFoundError, ImportError):
                pass
        # ale-py's games are registered when ale-py is imported (the atari extra)
        elif atari.register():
            try:
                return gym.spec(bare)
            except (gym.error.Error, ModuleNotFoundError, ImportError):
                pass
        elif bare.startswith("ALE/"):
            raise UsageError(f"env: {env_id!r} is an Atari game, which needs the atari extra: "
                             f"{atari.EXTRA_HINT} (ale-py is not installed)") from None
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"env: unknown or unavailable environment {env_id!r} ({msg})") from None


def autoreset_mode_of(env: VectorEnv) -> AutoresetMode:
    mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    return AutoresetMode(mode) if not isinstance(mode, AutoresetMode) else mode


def make_vec(env_id: str | Callable[[], gym.Env], num_envs: int, *,
             vectorization: str = "auto", autoreset: str = "auto",
             env_kwargs: dict | None = None, training: bool = True,
             agent_id: bool = False, global_state: bool = False,
             agent_groups: str = "shared") -> VectorEnv:
    """A vector env of ``num_envs`` copies of ``env_id`` (see the module documentation):
    a registered id, a ``module:Id`` whose module the user named (:mod:`.source`), or a
    factory ``() -> gym.Env`` (sync or async vectorisation; ``env_kwargs`` do not apply).

    An Atari game (an ALE id) gets ppokit's preprocessing (:mod:`.atari`), sync or async,
    or EnvPool's equivalent in C++ (``envpool``, :mod:`.envpool_vec`); ``training=False``
    builds ppokit's stack for evaluation (whole games, unclipped rewards) whatever the
    vectorisation. For every other environment ``training`` changes nothing.

    A PettingZoo environment (a ``pettingzoo:`` id or a ``ParallelEnvs``) gives one row per
    agent (:class:`ppokit.envs.multiagent.AgentRows`: ``agent_id``, ``global_state`` and
    ``agent_groups`` are its settings; ``agent_groups`` is refused for other environments)."""
    if vectorization not in VECTORIZATIONS:
        raise UsageError(f"vectorization: expected one of {', '.join(VECTORIZATIONS)}, "
                         f"got {vectorization!r}")
    if autoreset not in AUTORESET_MODES:
        raise UsageError(f"autoreset_mode: expected one of {', '.join(AUTORESET_MODES)}, "
                         f"got {autoreset!r}")
    if is_pettingzoo_id(env_id) or isinstance(env_id, ParallelEnvs):
        return _agent_rows(env_id, num_envs, vectorization, autoreset, env_kwargs, agent_id,
                           global_state, agent_groups)
    _single_agent(env_id, agent_groups)
    if callable(env_id):  # a factory (a GivenVectorEnv builds single copies too)
        if vectorization == "envpool":
            raise UsageError("vectorization: envpool runs EnvPool's own environments, "
                             "not an environment factory; use sync or async")
        return make_vec_factory(checked_factory(env_id, label_of(env_id)), num_envs,
                                 vectorization, autoreset)
    spec = check_env_id(env_id)
    gid = gym_id(env_id)
    if split_env_id(env_id)[0] is not None and vectorization in ("auto", "sync", "async") \
            and (vectorization != "auto" or spec.vector_entry_point is None):
        # the user's own code: every call checked (ppokit.envs.checked)
        return make_vec_factory(_user_env(env_id, gid, dict(env_kwargs or {})), num_envs,
                                 "sync" if vectorization == "auto" else vectorization,
                                 autoreset)
    if vectorization == "envpool":  # EnvPool's C++ environments (ppokit.envs.envpool_vec)
        from .envpool_vec import make_envpool

        if atari.is_atari_spec(spec) and not training:  # evaluation: whole games
            return _make_atari_vec(env_id, gid, num_envs, "sync", autoreset,
                                   dict(env_kwargs or {}), training)
        return make_envpool(gid, num_envs, autoreset, env_kwargs)
    if atari.is_atari_spec(spec):
        return _make_atari_vec(env_id, gid, num_envs, vectorization, autoreset,
                               dict(env_kwargs or {}), training)
    mode = vectorization
    if mode == "auto":
        mode = "vector_entry_point" if spec.vector_entry_point is not None else "sync"
    if mode == "vector_entry_point" and spec.vector_entry_point is None:
        raise UsageError(f"vectorization: {env_id} has no vectorised entry point; use sync")
    kwargs: dict[str, Any] = dict(env_kwargs or {})
    try:
        if mode == "vector_entry_point":
            env = gym.make_vec(gid, num_envs=num_envs, vectorization_mode=mode, **kwargs)
            have = _MODE_NAMES[autoreset_mode_of(env)]
            if autoreset != "auto" and have != autoreset:
                env.close()
                raise UsageError(
                    f"autoreset_mode: {env_id}'s vectorised implementation supports only "
                    f"{have}; set vectorization=sync for {autoreset}")
        else:
            want = (AutoresetMode.NEXT_STEP if autoreset == "next_step"
                    else AutoresetMode.SAME_STEP)
            env = gym.make_vec(gid, num_envs=num_envs, vectorization_mode=mode,
                               vector_kwargs={"autoreset_mode": want}, **kwargs)
            if isinstance(env, SyncVectorEnv) and LeanSyncVectorEnv.applies(env):
                env.__class__ = LeanSyncVectorEnv
    except UsageError:
        raise
    except (gym.error.Error, ModuleNotFoundError, ImportError) as exc:
        raise UsageError(f"env: cannot build {env_id!r}: {_extra_advice(exc)}") from None
    except TypeError as exc:  # e.g. an env_kwargs name the environment does not take
        raise UsageError(f"env_kwargs: {env_id!r} does not accept them ({exc})") from None
    return flatten_dict_obs(env)


def _single_agent(env_id, agent_groups: str) -> None:
    """``agent_groups`` other than ``shared`` refused for a single-agent environment."""
    if agent_groups != "shared":
        raise UsageError(f"agent_groups: {agent_groups} groups the agents of a PettingZoo "
                         f"multi-agent environment; {label_of(env_id)} is a single-agent one")


def _agent_rows(env_id, num_envs: int, vectorization: str, autoreset: str,
                env_kwargs: dict | None, agent_id: bool, global_state: bool,
                agent_groups: str = "shared") -> VectorEnv:
    """The agents of a PettingZoo environment as rows (:mod:`.multiagent`)."""
    if vectorization not in ("auto", "sync"):
        raise UsageError(f"vectorization: a multi-agent environment steps its copies in "
                         f"this process (auto or sync), not {vectorization}")
    if autoreset == "same_step":
        raise UsageError("autoreset_mode: a multi-agent environment's rows run in next_step "
                         "mode (auto or next_step)")
    if isinstance(env_id, ParallelEnvs):
        if env_kwargs:
            raise UsageError("env_kwargs: apply to a pettingzoo: id; a factory takes its own "
                             "arguments")
        maker = env_id
    else:
        maker = pettingzoo_factory(env_id, env_kwargs)
    return flatten_dict_obs(maker.vec(num_envs, agent_id=agent_id, global_state=global_state,
                                      agent_groups=agent_groups))


class FlattenDictObs(gym.vector.VectorWrapper):
    """A vector env with ``Dict`` observations seen through flat vectors: each key's values
    (one-hot for discrete ones) concatenated in sorted key order — Gymnasium's
    ``spaces.flatten`` — for the observations and the ``final_obs`` of finished episodes.
    ``single_observation_space`` is the flat ``Box``; its ``dict_space`` attribute keeps
    the ``Dict`` for the multi-input encoder (:mod:`ppokit.policies.encoders`)."""

    def __init__(self, env: VectorEnv):
        super().__init__(env)
        given = env.single_observation_space
        # one key order everywhere (sorted, as the multi-input encoder reads them), even
        # for a Dict built with another order
        self.dict_space = gym.spaces.Dict({k: given.spaces[k] for k in sorted(given.spaces)})
        flat = gym.spaces.flatten_space(self.dict_space)
        flat.dict_space = self.dict_space
        self.single_observation_space = flat
        self.observation_space = gym.vector.utils.batch_space(flat, env.num_envs)

    def _flat(self, obs: dict) -> np.ndarray:
        parts = []
        for key in sorted(self.dict_space.spaces):
            sub, v = self.dict_space.spaces[key], np.asarray(obs[key])
            n = v.shape[0]
            if isinstance(sub, gym.spaces.Discrete):
                part = np.zeros((n, int(sub.n)), np.float32)
                part[np.arange(n), v.reshape(n) - int(sub.start)] = 1
            elif isinstance(sub, gym.spaces.MultiDiscrete):
                cols = [np.eye(int(k), dtype=np.float32)[v.reshape(n, -1)[:, j]
                                                         - int(np.ravel(sub.start)[j])]
                        for j, k in enumerate(np.ravel(sub.nvec))]
                part = np.concatenate(cols, -1)
            else:
                part = v.reshape(n, -1).astype(np.float32)
            parts.append(part)
        return np.concatenate(parts, -1)

    def _final(self, info: dict) -> dict:
        if "final_obs" in info:
            fo = info["final_obs"]
            out = np.empty(len(fo), dtype=object)
            for i, o in enumerate(fo):
                out[i] = None if o is None else gym.spaces.flatten(self.dict_space, o)
            info = dict(info)
            info["final_obs"] = out
        return info

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._flat(obs), self._final(info)

    def step(self, actions):
        obs, r, te, tr, info = self.env.step(actions)
        return self._flat(obs), r, te, tr, self._final(info)


def flatten_dict_obs(env: VectorEnv) -> VectorEnv:
    """``env`` itself, or seen through :class:`FlattenDictObs` when it has ``Dict``
    observations."""
    if isinstance(env.single_observation_space, gym.spaces.Dict):
        return FlattenDictObs(env)
    return env


def training_vec(maker, num_envs: int, *, vectorization: str = "auto",
                 autoreset: str = "auto", env_kwargs: dict | None = None,
                 agent_id: bool = False, global_state: bool = False,
                 agent_groups: str = "shared") -> VectorEnv:
    """The training envs of a run: the user's own VectorEnv as it is (a
    :class:`ppokit.envs.source.GivenVectorEnv`, checked against ``num_envs`` and
    ``autoreset``), else :func:`make_vec`."""
    from .source import GivenVectorEnv

    if not isinstance(maker, GivenVectorEnv):
        return make_vec(maker, num_envs, vectorization=vectorization, autoreset=autoreset,
                        env_kwargs=env_kwargs, agent_id=agent_id, global_state=global_state,
                        agent_groups=agent_groups)
    if agent_groups != "shared":
        raise UsageError("agent_groups: groups the agents of a PettingZoo environment, not "
                         "the environments of a VectorEnv given as it is")
    vec = maker.vec
    if vec.num_envs != num_envs:
        raise UsageError(f"n_envs: {num_envs}, but the VectorEnv given has {vec.num_envs} "
                         "environments")
    have = _MODE_NAMES[autoreset_mode_of(vec)]
    if autoreset != "auto" and have != autoreset:
        raise UsageError(f"autoreset_mode: the VectorEnv given runs in {have} mode, not "
                         f"{autoreset}")
    return vec


def _make_atari_vec(env_id: str, gid: str, num_envs: int, vectorization: str,
                    autoreset: str, env_kwargs: dict, training: bool) -> VectorEnv:
    """Sync or async copies of one preprocessed ALE game (:func:`.atari.make_env`); the
    vector env says that its games report their score (``game_scores``)."""
    if vectorization == "vector_entry_point":
        raise UsageError(f"vectorization: {env_id} is built with ppokit's Atari "
                         "preprocessing, one game per copy; use sync or async (or auto)")
    fns = atari.env_fns(gid, num_envs, training=training, env_kwargs=env_kwargs)
    try:
        env = make_vec_factory(fns[0], num_envs, vectorization, autoreset, fns=fns)
    except TypeError as exc:  # an env_kwargs name the ALE does not take
        raise UsageError(f"env_kwargs: {env_id!r} does not accept them ({exc})") from None
    env.game_scores = True
    return env


def _user_env(env_id: str, gid: str, kwargs: dict) -> Callable[[], gym.Env]:
    """The checked factory of a ``module:Id`` environment (Gymnasium's passive checker
    off: the checks replace its warnings); keyword arguments it does not take are named
    as ``env_kwargs``."""

    def make() -> gym.Env:
        try:
            return gym.make(gid, disable_env_checker=True, **kwargs)
        except TypeError as exc:
            if kwargs and "argument" in str(exc):
                raise UsageError(f"env_kwargs: {env_id!r} does not accept them ({exc})") \
                    from None
            raise

    make.__qualname__ = env_id
    return checked_factory(make, label_of(env_id))


def make_vec_factory(factory: Callable[[], gym.Env], num_envs: int, vectorization: str,
                      autoreset: str, fns: list | None = None) -> VectorEnv:
    if vectorization == "vector_entry_point":
        raise UsageError("vectorization: an environment factory has no vectorised entry "
                         "point; use sync or async")
    want = AutoresetMode.NEXT_STEP if autoreset == "next_step" else AutoresetMode.SAME_STEP
    fns = fns or [factory] * num_envs
    try:
        if vectorization == "async":
            env = AsyncVectorEnv(fns, autoreset_mode=want)
        else:
            env = SyncVectorEnv(fns, autoreset_mode=want)
    except (gym.error.Error, AssertionError) as exc:
        raise UsageError(f"env: the factory's environments cannot be vectorised "
                         f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
                         ) from None
    if isinstance(env, SyncVectorEnv) and LeanSyncVectorEnv.applies(env):
        env.__class__ = LeanSyncVectorEnv
    return flatten_dict_obs(env)


class LeanSyncVectorEnv(SyncVectorEnv):
    """``SyncVectorEnv`` in ``SAME_STEP`` mode with a shorter ``step`` for flat (Box)
    observations and Box / Discrete / MultiDiscrete actions, which is what
    :func:`make_vec` builds for sync vectorisation.

    The observations, rewards, terminations, truncations and the episode-end entries of
    ``info`` (``final_obs``, ``final_info`` and their ``_``-masks) are exactly those of
    ``SyncVectorEnv``; the sub-environments' *per-step* info dicts are not batched (the
    collector does not read them, and merging them cost about a third of an env step).
    """

    @staticmethod
    def applies(env: SyncVectorEnv) -> bool:
        return (env.autoreset_mode == AutoresetMode.SAME_STEP
                and isinstance(env.single_observation_space, gym.spaces.Box)
                and isinstance(env.single_action_space, (gym.spaces.Box, gym.spaces.Discrete,
                                                         gym.spaces.MultiDiscrete)))

    def step(self, actions):
        actions = np.asarray(actions)
        obs_buf = self._observations
        infos: dict[str, Any] = {}
        for i, env in enumerate(self.envs):
            obs, r, te, tr, info = env.step(actions[i])
            self._rewards[i] = r
            self._terminations[i] = te
            self._truncations[i] = tr
            if te or tr:
                infos = self._add_info(infos, {"final_obs": obs, "final_info": info}, i)
                obs, _ = env.reset()
            self._env_obs[i] = obs
            obs_buf[i] = obs
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        return (obs_buf.copy(), self._rewards.copy(), self._terminations.copy(),
                self._truncations.copy(), infos)


def keep_step_infos(env: VectorEnv) -> None:
    """Have ``env`` batch its sub-environments' per-step infos again where it is a
    :class:`LeanSyncVectorEnv` (an env that reports its action masks there needs them)."""
    base = env.unwrapped
    if isinstance(base, LeanSyncVectorEnv):
        base.__class__ = SyncVectorEnv


# --------------------------------------------------------------------------- env state

def _enc(v):
    if isinstance(v, np.ndarray):
        return {"__nd__": str(v.dtype), "shape": list(v.shape), "data": v.ravel().tolist()}
    if isinstance(v, np.random.Generator):
        return {"__rng__": v.bit_generator.state}
    if isinstance(v, np.generic):
        return {"__np__": str(v.dtype), "v": v.item()}
    return v


def _dec(v):
    if isinstance(v, dict) and "__nd__" in v:
        return np.asarray(v["data"], dtype=v["__nd__"]).reshape(v["shape"])
    if isinstance(v, dict) and "__np__" in v:
        return np.dtype(v["__np__"]).type(v["v"])
    return v


_SCALARS = (bool, int, float, type(None), np.generic)


def _plain_state(obj) -> dict:
    out = {}
    for k, v in vars(obj).items():
        if isinstance(v, (np.ndarray, np.random.Generator)) or isinstance(v, _SCALARS):
            out[k] = _enc(v)
    return out


def _load_plain(obj, state: dict) -> None:
    for k, v in state.items():
        if isinstance(v, dict) and "__rng__" in v:
            getattr(obj, k).bit_generator.state = v["__rng__"]
        else:
            setattr(obj, k, _dec(v))


# environments whose whole state is numpy arrays, scalars and a numpy generator:
# Gymnasium's classic control and ppokit's own small tasks
_PLAIN_STATE_MODULES = ("gymnasium.envs.classic_control", "ppokit.envs.sight",
                        "ppokit.envs.choices")


def _is_classic(env) -> bool:
    return type(env).__module__.startswith(_PLAIN_STATE_MODULES)


def env_state(env: VectorEnv) -> dict | None:
    """A JSON-able snapshot of the envs' full state, or ``None`` when it cannot be taken."""
    from .multiagent import AgentRows
    from .rows_state import rows_state

    base = getattr(env, "unwrapped", env)  # (Ray's stand-in env has no wrappers)
    if isinstance(base, AgentRows):
        return rows_state(base)
    if isinstance(env, SyncVectorEnv):
        subs = []
        for e in env.envs:
            if not _is_classic(e.unwrapped):
                return None
            chain = []
            w = e
            while hasattr(w, "env"):
                chain.append({k: _enc(getattr(w, k)) for k in ("_elapsed_steps", "_has_reset")
                              if hasattr(w, k)})
                w = w.env
            subs.append({"wrappers": chain, "env": _plain_state(e.unwrapped)})
        return {"kind": "sync", "autoreset_envs": _enc(env._autoreset_envs), "envs": subs}
    if _is_classic(env):
        return {"kind": "vector", "env": _plain_state(env)}
    return None


def load_env_state(env: VectorEnv, state: dict) -> None:
    if state["kind"] == "agents":
        from .rows_state import load_rows_state

        load_rows_state(env.unwrapped, state)
        return
    if state["kind"] == "sync":
        env._autoreset_envs = _dec(state["autoreset_envs"])
        for e, s in zip(env.envs, state["envs"], strict=True):
            w = e
            for d in s["wrappers"]:
                for k, v in d.items():
                    setattr(w, k, _dec(v))
                w = w.env
            _load_plain(e.unwrapped, s["env"])
    else:
        _load_plain(env, state["env"])


# Gymnasium's own families and the ppokit extra that installs each
_GYM_EXTRAS = {"box2d": "box2d", "mujoco": "mujoco", "pygame": "video"}


def _extra_advice(exc: BaseException) -> str:
    """Gymnasium's message, with the ppokit extra that installs what it misses."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    low = first.lower()
    for key, extra in _GYM_EXTRAS.items():
        if key in low and "not installed" in low:
            return f"it needs the {extra} extra: {extra_hint(extra)} ({first})"
    return first
