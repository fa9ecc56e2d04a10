"""The user's environment, checked at every call: one line naming what it did wrong.

An environment from the user's own code (a ``module:Id`` the user named, or a factory from
Python) is built through :func:`checked_factory` and runs inside :class:`CheckedEnv`:

* the factory must return a ``gymnasium.Env`` (a factory that raises is named with what
  it raised);
* ``reset()`` and ``step()`` may not raise: what they raise becomes a
  :class:`ppokit.errors.UserCodeError` naming the environment, the call and the step of
  that copy, with the user's exception as its cause (``ppokit --debug`` prints its
  traceback);
* every observation must lie in the observation space: a ``Box`` observation is numeric,
  of the space's shape, finite and within its bounds (compared in the space's dtype); a
  ``Discrete`` one an integer in range; any other space by its own ``contains``;
* every reward is a finite real number, ``terminated`` and ``truncated`` are booleans, and
  ``step()`` returns the five values of Gymnasium's API.

The registered environments of Gymnasium and ppokit are not wrapped (they are tested);
Gymnasium's own passive checker, whose warnings these checks replace, is turned off for
the environments that are.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np

from ppokit.errors import UsageError, UserCodeError

__all__ = ["CheckedEnv", "checked_factory", "label_of"]


def label_of(maker) -> str:
    """How a message names the environment: ``env 'mod:Id-v0'`` or ``env factory 'f'``."""
    if isinstance(maker, str):
        return f"env {maker!r}"
    name = getattr(maker, "__qualname__", None) or type(maker).__name__
    return f"env factory {name!r}"


def _brief(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def checked_factory(factory: Callable[[], gym.Env], label: str) -> Callable[[], gym.Env]:
    """``factory`` whose environments are :class:`CheckedEnv` (and whose failure to build
    one is a one-line :class:`UserCodeError` naming ``label``)."""

    def make() -> gym.Env:
        try:
            env = factory()
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's code: named, traceback kept
            raise UserCodeError(f"{label}: building the environment raised "
                                f"{_brief(exc)}") from exc
        if not isinstance(env, gym.Env):
            raise UserCodeError(f"{label}: expected the factory to return a gymnasium.Env, "
                                f"got {type(env).__name__}")
        return CheckedEnv(env, label)

    make.__qualname__ = getattr(factory, "__qualname__", "make_env")
    return make


class CheckedEnv(gym.Wrapper):
    """``env`` with every ``reset`` / ``step`` result checked (see the module
    documentation); ``label`` names it in messages."""

    def __init__(self, env: gym.Env, label: str):
        super().__init__(env)
        self.label = label
        self.steps = 0  # steps of this copy since it was built
        space = env.observation_space
        self._box = isinstance(space, gym.spaces.Box)
        if self._box:
            self._low = np.where(np.isfinite(space.low), space.low, -np.inf)
            self._high = np.where(np.isfinite(space.high), space.high, np.inf)
            self._bounded = bool(np.isfinite(space.low).any() or np.isfinite(space.high).any())

    def _fail(self, where: str, what: str, cause: BaseException | None = None):
        err = UserCodeError(f"{self.label}: {where} {what}")
        if cause is not None:
            raise err from cause
        raise err

    def reset(self, **kwargs):
        try:
            out = self.env.reset(**kwargs)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's code: named, traceback kept
            self._fail("reset()", f"raised {_brief(exc)}", exc)
        if not (isinstance(out, tuple) and len(out) == 2):
            self._fail("reset()", "returned something other than (observation, info)")
        self._check_obs(out[0], "reset()")
        return out

    def step(self, action):
        self.steps += 1
        where = f"step() (step {self.steps} of this copy)"
        try:
            out = self.env.step(action)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's code: named, traceback kept
            self._fail(where, f"raised {_brief(exc)}", exc)
        if not (isinstance(out, tuple) and len(out) == 5):
            n = len(out) if isinstance(out, tuple) else type(out).__name__
            self._fail(where, f"returned {n} values; expected (observation, reward, "
                              "terminated, truncated, info)")
        obs, reward, terminated, truncated, _ = out
        self._check_obs(obs, where)
        if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, (int, float,
                                                                           np.number)):
            self._fail(where, f"returned the reward {reward!r:.40} ({type(reward).__name__}); "
                              "expected a finite real number")
        if not np.isfinite(reward):
            self._fail(where, f"returned the reward {reward}; expected a finite real number")
        for name, flag in (("terminated", terminated), ("truncated", truncated)):
            if not isinstance(flag, (bool, np.bool_)):
                self._fail(where, f"returned {name}={flag!r:.40} ({type(flag).__name__}); "
                                  "expected a bool")
        return out

    def _check_obs(self, obs, where: str) -> None:
        space = self.observation_space
        if self._box:
            a = np.asarray(obs)
            if a.dtype.kind not in "biuf":
                self._fail(where, f"returned an observation of dtype {a.dtype}; expected "
                                  f"numbers ({space.dtype}) in {space}")
            if a.shape != space.shape:
                self._fail(where, f"returned an observation of shape {a.shape}; expected "
                                  f"{space.shape} ({space})")
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                bad = int((~np.isfinite(a)).sum())
                self._fail(where, f"returned an observation with {bad} NaN or infinite "
                                  f"value(s); expected finite values in {space}")
            if self._bounded:  # compared in the space's float type (its rounding), or
                # exactly for integer spaces (a cast could wrap around)
                v = a.astype(space.dtype if space.dtype.kind == "f" else np.float64,
                             copy=False)
                out = (v < self._low) | (v > self._high)
                if out.any():
                    i = np.unravel_index(int(np.argmax(out)), a.shape) if a.shape else ()
                    self._fail(where, f"returned an observation outside the observation "
                                      f"space (element {[int(k) for k in i]} is "
                                      f"{float(v[i]):g}, bounds [{float(self._low[i]):g}, "
                                      f"{float(self._high[i]):g}]); expected a value in {space}")
            return
        if isinstance(space, gym.spaces.Discrete):
            ok = (isinstance(obs, (int, np.integer)) or (isinstance(obs, np.ndarray)
                  and obs.shape == () and obs.dtype.kind in "iu")) \
                and not isinstance(obs, (bool, np.bool_))
            if not ok or not space.start <= int(obs) < space.start + space.n:
                self._fail(where, f"returned the observation {obs!r:.40}; expected an "
                                  f"integer in {space}")
            return
        try:
            ok = bool(space.contains(obs))
        except Exception:  # noqa: BLE001 - a value the space cannot even compare
            ok = False
        if not ok:
            self._fail(where, f"returned an observation that is not in {space} "
                              f"({type(obs).__name__})")
