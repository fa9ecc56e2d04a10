"""Where a run's environments come from, and the one rule about code in an env id.

An environment is either a registered Gymnasium id (``CartPole-v1``), Gymnasium's
``module:Id`` form (importing ``module`` registers ``Id``), or — from Python only — a
factory ``() -> gymnasium.Env``.

The module part of an env id is code. ppokit imports it only because the user named it in
this process (``--env module:Id`` on the command line, ``ppokit.train("module:Id")`` or
``env=`` in Python), through :func:`import_env_module`; never because a run directory's
checkpoint or configuration says so. :func:`gym_id` is the one place that turns an env id
into what Gymnasium is given: the bare ``Id`` once its module was imported that way, and a
:class:`UsageError` otherwise — so Gymnasium itself never imports anything named by a
string ppokit passes it. A factory cannot be recorded in a run directory; a run trained on
one needs the factory again to resume, evaluate or load (:func:`env_for_run`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ppokit.errors import UsageError

__all__ = ["GivenVectorEnv", "InstanceEnvs", "split_env_id", "import_env_module", "gym_id",
           "env_for_run", "check_env_kwargs", "registered_id", "id_factory", "FACTORY"]

FACTORY = "factory"  # TrainConfig.env_source of a run trained on a Python factory
PETTINGZOO = "pettingzoo:"  # ids of PettingZoo's environments (ppokit.envs.multiagent)
_IMPORTED: set[str] = set()  # modules the user named in this process


def split_env_id(env_id: str) -> tuple[str | None, str]:
    """``"mod.sub:MyEnv-v0"`` → ``("mod.sub", "MyEnv-v0")``; ``"CartPole-v1"`` → ``(None, ...)``."""
    if ":" in env_id:
        mod, name = env_id.split(":", 1)
        return mod, name
    return None, env_id


def import_env_module(env_id: str, where: str = "--env") -> str:
    """Import the module part of ``env_id`` (the user named it), with the current
    directory importable (:func:`ppokit.plugins.import_user_module`), and allow
    :func:`gym_id` to use it. Returns ``env_id``."""
    mod, name = split_env_id(env_id)
    if mod is None or env_id.startswith(PETTINGZOO):  # (ppokit.envs.multiagent imports it)
        return env_id
    if not mod or not name or not all(p.isidentifier() for p in mod.split(".")):
        raise UsageError(f"{where}: expected module:Id with a Python module name, got "
                         f"{env_id!r}")
    from ppokit.plugins import import_user_module

    import_user_module(mod, where, env_id)
    _IMPORTED.add(mod)
    return env_id


def gym_id(env_id: str) -> str:
    """The id to give Gymnasium: the bare ``Id`` of ``module:Id`` once the user named it
    (:func:`import_env_module`); a registered id as it is."""
    mod, name = split_env_id(env_id)
    if mod is None:
        return env_id
    if mod not in _IMPORTED:
        raise UsageError(f"env: {env_id!r} names the Python module {mod!r}, which ppokit "
                         f"imports only when you name it: pass --env {env_id} (Python: "
                         f"env={env_id!r})")
    return name


def env_for_run(env_id: str, env_source: str, given: Any, where: str
                ) -> str | Callable[[], Any]:
    """What builds the environments of a run read from a run directory (its checkpoint's
    ``env_id`` / ``env_source``) given what the user passed again (``given``: an id, a
    factory, or None). What the user gives wins: a factory always, an id over a factory
    run's label. A factory run needs its factory (or an id) again; a ``module:Id`` run
    needs the id named again, which is then imported; a registered id works as it is."""
    if callable(given):
        return given
    if given is not None and not isinstance(given, str):
        raise UsageError(f"{where}: expected an environment id or a factory, got "
                         f"{type(given).__name__}")
    if env_source == FACTORY:
        if given is None:
            raise UsageError(f"{where}: this run was trained on an environment factory "
                             f"({env_id}), which a run directory cannot record; pass the "
                             "factory again (Python: env=make_env), or the id of a registered "
                             "environment that builds the same environment (--env ID)")
        return import_env_module(given, where)  # the user's id wins over the label
    mod, _ = split_env_id(env_id)
    if env_id.startswith(PETTINGZOO):
        mod = None  # a PettingZoo environment: nothing of the user's to import
    if given is not None and given != env_id:
        raise UsageError(f"{where}: the run was trained on {env_id!r}, not {given!r}")
    if mod is not None:
        if given is None:
            raise UsageError(f"{where}: the run's environment {env_id!r} is imported from "
                             f"the Python module {mod!r}; ppokit imports code only when you "
                             f"name it: pass --env {env_id} again (Python: env={env_id!r})")
        import_env_module(env_id, "--env")
    return env_id


def id_factory(env_id: str) -> Callable[[], Any]:
    """A factory of the registered ``env_id`` (its module imported already, when it names
    one): what a factory run continues on when the user names an id instead, so that its
    environments stay single copies built one by one, as the factory's were."""
    import gymnasium as gym

    gid = gym_id(env_id)

    def make():
        return gym.make(gid)

    make.__qualname__ = env_id
    return make


_KW_MAX = 64 * 1024
_RESERVED = frozenset({"num_envs", "vectorization_mode", "vector_kwargs", "wrappers", "id",
                       "vectorization", "autoreset_mode"})


