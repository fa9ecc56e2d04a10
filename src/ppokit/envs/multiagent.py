"""PettingZoo multi-agent environments as ppokit vector envs, one policy for all agents.

:class:`AgentRows` steps ``copies`` PettingZoo ``ParallelEnv``\\ s (an AEC env goes through
PettingZoo's own ``aec_to_parallel``, which accepts the envs whose agents act at the same
time) and shows every agent of every copy as one row of a Gymnasium vector env: row
``c * k + i`` is agent ``i`` (``possible_agents`` order) of copy ``c``. One policy acts for
all rows (parameter sharing); with ``agent_id`` a one-hot agent index is appended to each
row's observation (a ``Box``: concatenated; a ``Dict``: the key ``"agent_id"``). All agents
need the same observation and action spaces, unless ``groups`` (``agent_groups``) gives
each group of agents its own policy: then the rows' observations and actions are the
groups' padded to one size, each row's observation ending with its group index
(:mod:`ppokit.envs.agent_groups`).

The vector env runs in ``NEXT_STEP`` auto-reset mode, per agent:

* an agent's own ``terminated`` / ``truncated`` end its row's episode: that step returns
  the agent's final observation (so a truncation is bootstrapped from it) and its reward;
* an agent that has finished while the others play on is *idle*: its later steps ignore
  the action, return reward 0 and are marked in ``info["ppokit_idle"]``, which the
  collector (:mod:`ppokit.rollout.collector`) stores as invalid steps, as it stores the
  dummy step after an episode's end — they neither carry into GAE nor are trained on;
* once every agent of a copy has finished, its next step resets it: every row of the copy
  is idle on that step and returns the new episode's first observation.

Action masks: a ``Dict`` observation's ``"action_mask"`` passes through (ppokit reads it,
:mod:`ppokit.envs.masks`); an agent's ``info["action_mask"]`` becomes the vector env's
``info["action_mask"]``. An idle row allows every action (its action is ignored).

``n_envs`` counts rows: ``copies × agents`` (a multiple of the number of agents).

``global_state`` (a centralised critic's input): every info also holds
``info["ppokit_state"]`` (:data:`STATE_KEY`), ``[rows, S]`` float32, row ``c * k + i`` copy
``c``'s ``env.state()`` after its step or reset (an episode's final state at its end),
flattened, with ``agent_id`` agent ``i``'s one-hot index after it (``single_state_space``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv

from ppokit.errors import UsageError, UserCodeError

from .agent_groups import AgentGroups

__all__ = ["AgentRows", "ParallelEnvs", "IDLE_KEY", "AGENT_ID_KEY", "STATE_KEY",
           "parallel_of", "is_pettingzoo_id", "pettingzoo_factory", "agent_metrics",
           "agents_of", "probe_factory", "state_space_of", "groups_data"]

IDLE_KEY = "ppokit_idle"
STATE_KEY = "ppokit_state"  # the rows' global state (global_state=True)
AGENT_ID_KEY = "agent_id"
MASK_KEY = "action_mask"
PREFIX = "pettingzoo:"


def parallel_of(env: Any, label: str = "env") -> Any:
    """``env`` as a PettingZoo ``ParallelEnv``: as it is, or an AEC env through PettingZoo's
    ``aec_to_parallel`` (which accepts only envs whose agents act at the same time)."""
    from pettingzoo.utils.env import AECEnv, ParallelEnv

    if isinstance(env, ParallelEnv):
        return env
    if isinstance(env, AECEnv):
        from pettingzoo.utils.conversions import aec_to_parallel

        try:
            return aec_to_parallel(env)
        except AssertionError:
            raise UsageError(f"env: {label} is a turn-based AEC environment (its agents act "
                             "one after another), which PettingZoo's aec_to_parallel does "
                             "not convert; ppokit trains parallel environments") from None
    raise UsageError(f"env: {label}: expected a PettingZoo ParallelEnv or AECEnv, got "
                     f"{type(env).__name__}")


def _same(a, b) -> bool:
    return type(a) is type(b) and a.shape == b.shape and getattr(a, "n", None) == getattr(
        b, "n", None) and (not isinstance(a, spaces.Dict) or a.keys() == b.keys())


class AgentRows(VectorEnv):
    """Every agent of ``copies`` parallel envs as one vector-env row (module doc).
    ``make``: a factory of PettingZoo envs (parallel or AEC)."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, make: Callable[[], Any], copies: int, *, agent_id: bool = False,
                 label: str = "env", global_state: bool = False, groups: str = "shared"):
        self.label = label
        self.envs = [parallel_of(make(), label) for _ in range(copies)]
        first = self.envs[0]
        self.agents = list(first.possible_agents)
        k = self.k = len(self.agents)
        if k == 0:
            raise UserCodeError(f"{label}: possible_agents is empty")
        self.agent_id = agent_id
        self.groups = None if groups == "shared" else AgentGroups(first, self.agents, groups,
                                                                  label)
        obs_sp, act_sp = self._spaces(first)
        self.inner_space = obs_sp
        self.num_envs = copies * k
        self.single_observation_space = (
            self.groups.observation_space(k if agent_id else 0) if self.groups
            else self._with_id_space(obs_sp) if agent_id else obs_sp)
        self.single_action_space = act_sp
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space,
                                                              self.num_envs)
        self.action_space = gym.vector.utils.batch_space(act_sp, self.num_envs)
        self.live = np.zeros((copies, k), bool)  # the agent acts in its copy's episode
        self.over = np.zeros(copies, bool)  # every agent done: the next step resets
        self._obs: list[list[Any]] = [[None] * k for _ in range(copies)]
        # each agent's allowed actions when idle or without a mask of its own: every one,
        # or (groups of different action counts) its group's
        self._base = None if self.groups is None else self.groups.base_masks()
        self._masks: np.ndarray | None = (  # [copies, k, W] from infos, when given
            None if self._base is None else np.tile(self._base, (copies, 1, 1)))
        self.returns = np.zeros(self.num_envs)  # each row's running episode return
        self.finished: list[tuple[int, float]] = []  # (agent index, return), not yet read
        self.single_state_space = self._state_space(first) if global_state else None
        self._states: np.ndarray | None = None  # [copies, S] each copy's state, when read

    def _spaces(self, first) -> tuple:
        """The agents' (inner) observation and action spaces: the groups' common ones, or
        the first agent's, which every agent must share without groups."""
        if self.groups is not None:
            return (spaces.Box(-np.inf, np.inf, (self.groups.width,), np.float32),
                    self.groups.action_space)
        obs_sp, act_sp = first.observation_space(self.agents[0]), first.action_space(
            self.agents[0])
        for a in self.agents[1:]:
            if not (_same(first.observation_space(a), obs_sp)
                    and _same(first.action_space(a), act_sp)):
                raise UsageError(f"env: {self.label}: agent {a!r} has other observation or "
                                 f"action spaces than agent {self.agents[0]!r}; one shared "
                                 "policy needs the same spaces for all agents (agent_groups "
                                 "= prefix or agent: one policy per group of agents)")
        return obs_sp, act_sp

    def _with_id_space(self, sp):
        if isinstance(sp, spaces.Box) and len(sp.shape) == 1:
            lo = np.concatenate([sp.low.astype(np.float32), np.zeros(self.k, np.float32)])
            hi = np.concatenate([sp.high.astype(np.float32), np.ones(self.k, np.float32)])
            return spaces.Box(lo, hi, dtype=np.float32)
        if isinstance(sp, spaces.Dict):
            return spaces.Dict({**sp.spaces,
                                AGENT_ID_KEY: spaces.Box(0.0, 1.0, (self.k,), np.float32)})
        raise UsageError(f"agent_id: appends a one-hot agent index to flat Box or Dict "
                         f"observations; {self.label}'s are {sp}")

    def _state_space(self, env) -> spaces.Box:
        """The rows' state space (the env's ``state_space`` flattened, with the agent
        index when ``agent_id``); an env without a state is refused by name."""
        sp = getattr(env, "state_space", None)
        if not isinstance(sp, spaces.Box):
            raise UsageError(f"centralised_critic: {self.label} gives no global state (a "
                             "PettingZoo environment's state_space, a Box, and state()); "
                             f"the centralised critic reads it (state_space: {sp})")
        size = int(np.prod(sp.shape)) + (self.k if self.agent_id else 0)
        if self.groups is not None:  # the group index last, as in the observation
            hi = np.full(size + 1, np.inf, np.float32)
            hi[-1] = len(self.groups.names) - 1
            lo = np.full(size + 1, -np.inf, np.float32)
            lo[-1] = 0.0
            return spaces.Box(lo, hi, dtype=np.float32)
        return spaces.Box(-np.inf, np.inf, (size,), np.float32)

    def _read_state(self, c: int, env) -> None:
        try:
            st = np.asarray(env.state(), np.float32).reshape(-1)
        except NotImplementedError:
            raise UsageError(f"centralised_critic: {self.label}'s state() is not "
                             "implemented; the centralised critic reads it") from None
        if self._states is None:
            self._states = np.zeros((len(self.envs), st.size), np.float32)
        self._states[c] = st

    def _state_rows(self) -> np.ndarray:
        """``[rows, S]``: each copy's state repeated for its agents (+ the agent index)."""
        rows = np.repeat(self._states, self.k, axis=0)
        if self.agent_id:
            ids = np.tile(np.eye(self.k, dtype=np.float32), (len(self.envs), 1))
            rows = np.concatenate([rows, ids], 1)
        if self.groups is not None:
            g = np.tile(self.groups.index.astype(np.float32), len(self.envs))
            rows = np.concatenate([rows, g[:, None]], 1)
        return rows

    # ------------------------------------------------------------------ rows
    def _row_obs(self, o, i: int):
        if self.groups is not None:
            one = np.eye(self.k, dtype=np.float32)[i] if self.agent_id else None
            return self.groups.row(o, i, one)
        if isinstance(self.inner_space, spaces.Dict):
            o = dict(o)
        if self.agent_id:
            one = np.zeros(self.k, np.float32)
            one[i] = 1.0
            if isinstance(o, dict):
                o[AGENT_ID_KEY] = one
            else:
                o = np.concatenate([np.asarray(o, np.float32).reshape(-1), one])
        return o

    def _take(self, c: int, obs: dict, infos: dict, idle: np.ndarray, idle_rows) -> None:
        """Store copy ``c``'s observations (kept for rows whose agent gives none) and masks."""
        for i, a in enumerate(self.agents):
            if a in obs:
                self._obs[c][i] = self._row_obs(obs[a], i)
            elif self._obs[c][i] is None:  # an agent absent from the first observation
                sp = self.inner_space
                blank = (np.zeros(sp.shape, sp.dtype) if isinstance(sp, spaces.Box)
                         else sp.sample())
                self._obs[c][i] = self._row_obs(blank, i)
            m = (infos.get(a) or {}).get(MASK_KEY)
            if m is not None:
                m = np.asarray(m).reshape(-1) != 0
                if self._masks is None:
                    self._masks = np.ones((len(self.envs), self.k, m.size), bool)
                self._masks[c, i] = self._idle_mask(i)
                self._masks[c, i, :m.size] &= m  # (a group's own actions come first)
            elif self._masks is not None and idle_rows[i]:
                self._masks[c, i] = self._idle_mask(i)
        idle[c * self.k:(c + 1) * self.k] = idle_rows
        if self.single_state_space is not None:
            self._read_state(c, self.envs[c])

    def _idle_mask(self, i: int):
        """The mask of agent ``i``'s row when it is idle or gives none: its group's actions
        (groups of different action counts), else every action."""
        return True if self._base is None else self._base[i]

    def _batch(self, idle: np.ndarray):
        rows = [o for per in self._obs for o in per]
        if isinstance(self.single_observation_space, spaces.Dict):
            out = {}
            for key in self.single_observation_space.spaces:
                vals = [np.asarray(r[key]) for r in rows]
                if key == MASK_KEY:  # an idle row allows every action
                    vals = [np.ones_like(v) if idle[j] else v for j, v in enumerate(vals)]
                out[key] = np.stack(vals)
            obs = out
        else:
            obs = np.stack([np.asarray(r, np.float32) for r in rows])
        info: dict[str, Any] = {IDLE_KEY: idle.copy()}
        if self._masks is not None:
            m = self._masks.reshape(self.num_envs, -1).copy()
            m[idle] = True if self._base is None else np.tile(self._base, (len(self.envs),
                                                                           1))[idle]
            info[MASK_KEY] = m
        if self.single_state_space is not None:
            info[STATE_KEY] = self._state_rows()
        return obs, info

    # ------------------------------------------------------------------ API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        idle = np.zeros(self.num_envs, bool)
        self.returns[:] = 0.0
        self.finished = []
        for c, env in enumerate(self.envs):
            obs, infos = env.reset(seed=None if seed is None else seed + c, options=options)
            self.live[c] = [a in env.agents for a in self.agents]
            self.over[c] = False
            self._take(c, obs, infos or {}, idle, ~self.live[c])
        return self._batch(idle)

    def step(self, actions):
        actions = np.asarray(actions)
        n, k = self.num_envs, self.k
        rew = np.zeros(n, np.float64)
        te, tr, idle = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
        for c, env in enumerate(self.envs):
            if self.over[c]:  # the step after the copy's episode ended: its reset
                obs, infos = env.reset()
                self.live[c] = [a in env.agents for a in self.agents]
                self.over[c] = False
                self._take(c, obs, infos or {}, idle, np.ones(k, bool))
                continue
            was = self.live[c].copy()
            acts = {a: actions[c * k + i] for i, a in enumerate(self.agents) if was[i]}
            obs, r, t1, t2, infos = env.step(acts)
            for i, a in enumerate(self.agents):
                if not was[i]:
                    continue
                row = c * k + i
                rew[row] = float(r.get(a, 0.0))
                te[row] = bool(t1.get(a, False))
                tr[row] = bool(t2.get(a, False)) or (not te[row] and a not in env.agents)
                self.live[c, i] = not (te[row] or tr[row])
                self.returns[row] += rew[row]
                if not self.live[c, i]:
                    self.finished.append((i, float(self.returns[row])))
                    self.returns[row] = 0.0
            self.over[c] = not self.live[c].any()
            self._take(c, obs, infos or {}, idle, ~was)
        obs, info = self._batch(idle)
        return obs, rew, te, tr, info

    def close_extras(self, **kwargs):
        for env in self.envs:
            env.close()


