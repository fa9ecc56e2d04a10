"""Checks of what a user's environment *does*, read from a bounded run (:mod:`.env_probe`).

Gymnasium's own checker (:func:`gymnasium.utils.env_checker.check_env`) tests the API: the
spaces, the signatures, the types of what ``reset`` and ``step`` return, one step's
determinism. It is called as it is (``env-api``); the other checks look at a few thousand
steps of behaviour:

* ``env-exception``: ``reset`` or ``step`` raised during the run.
* ``time-limit-terminated``: episodes that end with ``terminated=True`` at one fixed length
  (the longest any episode lasted) while nothing in the observation counts steps — a time
  limit reported as termination, so the value target never bootstraps past it (FAIL); or
  terminal observations that look like ordinary ones (WARN: a limit or an outside stop,
  not a state of the task, may be ending the episodes).
* ``obs-outside-space``: observations outside the declared space (bounds, shape, structure;
  a dtype that differs from the declared one is a warning).
* ``env-nonfinite``: NaN or infinity in an observation or a reward.
* ``obs-scale`` / ``reward-scale``: features or rewards on scales that want normalisation
  (and rewards that never differ from 0, or are tiny).
* ``seed-determinism``: the same seed and actions give the same trajectory; different seeds
  give different ones.
* ``reset-options``: ``reset(seed=s, options={})`` starts where ``reset(seed=s)`` does.
* ``info-keys``: ``info`` keys that collide with those vector envs and ppokit write, and
  values that cannot be pickled (``vectorization=async`` sends them between processes).
* ``action-bounds``: ``Box`` action bounds that a Gaussian policy starting at N(0, 1) (as
  ppokit's does, clipped to the bounds) cannot sensibly cover.
* ``step-after-end``: what ``step`` does after an episode ended, before ``reset``.
* ``env-speed``: steps per second, and the vectorisation the measured cost suggests.

Every result gives the numbers it saw (``measured`` and ``values``) and one line of fix.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from .env_probe import Trace
from .result import CheckResult, failed, passed, skipped, warned

__all__ = ["EnvInfo", "check_api", "ENV_CHECKS", "trace_checks",
           "OBS_SCALE_MAX", "REWARD_RMS_MAX", "RETURN_STD_MAX",
           "SLOW_STEP_S", "ASYNC_STEP_S", "RESERVED_INFO_KEYS"]

OBS_SCALE_MAX = 10.0        # |mean| or std of a feature above this: normalise
REWARD_RMS_MAX = 100.0      # root mean square of the per-step reward
RETURN_STD_MAX = 1000.0     # spread of discounted (γ = 0.99) episode returns
REWARD_TINY = 1e-4          # every reward smaller than this (but not all 0)
SLOW_STEP_S = 5e-3          # a mean step slower than this is worth a warning
ASYNC_STEP_S = 5e-4         # from this cost on, stepping in parallel processes pays
ACTION_HALF_WIDTH_WARN = 20.0     # N(0, 1) explores < 10 % of such a range
ACTION_HALF_WIDTH_FAIL = 1e3      # ... < 0.2 %
ACTION_HALF_WIDTH_NARROW = 0.05   # nearly every N(0, 1) draw is clipped to a bound
MIN_FIXED_LENGTH = 5        # a "time limit" shorter than this is not judged
ORDINARY_RATIO = 0.5        # terminal observations at least this typical look ordinary
RESERVED_INFO_KEYS = {
    "episode": "gymnasium's RecordEpisodeStatistics (ppokit reads episode returns from it)",
    "_episode": "gymnasium's vector envs (the mask of 'episode')",
    "final_obs": "gymnasium's vector envs (the last observation of an episode)",
    "final_info": "gymnasium's vector envs (the last info of an episode)",
    "_final_obs": "gymnasium's vector envs", "_final_info": "gymnasium's vector envs",
    "final_observation": "gymnasium < 1.0's vector envs",
    "terminal_observation": "Stable-Baselines3's VecEnv",
    "TimeLimit.truncated": "gym < 0.26's TimeLimit (the old way to say truncated)",
}
# Gymnasium checker warnings that the checks here measure instead (or that do not concern
# training): infinite bounds (obs-scale looks at the values, action-bounds at the actions),
# the advice to normalise action spaces (action-bounds), wrapped envs and render modes.
_COVERED = ("space minimum value is -infinity", "space maximum value is infinity",
            "recommend using a symmetric and normalized space",
            "different from the unwrapped version", "alternative render modes")


@dataclass
class EnvInfo:
    """What a check needs besides the trace: the env's id (None for an instance or
    factory without a registered spec) and the ppokit preset's normalisation settings."""

    label: str
    env_id: str | None = None
    normalize_obs: bool = False
    normalize_reward: bool = False


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text).removeprefix("WARN: ").strip()


