"""``ppokit tune``'s search file: the ``[search]`` ranges and lists of configuration keys,
the ``[fixed]`` values and the ``[tune]`` settings, checked before any trial runs
(:func:`read_search`); :class:`SearchSpace` turns them into a trial's values."""

from __future__ import annotations

import math
from typing import Any

from ppokit.errors import UsageError

__all__ = ["SPEC_FIELDS", "TUNE_KEYS", "SearchSpace", "read_search", "parse_search",
           "check_values"]

SPEC_FIELDS = {"low", "high", "log", "step", "choices"}
TUNE_KEYS = {"eval_every": 5, "eval_episodes": 5, "pruner": "median", "startup_trials": 3,
             "warmup_evals": 2, "sampler": "tpe", "seed": 0}


class SearchSpace:
    """The parsed search file: ``params`` (key → spec), ``fixed`` values, ``tune``
    settings."""

    def __init__(self, params: dict[str, dict], fixed: dict[str, Any], tune: dict[str, Any]):
        self.params, self.fixed, self.tune = params, fixed, tune

    def suggest(self, trial) -> dict[str, Any]:
        out = {}
        for k, s in self.params.items():
            if "choices" in s:
                idx = trial.suggest_categorical(f"{k}#", list(range(len(s["choices"]))))
                out[k] = s["choices"][idx]
            elif s["int"]:
                out[k] = trial.suggest_int(k, s["low"], s["high"], log=s["log"],
                                           step=s.get("step") or 1)
            else:
                out[k] = trial.suggest_float(k, s["low"], s["high"], log=s["log"],
                                             step=s.get("step"))
        return out


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_search(path: str) -> SearchSpace:
    """Parse and check a search file; every problem is one :class:`UsageError` line naming
    the file, the table and the key."""
    from ppokit.cliutil import load_toml

    return parse_search(load_toml(path, "--search"), f"--search {path}")


def parse_search(data: dict, where: str) -> SearchSpace:
    """Check the tables of a search file (``data``: its parsed TOML); every problem is one
    :class:`UsageError` line starting with ``where``."""
    from typing import get_type_hints

    from ppokit.algos.config import TrainConfig

    tables = _tables(data, where)
    hints = get_type_hints(TrainConfig)
    params = {k: _search_param(k, spec, hints.get(k), f"{where}: [search] {k}")
              for k, spec in tables["search"].items()}
    return SearchSpace(params, dict(tables["fixed"]), _tune_options(tables["tune"], where))


def _tables(data, where: str) -> dict[str, dict]:
    """The three tables of a search file, each a dict; [search] names keys to search,
    [search] and [fixed] only configuration keys, and no key is in both."""
    from ppokit.algos.config import unknown_key, valid_keys

    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected tables [search], [fixed], [tune]")
    extra = sorted(set(data) - {"search", "fixed", "tune"})
    if extra:
        raise UsageError(f"{where}: unknown table [{extra[0]}] (expected [search], [fixed], "
                         "[tune])")
    tables = {}
    for name in ("search", "fixed", "tune"):
        t = data.get(name, {})
        if not isinstance(t, dict):
            raise UsageError(f"{where}: [{name}] must be a table, got {type(t).__name__}")
        tables[name] = t
    if not tables["search"]:
        raise UsageError(f"{where}: [search] names no key to search (e.g. learning_rate = "
                         "{low = 1e-4, high = 1e-2, log = true})")
    for name in ("search", "fixed"):
        for k in tables[name]:
            if k not in valid_keys():
                raise UsageError(f"{where}: [{name}] " + str(unknown_key(k)))
    both = sorted(set(tables["search"]) & set(tables["fixed"]))
    if both:
        raise UsageError(f"{where}: {both[0]!r} is both searched and fixed")
    return tables