class ParallelEnvs:
    """What builds a run's multi-agent environments: a factory of PettingZoo envs (or a
    ``pettingzoo:`` id, :func:`pettingzoo_factory`); :meth:`vec` builds the rows.
    ``first``: an env the factory already built (used as the first copy)."""

    def __init__(self, factory: Callable[[], Any], label: str, first: Any = None):
        self.factory, self.label, self._first = factory, label, first
        self.__qualname__ = label

    def _make(self):
        if self._first is not None:
            env, self._first = self._first, None
            return env
        return self.factory()

    def agents(self) -> int:
        env = self._make()
        self._first = env
        return len(parallel_of(env, self.label).possible_agents)

    def vec(self, num_envs: int, *, agent_id: bool = False,
            global_state: bool = False, agent_groups: str = "shared") -> AgentRows:
        k = self.agents()
        if num_envs % k:
            raise UsageError(f"n_envs: {num_envs} rows, but {self.label} has {k} agents; "
                             f"a multi-agent run's n_envs counts agent rows (copies x "
                             f"agents): use a multiple of {k}")
        return AgentRows(self._make, num_envs // k, agent_id=agent_id, label=self.label,
                         global_state=global_state, groups=agent_groups)

    def __call__(self):
        raise UsageError(f"env: {self.label} is a multi-agent environment; ppokit builds "
                         "its agents as rows of a vector env, not as one gymnasium.Env")


