"""The token trainer's configuration from what the user gives: ``--set`` items, TOML files
and flags merged into one :class:`~ppokit.llm.training.config.LLMConfig` (TRL's and
deprecated names accepted), and the ``--help`` table of its keys."""

from __future__ import annotations

from dataclasses import fields, replace

from ppokit.errors import UsageError
from ppokit.settings import fail, help_table, merge_values, parse_text, resolve_key
from ppokit.settings import parse_sets as parse_set_items

from .config import SPECIAL, LLMConfig
from .presets import DEPRECATED, MODEL_DEFAULTS, PRESETS, TRL_NAMES, TRL_REFUSED

__all__ = ["config_from_values", "parse_sets", "read_toml", "config_help"]

def _parse_value(name: str, text: str):
    """A ``--set`` value for field ``name``, typed by the field's annotation (the fields
    with their own rules take the text as it is)."""
    if name in SPECIAL:
        return None if text.strip().lower() in ("none", "null", "") else text.strip()
    return parse_text(LLMConfig, name, text)


_MINIBATCHES = {"minibatches": " (a minibatch size in sequences, where minibatches was a "
                               "count)"}


def _known(name: str, where: str, log) -> str:
    """``name`` itself, the key TRL's name means, or a deprecated name as it is (said
    through ``log``; config_from_values renames it: minibatches needs the batch size)."""
    return resolve_key(name, [f.name for f in fields(LLMConfig)], where, renamed=TRL_NAMES,
                       refused=TRL_REFUSED, refused_by="TRL", deprecated=DEPRECATED,
                       log=log, deprecation_note=_MINIBATCHES)


def config_from_values(*layers: tuple[str, dict], log=None) -> LLMConfig:
    """One :class:`LLMConfig` from layers of values, later layers winning (the order the
    command line uses: ``("--config FILE", toml), ("--set", sets), ("flags", flags)``; the
    algorithm preset fills what none of them sets). Deprecated names are accepted with a
    message through ``log``; an unknown name is an error with a suggestion."""
    merged: dict = {}
    for where, values in layers:  # (an option table merged option by option)
        merge_values(merged, {_known(k, where, log): v for k, v in values.items()})
    minibatches = merged.pop("minibatches", None)
    for old, new in DEPRECATED.items():
        if old in merged:
            merged.setdefault(new, merged.pop(old))
            merged.pop(old, None)
    try:
        cfg = LLMConfig(**merged)
    except TypeError as exc:
        raise UsageError(f"config: {exc}") from None
    if minibatches is not None and "batch_size" not in merged:
        if isinstance(minibatches, bool) or not isinstance(minibatches, int) \
                or minibatches < 1:
            fail("minibatches", "expected an integer >= 1", minibatches, show=True)
        r = replace(cfg, batch_size=None).resolved()
        total = r.prompts_per_iter * r.samples_per_prompt
        if total % minibatches:
            fail("minibatches", f"the {total} sequences of an iteration do not split into "
                  f"{minibatches} minibatches", minibatches, show=True)
        cfg = replace(cfg, batch_size=total // minibatches)
    return cfg


def parse_sets(items: list[str], log=None) -> dict:
    """``["KEY=VALUE", ...]`` → typed values (deprecated keys kept for
    :func:`config_from_values` to rename)."""
    def parse(key: str, text: str):
        k = _known(key, "--set", log)
        return k, _parse_value("batch_size" if k == "minibatches" else DEPRECATED.get(k, k),
                               text)

    return parse_set_items(items, parse)


def read_toml(path: str) -> dict:
    """The values of a TOML file (top level, or its ``[llm]`` table)."""
    from ppokit.cliutil import read_toml as _read

    return _read(path, "llm")


def config_help() -> str:
    """The keys of ``--set`` / ``--config`` with their defaults and documentation, from
    the fields' metadata."""
    lines = help_table(LLMConfig, "configuration keys (--set KEY=VALUE, --config FILE.toml, "
                       "or --key VALUE):", lambda f: "preset" if f.default is None
                       and f.name in _PRESET_KEYS else None)
    lines.append("deprecated names (still accepted, with a message):")
    lines.append("  " + ", ".join(f"{o} -> {n}" for o, n in DEPRECATED.items()))
    return "\n".join(lines)


_PRESET_KEYS = {k for p in (*PRESETS.values(), *MODEL_DEFAULTS.values()) for k in p} | {
    "algo", "learning_rate", "lora_alpha", "max_new_tokens"}
