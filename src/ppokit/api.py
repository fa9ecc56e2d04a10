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
resuming or evaluating such a run needs it again: ``ppokit.load(path, env=make_env)`` (an
instance of one of Gymnasium's registered environments is recorded by its id instead);
the run records its observation and action spaces, so ``ppokit.load(path)`` alone gives
an agent that predicts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from typing import Any

from ppokit.agent import Agent, check_path, check_progress, log_line
from ppokit.cliutil import check_callbacks
from ppokit.errors import UsageError

__all__ = ["Agent", "train", "load", "env_maker"]

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
        from ppokit.envs.multiagent import probe_factory

        return probe_factory(env, label), label, "factory"
    raise UsageError(f"env: expected a Gymnasium id or a factory () -> gymnasium.Env, got "
                     f"{type(env).__name__}")


def _recorded_id(maker: Any, env_id: str, source: str, env_kwargs: Any):
    """An instance of one of Gymnasium's registered environments is recorded by its id and
    keyword arguments (:func:`ppokit.envs.source.registered_id`), so that loading and
    evaluating the run need nothing more; training still steps the instance itself."""
    from ppokit.envs.source import InstanceEnvs

    if not isinstance(maker, InstanceEnvs) or maker.registered is None:
        return env_id, source, env_kwargs
    if env_kwargs:
        raise UsageError("env_kwargs: apply to a registered id; an environment instance "
                         "was made with its own arguments")
    return maker.registered[0], "id", maker.registered[1]


def env_maker(env: Any) -> Any:
    """What builds environments from the ``env`` a user passes (an id, a factory, an
    instance or a ``gymnasium.vector.VectorEnv``), checked as ``ppokit.train`` checks it."""
    return _env_arg(env)[0]


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


def train(env, algo: str = "ppo", total_steps: int | None = None,
          run_dir: str | os.PathLike | None = None, callbacks: Iterable[Callable] = (),
          env_kwargs: dict | None = None, progress: Any = None, *,
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
    environment. ``progress``: a progress bar (default: when stderr is a terminal); a text
    stream (``sys.stdout``) receives it instead, as plain lines when it is not a terminal.
    ``**config``: any configuration key (``ppokit train --help``), e.g. ``seed=1``,
    ``n_envs=4``, ``learning_rate=1e-3``.
    """
    from ppokit.algos import Trainer
    from ppokit.io import unique_run_dir

    maker, env_id, source = _env_arg(env)
    callbacks = check_callbacks(callbacks)
    show = check_progress(progress)
    if not isinstance(resume, bool):
        raise UsageError(f"resume: expected True or False, got {resume!r}")
    fresh = False
    if resume:
        from ppokit.algos.runs import open_run

        if run_dir is None:
            raise UsageError("resume: needs run_dir, the run directory to continue")
        if config or total_steps is not None or env_kwargs is not None or algo != "ppo":
            raise UsageError("resume: continues a run with its saved configuration; "
                             "algo/total_steps/env_kwargs/configuration keys cannot be given")
        run_dir = check_path(run_dir, "run_dir")
        if not run_dir.is_dir():
            raise UsageError(f"run_dir: no such run directory {str(run_dir)!r}")
        run = open_run(run_dir, maker if source == "factory" else env_id, "env")
        cfg, maker = run.cfg, run.env
    else:
        if not isinstance(algo, str):
            raise UsageError(f"algo: expected a string, got {algo!r}")
        if "policy" in config and not isinstance(config["policy"], str):
            config["policy"] = _extractor_name(config["policy"])
        env_id, source, env_kwargs = _recorded_id(maker, env_id, source, env_kwargs)
        cfg = _resolve(env_id, algo, total_steps, env_kwargs, source, config, maker)
        if run_dir is None:
            run_dir = unique_run_dir("runs", f"{cfg.env_id}-{cfg.algo}-s{cfg.seed}")
            fresh = True
        else:
            run_dir = check_path(run_dir, "run_dir")
    try:
        trainer = Trainer(cfg, run_dir, resume=resume, log=log_line, fresh=fresh, env=maker)
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
    and ``learn`` (an id, a factory or an environment instance; what you give wins): a
    registered id needs nothing, nor does a run trained on an instance of one of
    Gymnasium's registered environments (Stable-Baselines3's ``gym.make("CartPole-v1")``:
    the run records its id); a run trained on another factory needs it again
    (``env=make_env``) or a registered id that builds the same environment, and one
    trained on a ``"module:Id"`` needs the id named again (``env="module:Id"``: imported
    because you name it here). Without it the agent
    predicts, and ``evaluate`` / ``learn`` say what to pass. ``best=True``: the best
    policy the evaluations during training kept (``best/``); its ``learn`` continues the
    run itself, from the newest checkpoint."""
    from ppokit.algos.runs import open_run

    path = check_path(path, "path")
    if not path.is_dir():
        raise UsageError(f"path: no such run directory {str(path)!r}")
    if env is not None and not isinstance(env, str):
        env = _env_arg(env)[0]  # refuses a class with the same message
    if not isinstance(best, bool):
        raise UsageError(f"best: expected True or False, got {best!r}")
    # without the environment (a factory run's, not given again) the agent still predicts
    run = open_run(path, env, "env", best=best, need_env=False)
    policy, norm, spaces = run.policy()
    agent = Agent(run.cfg, path, policy, norm, spaces, run.env,
                  checkpoint=(run.tensors, run.arrays, run.state), writable=False)
    agent._env_missing = run.env_missing
    return agent