def is_pettingzoo_id(env_id: Any) -> bool:
    return isinstance(env_id, str) and env_id.startswith(PREFIX)


def pettingzoo_parts(env_id: str, example: str) -> tuple[str, str]:
    """``pettingzoo:FAMILY/NAME`` → ``(FAMILY, NAME)``, both identifiers (so the module
    path built from them stays inside the package), the pettingzoo extra required; a
    malformed id is refused naming ``example``."""
    from ppokit.errors import require_extra

    parts = (env_id[len(PREFIX):] if is_pettingzoo_id(env_id) else "").split("/")
    if len(parts) != 2 or not all(p.isidentifier() for p in parts):
        raise UsageError(f"env: expected pettingzoo:FAMILY/NAME (e.g. pettingzoo:{example}), "
                         f"got {env_id!r}")
    require_extra("pettingzoo", "pettingzoo", env_id)
    return parts[0], parts[1]


def pettingzoo_factory(env_id: str, env_kwargs: dict | None = None) -> ParallelEnvs:
    """``pettingzoo:family/name_vN`` → the environments of ``pettingzoo.family.name_vN``
    (MPE's, which PettingZoo moved to the ``mpe2`` package, from ``mpe2.name_vN`` when
    PettingZoo has no ``mpe`` any more). Only modules under those packages are imported."""
    import importlib

    family, name = pettingzoo_parts(env_id, "mpe/simple_spread_v3")
    candidates = [f"pettingzoo.{family}.{name}"]
    if family == "mpe":
        candidates.append(f"mpe2.{name}")
    module, errors = None, []
    for path in candidates:
        try:
            module = importlib.import_module(path)
            break
        except ImportError as exc:
            errors.append(str(exc).splitlines()[0] if str(exc) else path)
    if module is None:
        raise UsageError(f"env: cannot load {env_id!r} ({'; '.join(errors)})")
    kwargs = dict(env_kwargs or {})
    build = getattr(module, "parallel_env", None)
    if not callable(build) and not callable(getattr(module, "env", None)):
        raise UsageError(f"env: {env_id!r} is not a PettingZoo environment module (it has "
                         "no parallel_env() or env())")

    def make():
        try:
            if build is not None:
                return build(**kwargs)
            return module.env(**kwargs)
        except TypeError as exc:
            raise UsageError(f"env_kwargs: {env_id!r} does not accept them ({exc})") from None

    return ParallelEnvs(make, env_id)