def _search_param(k: str, spec, t, w: str) -> dict:
    """One [search] entry (``spec``) of the configuration key ``k`` of type ``t``, checked:
    ``{"choices": [...]}`` or a range ``{"low", "high", "log", "step", "int"}``."""
    if not isinstance(spec, dict):
        raise UsageError(f"{w}: expected a table such as {{low = 1e-4, high = 1e-2}} or "
                         f"{{choices = [...]}}, got {spec!r:.60}")
    bad = sorted(set(spec) - SPEC_FIELDS)
    if bad:
        raise UsageError(f"{w}: unknown field {bad[0]!r} (expected low, high, log, step "
                         "or choices)")
    if "choices" in spec:
        if set(spec) != {"choices"}:
            raise UsageError(f"{w}: choices cannot be combined with low/high/log/step")
        ch = spec["choices"]
        if not isinstance(ch, list) or not ch:
            raise UsageError(f"{w}: choices must be a non-empty list, got {ch!r:.60}")
        return {"choices": ch}
    if "low" not in spec or "high" not in spec:
        raise UsageError(f"{w}: needs low and high (or choices)")
    lo, hi, log, step = spec["low"], spec["high"], spec.get("log", False), spec.get("step")
    if not (_num(lo) and _num(hi)):
        raise UsageError(f"{w}: low and high must be finite numbers, got {lo!r}, {hi!r}")
    if not lo < hi:
        raise UsageError(f"{w}: low must be below high, got low = {lo}, high = {hi}")
    if not isinstance(log, bool):
        raise UsageError(f"{w}: log must be true or false, got {log!r}")
    if log and lo <= 0:
        raise UsageError(f"{w}: log = true needs low > 0, got {lo}")
    if step is not None and (not _num(step) or step <= 0):
        raise UsageError(f"{w}: step must be a positive number, got {step!r}")
    if step is not None and log:
        raise UsageError(f"{w}: step and log = true cannot be combined")
    if t is int:
        if not all(isinstance(v, int) for v in (lo, hi)) or \
                (step is not None and not isinstance(step, int)):
            raise UsageError(f"{w}: {k} is an integer key; low, high and step must be "
                             f"integers")
        return {"low": lo, "high": hi, "log": log, "step": step, "int": True}
    if t is float or t == (float | None):
        return {"low": float(lo), "high": float(hi), "log": log,
                "step": None if step is None else float(step), "int": False}
    raise UsageError(f"{w}: {k} is not a number; search it with choices = [...]")


def _tune_options(table: dict, where: str) -> dict:
    """The [tune] table over :data:`TUNE_KEYS`' defaults, checked."""
    tune = dict(TUNE_KEYS)
    for k, v in table.items():
        w = f"{where}: [tune] {k}"
        if k not in TUNE_KEYS:
            raise UsageError(f"{where}: [tune] unknown key {k!r} (expected "
                             f"{', '.join(TUNE_KEYS)})")
        if k == "pruner" and v not in ("median", "none"):
            raise UsageError(f"{w}: expected median or none, got {v!r:.60}")
        if k == "sampler" and v not in ("tpe", "random"):
            raise UsageError(f"{w}: expected tpe or random, got {v!r:.60}")
        lo = 1 if k in ("eval_every", "eval_episodes") else 0
        if k not in ("pruner", "sampler") and (not isinstance(v, int) or isinstance(v, bool)
                                               or not lo <= v <= 2**31):
            raise UsageError(f"{w}: expected an integer >= {lo}, got {v!r:.60}")
        tune[k] = v
    return tune


def check_values(space: SearchSpace, base: dict[str, Any], where: str) -> None:
    """Each bound and choice alone on the base configuration: a value the key itself
    refuses is an error now, naming the key (combinations are left to the trials)."""
    from ppokit.algos import resolve_config

    for k, s in space.params.items():
        values = s["choices"] if "choices" in s else [s["low"], s["high"]]
        for v in values:
            try:
                resolve_config(**{**base, "overrides": {**base["overrides"], k: v}})
            except UsageError as exc:
                if getattr(exc, "field", None) == k:
                    raise UsageError(f"{where}: [search] {k}: {v!r:.60} is not a valid value "
                                     f"({exc})") from None


# ------------------------------------------------------------------------------ the study