# ----------------------------------------------------------------------- Gymnasium's checker

def check_api(env) -> CheckResult:
    """Gymnasium's ``check_env`` on ``env.unwrapped`` (render and close checks skipped):
    an exception is a FAIL, a warning not covered by the checks here a WARN."""
    from gymnasium.utils.env_checker import check_env

    name, crit = "env-api", "gymnasium.utils.env_checker.check_env passes"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check_env(env.unwrapped, skip_render_check=True, skip_close_check=True)
        except Exception as exc:  # noqa: BLE001 - the checker's verdict
            msg = " ".join(str(exc).split())[:300] or type(exc).__name__
            return failed(name, f"raised {type(exc).__name__}", crit,
                         f"Gymnasium's API checker: {msg}",
                         "make reset/step follow the Gymnasium API "
                         "(gymnasium.farama.org/introduction/create_custom_env)",
                         error=msg)
    notes = []
    for w in caught:
        text = _plain(str(w.message))
        if not any(c in text for c in _COVERED) and text not in notes:
            notes.append(text)
    if notes:
        return warned(name, f"{len(notes)} warning(s)", crit, "Gymnasium's API checker: "
                     + " | ".join(n[:200] for n in notes),
                     "follow each warning of Gymnasium's checker", warnings=notes)
    return passed(name, "passed", crit)


# ----------------------------------------------------------------------- from the run

def check_exception(tr: Trace, info: EnvInfo) -> CheckResult:
    name, crit = "env-exception", "reset and step never raise"
    if tr.exception is None:
        return passed(name, f"{tr.steps} steps, {len(tr.episodes)} episodes, no exception", crit)
    call, step, err = tr.exception
    verb = err.split(" ", 1)[0]
    return failed(name, f"{call}() {verb} after {step} steps", crit,
                 f"{call}() {err}", "fix the environment's code path that raised "
                 "(a rare state, an action at the bounds, a reset after the end)",
                 call=call, step=step, error=err)


def _clock_feature(tr: Trace) -> str | None:
    """A feature of the observation that is a strictly monotone function of the step
    index within an episode (the same value at the same step in every episode)."""
    t = np.asarray(tr.t_index)
    for leaf in tr.leaves:
        if not leaf.keep_rows or len(leaf.rows) != len(t) or not leaf.rows:
            continue
        x = np.stack(leaf.rows)
        order = np.argsort(t, kind="stable")
        ts, xs = t[order], x[order]
        uniq, start = np.unique(ts, return_index=True)
        if len(uniq) < 3:
            continue
        lo = np.minimum.reduceat(xs, start, axis=0)
        hi = np.maximum.reduceat(xs, start, axis=0)
        same = (hi - lo == 0).all(0)
        d = np.diff(lo, axis=0)
        mono = (d > 0).all(0) | (d < 0).all(0)
        hit = np.flatnonzero(same & mono)
        if len(hit):
            return f"{leaf.path}[{int(hit[0])}]" if x.shape[1] > 1 else leaf.path
    return None


def _lowdim_float_rows(tr: Trace) -> np.ndarray | None:
    """The run's observations as one ``[N, d]`` float array of the non-image ``Box``
    leaves kept as rows (constant features left out); None when there are none."""
    cols = []
    for leaf in tr.leaves:
        if (leaf.keep_rows and isinstance(leaf.space, spaces.Box) and leaf.rows
                and len(leaf.rows) == len(tr.t_index)):
            cols.append(np.stack(leaf.rows))
    if not cols:
        return None
    x = np.concatenate(cols, axis=1)
    x = x[:, np.isfinite(x).all(0) & (np.ptp(x, axis=0) > 0)]
    return x if x.shape[1] else None


