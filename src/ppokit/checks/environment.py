"""``ppokit.check_env(env)`` / ``ppokit check --env ID``: the environment checks.

>>> import ppokit
>>> report = ppokit.check_env("CartPole-v1")         # doctest: +SKIP
>>> report.ok, report.failed, report.warned            # doctest: +SKIP

``env`` is what ``ppokit train`` accepts: a registered Gymnasium id (``CartPole-v1``,
``ALE/Breakout-v5``), ``module:Id`` (the module is imported because you name it), a factory
``() -> gymnasium.Env`` or an environment instance (used as it is and not closed). The
checks (:mod:`ppokit.checks.env_checks`) run on a bounded budget: at most ``steps`` steps
or ``seconds`` seconds of the main run (:mod:`ppokit.checks.env_probe`), plus three short
replays from fixed seeds and Gymnasium's own API checker. The raw environment is checked,
as you wrote it: an Atari game without ppokit's preprocessing.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from ppokit.errors import UsageError

from .result import CheckReport

__all__ = ["check_env", "build_env", "DEFAULT_STEPS", "DEFAULT_SECONDS"]

DEFAULT_STEPS = 5000
DEFAULT_SECONDS = 30.0


def build_env(env: Any, env_kwargs: dict | None = None, where: str = "env"
              ) -> tuple[Any, str, bool]:
    """``(environment, label, owned)``: the environment built from an id or a factory
    (``owned``: ppokit closes it), or the instance given."""
    import gymnasium as gym

    from ppokit.envs.source import check_env_kwargs, gym_id, import_env_module
    from ppokit.envs.vec import check_env_id

    if isinstance(env, str):
        kwargs = check_env_kwargs(env_kwargs, "env_kwargs" if where == "env"
                                  else "--env-kwargs")
        import_env_module(env, where)
        check_env_id(env)
        try:
            return gym.make(gym_id(env), **kwargs), env, True
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's constructor, said in one line
            msg = str(exc).splitlines()[0][:160] if str(exc) else ""
            raise UsageError(f"{where}: cannot build {env!r} ({type(exc).__name__}"
                             f"{': ' + msg if msg else ''})") from None
    if env_kwargs:
        raise UsageError(f"{where}: env_kwargs apply to an environment id, not to "
                         f"{type(env).__name__}")
    if isinstance(env, gym.Env):
        return env, _label(env), False
    if callable(env):
        try:
            made = env()
        except Exception as exc:  # noqa: BLE001
            raise UsageError(f"{where}: the factory raised {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:160] if str(exc) else ''}") from None
        if not (hasattr(made, "reset") and hasattr(made, "step")
                and hasattr(made, "action_space") and hasattr(made, "observation_space")):
            raise UsageError(f"{where}: the factory returned {type(made).__name__}, not a "
                             "gymnasium.Env")
        return made, _label(made), True
    raise UsageError(f"{where}: expected an environment id, a factory () -> gymnasium.Env "
                     f"or an environment, got {type(env).__name__}")


def _label(env) -> str:
    spec = getattr(env, "spec", None)
    if spec is not None and getattr(spec, "id", None):
        return spec.id
    return type(getattr(env, "unwrapped", env)).__name__


def _env_info(env, label: str):
    from ppokit.algos.config import ENV_PRESETS

    from .env_checks import EnvInfo

    spec = getattr(env, "spec", None)
    env_id = getattr(spec, "id", None)
    preset = ENV_PRESETS.get(env_id or "", {})
    return EnvInfo(label, env_id, bool(preset.get("normalize_obs")),
                   bool(preset.get("normalize_reward")))


def _replay_steps(trace, seconds: float) -> int:
    """Steps of each of the three seed replays: 200, or fewer when a quarter of the time
    budget would not cover them at the measured step cost (at least 10)."""
    from .env_replay import DETERMINISM_STEPS

    if not trace.step_times:
        return DETERMINISM_STEPS
    per = max(sum(trace.step_times) / len(trace.step_times), 1e-9)
    return int(min(DETERMINISM_STEPS, max(10, 0.25 * seconds / (3 * per))))


def check_env(env: str | Callable[[], Any] | Any, *, env_kwargs: dict | None = None,
              steps: int = DEFAULT_STEPS, seconds: float = DEFAULT_SECONDS, seed: int = 0,
              where: str = "env") -> CheckReport:
    """Run the environment checks (see the module documentation) and return the report:
    ``report.ok`` is False when a check FAILs; ``report.warned`` names the WARNs."""
    from .env_checks import check_action_bounds, check_api, trace_checks
    from .env_masks import check_action_masks
    from .env_probe import probe
    from .env_replay import check_determinism, check_reset_options

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise UsageError(f"steps: expected an integer >= 1, got {steps!r}")
    if not (isinstance(seconds, (int, float)) and seconds > 0 and seconds < float("inf")):
        raise UsageError(f"seconds: expected a positive number, got {seconds!r}")
    built, label, owned = build_env(env, env_kwargs, where)
    info = _env_info(built, label)
    try:
        with warnings.catch_warnings():
            # the env's own warnings (a step after the end, the passive checker) are the
            # checks' business, not the user's screen's
            warnings.simplefilter("ignore")
            api = check_api(built)
            trace = probe(built, steps=steps, seconds=seconds, seed=seed)
            run = {r.name: r for r in trace_checks(trace, info)}
            determinism = check_determinism(built, seed, _replay_steps(trace, seconds))
            options = check_reset_options(built, seed, determinism.passed is not False)
            masks = check_action_masks(built, seed)
    finally:
        if owned:
            try:
                built.close()
            except Exception:  # noqa: BLE001, S110 - closing is not what is checked
                pass
    results = [api, run["env-exception"], run["time-limit-terminated"],
               run["obs-outside-space"], run["env-nonfinite"], run["obs-scale"],
               run["reward-scale"], determinism, options, run["info-keys"],
               check_action_bounds(built.action_space), run["step-after-end"],
               run["env-speed"], masks]
    return CheckReport(label, results)