def state_space_of(env: Any, label: str = "env") -> spaces.Box:
    """The global state space of ``env``'s rows (an :class:`AgentRows` built with
    ``global_state``, maybe wrapped), or a :class:`UsageError` naming
    ``centralised_critic`` for any other env."""
    base = getattr(env, "unwrapped", env)
    sp = getattr(base, "single_state_space", None) if isinstance(base, AgentRows) else None
    if sp is None:
        raise UsageError(f"centralised_critic: {label} is not a PettingZoo multi-agent "
                         "environment with a global state (its state_space and state()); "
                         "the centralised critic reads one")
    return sp


def groups_data(env: Any) -> list[dict] | None:
    """The agent groups of ``env``'s rows as JSON values (:meth:`AgentGroups.to_data`),
    ``None`` for an env without groups."""
    base = getattr(env, "unwrapped", env)
    groups = getattr(base, "groups", None) if isinstance(base, AgentRows) else None
    return None if groups is None else groups.to_data()


def probe_factory(factory: Callable[[], Any], label: str) -> Any:
    """``factory`` as what builds a run's environments: a :class:`ParallelEnvs` when it
    builds PettingZoo environments, else ``factory`` itself. A factory is called to see
    what it builds only when PettingZoo is imported (its environments need it); the
    environment built is the first one used (:class:`_First`)."""
    import sys

    if isinstance(factory, ParallelEnvs) or "pettingzoo" not in sys.modules:
        return factory
    from pettingzoo.utils.env import AECEnv, ParallelEnv

    try:
        env = factory()
    except Exception:  # noqa: BLE001 - said where the environments are built (checked)
        return factory
    if isinstance(env, (ParallelEnv, AECEnv)):
        return ParallelEnvs(factory, label, first=env)
    return _First(factory, env)