def _typicality(ordinary: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per row of ``x``: the smallest, over features, two-sided tail share of
    ``ordinary`` at least as extreme (≈ 0: beyond what ordinary states reach)."""
    s = np.sort(ordinary, axis=0)
    n = len(ordinary)
    tails = []
    for f in range(s.shape[1]):
        below = np.searchsorted(s[:, f], x[:, f], "right") / n
        above = 1.0 - np.searchsorted(s[:, f], x[:, f], "left") / n
        tails.append(np.minimum(below, above))
    return np.min(np.stack(tails, axis=1), axis=1)


def check_time_limit(tr: Trace, info: EnvInfo) -> CheckResult:
    name = "time-limit-terminated"
    crit = "no cluster of terminated episodes at one fixed, longest length"
    eps = tr.episodes
    if len(eps) < 3:
        return skipped(name, crit, f"only {len(eps)} episode(s) ended within the budget "
                     f"({tr.steps} steps); give more with --env-steps / --env-seconds")
    term = [e.length for e in eps if e.terminated]
    n_trunc = sum(e.truncated and not e.terminated for e in eps)
    longest = max(e.length for e in eps)
    seen = (f"{len(eps)} episodes: {len(term)} terminated, {n_trunc} truncated; "
            f"longest {longest}")
    fix = ("return truncated=True when the time runs out (or register the env with "
           "max_episode_steps); if the task really ends there, put the step count or the "
           "time left into the observation")
    if term:
        lengths, counts = np.unique(term, return_counts=True)
        k = int(np.argmax(counts))
        L, c = int(lengths[k]), int(counts[k])
        if L == longest and L >= MIN_FIXED_LENGTH and c >= 3 and c >= 0.25 * len(term):
            clock = _clock_feature(tr)
            values = {"length": L, "at_length": c, "terminated": len(term),
                      "truncated": n_trunc, "clock_feature": clock}
            if clock is not None:
                return passed(name, f"{c} of {len(term)} terminated episodes end at step {L}; "
                           f"the observation counts steps ({clock}): a fixed horizon",
                           crit, **values)
            measured = (f"{c} of {len(term)} terminated episodes end at exactly step {L}, "
                        "the longest any episode lasted")
            what = (f"episodes end with terminated=True at one fixed length ({L} steps) "
                    "and nothing in the observation counts steps: a time limit reported "
                    "as termination, so the value target never bootstraps past it and the "
                    "same state has two values")
            if not any(leaf.keep_rows for leaf in tr.leaves):
                # no vector part to look for a clock in: an image may show what ends it
                return warned(name, measured, crit, what.replace(
                    "nothing in the observation counts steps",
                    "the observation is an image (if it shows the time or the state "
                    "that ends the episode, this is a fixed horizon)"), fix, **values)
            return failed(name, measured, crit, what, fix, **values)
    x = _lowdim_float_rows(tr)
    if len(term) >= 10 and x is not None:
        terminal = np.asarray(tr.terminal)
        ordinary = x[~terminal]
        rng = np.random.default_rng(0)
        ref = ordinary[rng.choice(len(ordinary), min(len(ordinary), 500), replace=False)]
        t_med = float(np.median(_typicality(ordinary, x[terminal])))
        o_med = float(np.median(_typicality(ordinary, ref)))
        ratio = t_med / o_med if o_med > 0 else 0.0
        values = {"terminated": len(term), "typicality_terminal": t_med,
                  "typicality_ordinary": o_med, "ratio": ratio}
        if ratio >= ORDINARY_RATIO:
            return warned(name, f"{seen}; terminal observations as typical as ordinary ones "
                         f"(median tail share {t_med:.3g} vs {o_med:.3g})", crit,
                         "the observations on which episodes terminate look like ordinary "
                         "states (no feature is beyond what other states reach): if a time "
                         "limit or an outside stop ends them, report truncated=True; a "
                         "state of the task that ends the episode usually shows in the "
                         "observation", fix, **values)
        return passed(name, f"{seen}; terminal observations beyond ordinary ones (median "
                   f"tail share {t_med:.3g} vs {o_med:.3g})", crit, **values)
    return passed(name, seen, crit, terminated=len(term), truncated=n_trunc)


def check_obs_space(tr: Trace, info: EnvInfo) -> CheckResult:
    name, crit = "obs-outside-space", "every observation inside observation_space"
    n = len(tr.t_index)
    if tr.n_outside:
        ex = "; ".join(f"step {s}, {p}: {d}" for s, p, d in tr.outside[:3])
        return failed(name, f"{tr.n_outside} of {n} observations outside the space", crit,
                     f"observations leave the declared space: {ex}",
                     "declare bounds (and shapes) that hold for every state, or clip the "
                     "observation inside the env", count=tr.n_outside,
                     examples=[list(x) for x in tr.outside])
    if tr.dtype_only:
        s, p, d = tr.dtype_only[0]
        return warned(name, f"{p}: {d}", crit, f"observations have another dtype than the "
                     f"declared space ({p}: {d}, first at step {s}): Box.contains() is "
                     "False for them", "cast the observation to the space's dtype",
                     examples=[list(x) for x in tr.dtype_only])
    return passed(name, f"{n} observations, all inside", crit)


def check_nonfinite(tr: Trace, info: EnvInfo) -> CheckResult:
    name, crit = "env-nonfinite", "no NaN or infinity in observations or rewards"
    if tr.n_nonfinite:
        ex = "; ".join(f"step {s}: {w}" for s, w in tr.nonfinite[:3])
        return failed(name, f"{tr.n_nonfinite} non-finite value(s)", crit,
                     f"NaN or infinity came out of the env: {ex}. One NaN in a batch turns "
                     "every gradient into NaN", "guard the computation that produced it "
                     "(a division, a log, a state the physics cannot handle)",
                     count=tr.n_nonfinite, examples=[list(x) for x in tr.nonfinite])
    return passed(name, f"{len(tr.t_index)} observations and {len(tr.rewards)} rewards "
               "finite", crit)


def check_obs_scale(tr: Trace, info: EnvInfo) -> CheckResult:
    name = "obs-scale"
    crit = f"every feature's |mean| and std ≤ {OBS_SCALE_MAX:g} (images excepted)"
    worst = None
    for leaf in tr.leaves:
        if not (leaf.keep_rows and isinstance(leaf.space, spaces.Box) and leaf.rows):
            continue
        x = np.stack(leaf.rows)
        x = np.where(np.isfinite(x), x, np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean, std = np.nanmean(x, 0), np.nanstd(x, 0)
        scale = np.nan_to_num(np.maximum(np.abs(mean), std))
        i = int(np.argmax(scale))
        if worst is None or scale[i] > worst[0]:
            feat = f"{leaf.path}[{i}]" if x.shape[1] > 1 else leaf.path
            worst = (float(scale[i]), feat, float(mean[i]), float(std[i]))
    if worst is None:
        return skipped(name, crit, "no vector observation to measure (images are scaled by "
                     "the CNN)")
    s, feat, m, sd = worst
    measured = f"largest: {feat} mean {m:.4g}, std {sd:.4g}"
    values = {"feature": feat, "mean": m, "std": sd}
    if s <= OBS_SCALE_MAX:
        return passed(name, measured, crit, **values)
    if info.normalize_obs:
        return passed(name, measured + " (the preset normalises: normalize_obs = true)", crit,
                   **values)
    return warned(name, measured, crit, f"observation features on a scale of {s:.3g}: the "
                 "network's first layer saturates or learns slowly on them",
                 "--set normalize_obs=true (running mean/std), or rescale in the env",
                 **values)


def check_reward_scale(tr: Trace, info: EnvInfo) -> CheckResult:
    name = "reward-scale"
    crit = (f"reward RMS ≤ {REWARD_RMS_MAX:g}, discounted-return std ≤ {RETURN_STD_MAX:g}, "
            "not all 0")
    r = np.asarray([x for x in tr.rewards if np.isfinite(x)])
    if len(r) == 0:
        return skipped(name, crit, "no finite reward was recorded")
    rms = float(np.sqrt(np.mean(r ** 2)))
    rets = np.asarray([e.disc_ret for e in tr.episodes if np.isfinite(e.disc_ret)])
    rstd = float(np.std(rets)) if len(rets) >= 2 else 0.0
    measured = (f"per step mean {r.mean():.4g}, RMS {rms:.4g}, max |r| {np.abs(r).max():.4g};"
                f" discounted return std {rstd:.4g} ({len(rets)} episodes)")
    values = {"mean": float(r.mean()), "rms": rms, "max_abs": float(np.abs(r).max()),
              "return_std": rstd}
    if not np.any(r != 0):
        return warned(name, f"all {len(r)} rewards are 0", crit, "no reward differed from 0 "
                     f"in {len(r)} steps of random actions: PPO gets no signal until "
                     "exploration finds one", "shape the reward (a denser signal), or "
                     "check that the reward is computed and returned", **values)
    if rms > REWARD_RMS_MAX or rstd > RETURN_STD_MAX:
        if info.normalize_reward:
            return passed(name, measured + " (the preset normalises: normalize_reward = true)",
                       crit, **values)
        return warned(name, measured, crit, "rewards on this scale give value targets in "
                     "the thousands: the critic's loss dominates the update and its "
                     "gradient clipping hides the policy's", "--set normalize_reward=true "
                     "(scales by the running std of the discounted return), or rescale "
                     "the reward in the env", **values)
    if np.abs(r).max() < REWARD_TINY:
        return warned(name, measured, crit, "every reward is below 1e-4: value targets "
                     "drown in the critic's rounding and initial error",
                     "--set normalize_reward=true, or rescale the reward", **values)
    return passed(name, measured, crit, **values)


def check_info_keys(tr: Trace, info: EnvInfo) -> CheckResult:
    name, crit = "info-keys", "no reserved info key; info values picklable"
    keys = sorted(tr.info_keys)
    clash = [k for k in keys if k in RESERVED_INFO_KEYS]
    if clash:
        k = clash[0]
        return warned(name, f"info key {k!r} (from {tr.info_keys[k]})", crit,
                     f"the env's info uses {k!r}, which {RESERVED_INFO_KEYS[k]} writes: "
                     "one of the two is overwritten or misread", "rename the key",
                     keys=keys, reserved=clash)
    if tr.unpicklable:
        k, why = tr.unpicklable[0]
        return warned(name, f"info[{k!r}] cannot be pickled", crit,
                     f"info[{k!r}] cannot be pickled ({why}): vectorization=async sends "
                     "every info between processes and fails on it",
                     "keep plain data (numbers, arrays, strings) in info",
                     keys=keys, unpicklable=[k for k, _ in tr.unpicklable])
    return passed(name, f"keys: {', '.join(keys[:8]) or 'none'}"
               + (" ..." if len(keys) > 8 else ""), crit, keys=keys)


def check_after_end(tr: Trace, info: EnvInfo) -> CheckResult:
    name = "step-after-end"
    crit = "after an episode ends, step() refuses or keeps reporting the end"
    ae = tr.after_end
    if ae is None:
        return skipped(name, crit, f"no episode ended within the budget ({tr.steps} steps)")
    if "raised" in ae and not ae["steps"]:
        return passed(name, f"raises {ae['raised']}", crit, **ae)
    cont = [s for s in ae["steps"] if not s[0] and not s[1]]
    if not cont:
        return passed(name, f"{len(ae['steps'])} more steps all report the end again"
                   + (f", then raises {ae['raised']}" if "raised" in ae else ""), crit, **ae)
    rewards = [s[2] for s in ae["steps"]]
    return warned(name, f"{len(cont)} of {len(ae['steps'])} steps after the end go on "
                 f"(terminated=False, truncated=False; rewards {rewards})", crit,
                 f"after an episode ended ({ae['ended_by']}), step() without reset() "
                 "carries on as if it had not: ppokit's vector envs reset at once, but a loop "
                 "or a wrapper that misses the reset trains on a continuation that is not "
                 "part of the task", "raise an error (or keep returning terminated=True) "
                 "until reset() is called", **ae)


def check_speed(tr: Trace, info: EnvInfo) -> CheckResult:
    name = "env-speed"
    crit = f"mean step ≤ {SLOW_STEP_S * 1e3:g} ms"
    if not tr.step_times:
        return skipped(name, crit, "no step completed")
    st = np.asarray(tr.step_times)
    total = float(st.sum() + sum(tr.reset_times[1:]))
    per_step = total / len(st)
    sps = 1.0 / per_step if per_step > 0 else float("inf")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    hours = 1e6 * per_step / 3600
    if per_step >= ASYNC_STEP_S and cores > 1:
        hint = (f"--set vectorization=async --num-envs {2 * cores}: at "
                f"{per_step * 1e3:.3g} ms a step, {cores} processes stepping in parallel "
                f"pay for their messages")
    else:
        hint = ("keep vectorization=auto/sync (in-process: at this cost, messages between "
                "processes would take longer than the steps); --num-envs as the preset says")
    measured = (f"{sps:,.0f} steps/s (mean step {np.mean(st) * 1e3:.3g} ms, p99 "
                f"{np.quantile(st, 0.99) * 1e3:.3g} ms, with resets "
                f"{per_step * 1e3:.3g} ms); 1M steps ≈ {hours:.2g} h in one process")
    values = {"steps_per_s": sps, "mean_step_s": float(np.mean(st)),
              "p99_step_s": float(np.quantile(st, 0.99)), "per_step_with_resets_s": per_step,
              "cores": cores, "suggestion": hint}
    if per_step > SLOW_STEP_S:
        return warned(name, measured, crit, f"a step costs {per_step * 1e3:.3g} ms: the "
                     "environment, not the update, sets the training speed", hint, **values)
    return passed(name, measured, crit, fix=hint, **values)


def check_action_bounds(space: spaces.Space) -> CheckResult:
    name = "action-bounds"
    crit = "Box bounds finite, half-width in [0.05, 20], containing 0 ± 3"
    if not isinstance(space, spaces.Box):
        return skipped(name, crit, f"{type(space).__name__} actions: no bounds to cover")
    low = np.asarray(space.low, dtype=np.float64).ravel()
    high = np.asarray(space.high, dtype=np.float64).ravel()
    fix = ("wrap the env in gymnasium.wrappers.RescaleAction(env, -1.0, 1.0) (and map back "
           "inside), or declare the bounds the actions really have")
    rng = f"[{low.min():.4g}, {high.max():.4g}]"
    values = {"low": low.tolist()[:16], "high": high.tolist()[:16]}
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        return failed(name, f"bounds {rng}", crit, "the action space is unbounded: the "
                     "Gaussian policy cannot be clipped to it and nothing tells it the "
                     "scale the env expects", fix, **values)
    half = (high - low) / 2
    centre = (high + low) / 2
    i = int(np.argmax(half))
    if half[i] > ACTION_HALF_WIDTH_FAIL:
        return failed(name, f"dimension {i}: [{low[i]:.4g}, {high[i]:.4g}]", crit,
                     f"an initial policy N(0, 1) explores {2 / half[i]:.2%} of this range: "
                     "it needs thousands of updates to move its mean and std there", fix,
                     **values)
    far = np.flatnonzero((low > 3) | (high < -3))
    if len(far):
        j = int(far[0])
        return failed(name, f"dimension {j}: [{low[j]:.4g}, {high[j]:.4g}]", crit,
                     "0 lies far outside the bounds: nearly every action the initial policy "
                     "draws is clipped to the same bound, so the env sees one action", fix,
                     **values)
    if half[i] > ACTION_HALF_WIDTH_WARN:
        return warned(name, f"dimension {i}: [{low[i]:.4g}, {high[i]:.4g}]", crit,
                     f"an initial policy N(0, 1) explores {2 / half[i]:.1%} of this range",
                     fix, **values)
    k = int(np.argmin(half))
    if half[k] < ACTION_HALF_WIDTH_NARROW:
        return warned(name, f"dimension {k}: [{low[k]:.4g}, {high[k]:.4g}]", crit,
                     f"a range of half-width {half[k]:.3g}: nearly every N(0, 1) draw is "
                     "clipped to a bound, so the policy acts bang-bang and its log-probs "
                     "describe actions the env never sees", fix + " (or --set "
                     "log_std_init=-3)", **values)
    return passed(name, f"bounds {rng}, centre {np.abs(centre).max():.3g} from 0", crit,
               **values)


ENV_CHECKS = (check_exception, check_time_limit, check_obs_space, check_nonfinite,
              check_obs_scale, check_reward_scale, check_info_keys, check_after_end,
              check_speed)


def trace_checks(tr: Trace, info: EnvInfo) -> list[CheckResult]:
    return [fn(tr, info) for fn in ENV_CHECKS]