class InstanceEnvs:
    """A user's ``gymnasium.Env`` instance as a factory (Stable-Baselines3's habit of
    passing one environment). The rule: the first environment built is the instance
    itself; every further one (the other ``n_envs − 1`` training copies, the evaluation
    environments) is ``gymnasium.make(env.spec)`` when the instance was made from a
    registered id — the same id, keyword arguments and wrappers — and otherwise a deep copy
    of the instance as it was given (taken before training touches it). ``label``: the
    registered id (so its preset applies), else the class name. ``keep_open``: closing
    the environments built leaves the instance itself open (it is the user's)."""

    def __init__(self, env: Any, *, keep_open: bool = False):
        import copy

        self.env = _kept_open(env) if keep_open else env
        spec = getattr(env, "spec", None)
        self.spec = spec if spec is not None and getattr(spec, "id", None) else None
        if self.spec is not None and any(
                w.kwargs is None for w in getattr(self.spec, "additional_wrappers", ())):
            self.spec = None  # a wrapper gymnasium.make cannot rebuild (sb3-contrib's
            # ActionMasker): the copies are deep copies of the instance
        name = self.spec.id if self.spec is not None else type(env.unwrapped).__name__
        self.label = name
        self.__qualname__ = name
        # (id, env_kwargs) when gymnasium.make(id, **env_kwargs) builds this environment
        self.registered = registered_id(self.spec)
        self._used = False
        self._template, self._copy_error = None, None
        if self.spec is None:
            try:
                self._template = copy.deepcopy(env)
            except Exception as exc:  # noqa: BLE001 - said when a copy is needed
                self._copy_error = exc

    def __call__(self):
        import copy

        if not self._used:
            self._used = True
            return self.env
        if self.spec is not None:
            import gymnasium as gym

            return gym.make(self.spec)
        if self._template is None:
            exc = self._copy_error
            raise UsageError(f"env: the {self.label} instance given cannot be copied "
                             f"(copy.deepcopy raised {type(exc).__name__}: {exc}); a run "
                             "needs one environment per n_envs and for evaluation: pass a "
                             "factory (env=lambda: MyEnv()) or n_envs=1 with eval_episodes=0")
        return copy.deepcopy(self._template)


def _kept_open(env: Any) -> Any:
    """``env`` seen through a wrapper whose ``close`` leaves it open."""
    import gymnasium as gym

    class KeptOpen(gym.Wrapper):
        def close(self):
            pass

    return KeptOpen(env)


def registered_id(spec: Any) -> tuple[str, dict[str, Any]] | None:
    """``(id, env_kwargs)`` of an environment's ``spec`` when it is one of Gymnasium's own
    registered environments made without further wrappers (``gymnasium.make(id,
    **env_kwargs)`` builds the same environment, in any process), else ``None``: a run
    trained on such an instance records the id, so loading and evaluating it need nothing
    more. ``render_mode`` is left out (evaluation does not render). Another package's
    environment (an Atari game: its id means ppokit's preprocessing) stays a factory."""
    import gymnasium as gym

    if spec is None or getattr(spec, "additional_wrappers", ()) or \
            not str(getattr(spec, "entry_point", "")).startswith("gymnasium."):
        return None
    try:
        reg = gym.spec(spec.id)
    except Exception:  # noqa: BLE001 - not registered here: kept as a factory
        return None
    if reg.entry_point != spec.entry_point or reg.max_episode_steps != spec.max_episode_steps \
            or split_env_id(spec.id)[0] is not None:
        return None
    missing = object()
    kwargs = {k: v for k, v in (spec.kwargs or {}).items()
              if k != "render_mode" and reg.kwargs.get(k, missing) != v}
    try:
        return spec.id, check_env_kwargs(kwargs)
    except UsageError:
        return None


class GivenVectorEnv:
    """A user's ``gymnasium.vector.VectorEnv`` instance: training steps it as it is (its
    ``num_envs`` is the run's ``n_envs``; ppokit closes it with the run). Evaluation needs
    fresh single environments: calling this object builds one from the vector env's own
    ``env_fns`` (Sync/AsyncVectorEnv keep them) or from its registered ``spec``; a vector
    env with neither cannot be evaluated (a clear error then)."""

    def __init__(self, vec: Any):
        self.vec = vec
        self.__qualname__ = type(vec).__name__
        fns = getattr(vec, "env_fns", None)
        spec = getattr(vec, "spec", None)
        if fns:
            self._single = fns[0]
        elif spec is not None and getattr(spec, "id", None):
            import gymnasium as gym

            # the spec of a vector env also holds make_vec's own arguments
            kwargs = {k: v for k, v in (getattr(spec, "kwargs", None) or {}).items()
                      if k not in _RESERVED}
            self._single = lambda: gym.make(spec.id, **kwargs)
        else:
            self._single = None

    def __call__(self):
        if self._single is None:
            raise UsageError(f"env: the {type(self.vec).__name__} given for training keeps "
                             "no env_fns and no registered spec, so no single copy can be "
                             "built for evaluation; pass a factory () -> gymnasium.Env "
                             "instead (evaluation needs one)")
        return self._single()


def check_env_kwargs(value: Any, where: str = "env_kwargs") -> dict[str, Any]:
    """A copy of ``value`` if it is a table of keyword arguments whose values are plain
    data (JSON-able: numbers, strings, booleans, null, lists, tables)."""
    import json

    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and k.isidentifier()
                                              for k in value):
        raise UsageError(f"{where}: expected a table of keyword arguments (names to values), "
                         f"got {str(value)[:60]!r}")
    reserved = sorted(set(value) & _RESERVED)
    if reserved:
        raise UsageError(f"{where}: {reserved[0]!r} is set by ppokit's own configuration, "
                         "not an environment argument")
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise UsageError(f"{where}: values must be plain data (numbers, strings, booleans, "
                         f"lists, tables) ({type(exc).__name__})") from None
    if len(text) > _KW_MAX:
        raise UsageError(f"{where}: at most {_KW_MAX} characters as JSON, got {len(text)}")
    return json.loads(text)