class _First:
    """A factory whose first call returns the environment it already built."""

    def __init__(self, factory: Callable[[], Any], env: Any):
        self.factory, self._env = factory, env
        self.__qualname__ = getattr(factory, "__qualname__", None) or type(factory).__name__

    def __call__(self):
        if self._env is not None:
            env, self._env = self._env, None
            return env
        return self.factory()


def agents_of(maker: Any, env_kwargs: dict | None = None) -> int:
    """The rows per environment copy that ``maker`` builds: its number of agents for a
    PettingZoo environment, else 1."""
    if isinstance(maker, ParallelEnvs):
        return maker.agents()
    if is_pettingzoo_id(maker):
        return pettingzoo_factory(maker, env_kwargs).agents()
    return 1


MAX_AGENT_METRICS = 32  # agents of an environment with more get no metric each


def agent_metrics(env: Any) -> dict[str, float | None]:
    """``agent_return/NAME``: each agent's mean return over the episodes it finished since
    the last call (``None`` when it finished none), for a vector env of agent rows with at
    most :data:`MAX_AGENT_METRICS` agents; with agent groups also ``group_return/NAME``,
    the mean over the group's agents' finished episodes; ``{}`` for any other env."""
    import re

    base = getattr(env, "unwrapped", env)
    if not isinstance(base, AgentRows) or base.k > MAX_AGENT_METRICS:
        return {}
    fin, base.finished = base.finished, []
    out: dict[str, float | None] = {}
    for i, name in enumerate(base.agents):
        rets = [r for j, r in fin if j == i]
        key = "agent_return/" + re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))[:60]
        out[key] = float(np.mean(rets)) if rets else None
    groups = base.groups
    for j, name in enumerate(groups.names if groups is not None else ()):
        rets = [r for i, r in fin if groups.index[i] == j]
        key = "group_return/" + re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))[:60]
        out[key] = float(np.mean(rets)) if rets else None
    return out
