"""The user's own parts: modules named with ``--import`` that register policy losses or
advantage estimators (:func:`ppokit.register_policy_loss`,
:func:`ppokit.register_advantage_estimator`) before the configuration is checked.

A module is imported only because the user named it on the command line (or imported it
in Python); a run directory never names code that ppokit imports, so resuming a run
trained with a part of the user's names the module again — :func:`resume_flags` gives
the flags for the resume command ppokit prints.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import sys
from collections.abc import Iterable, Iterator

from ppokit.core.registry import ADVANTAGES, POLICY_LOSSES
from ppokit.errors import UsageError, UserCodeError

__all__ = ["import_modules", "resume_flags", "reading_run", "names_checked", "require"]

_READING = contextvars.ContextVar("ppokit_reading_run", default=False)


@contextlib.contextmanager
def reading_run() -> Iterator[None]:
    """Read a run's configuration without requiring its registered parts: evaluating,
    reporting or loading a run trained with a loss of the user's needs no import of it
    (training from it does: :func:`require`)."""
    token = _READING.set(True)
    try:
        yield
    finally:
        _READING.reset(token)


def names_checked() -> bool:
    """Whether a configuration built now checks its registry names (not while reading a
    run, :func:`reading_run`)."""
    return not _READING.get()


def require(registry, name: str, field: str, command: str) -> None:
    """A :class:`UsageError` naming ``field`` when ``name`` is not registered, saying how to
    register it for ``command`` (training a run read from its directory)."""
    if name not in registry:
        raise UsageError(f"{field}: {name!r} is not a registered {registry.kind} (known: "
                         f"{', '.join(registry.names())}); a run trained with a part of your "
                         f"own continues with its module named again: {command} --import "
                         f"MODULE")


def _names(spec: str | Iterable[str] | None) -> list[str]:
    if spec is None:
        return []
    items = [spec] if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for item in items:
        out += [p.strip() for p in str(item).split(",") if p.strip()]
    return out


def import_modules(spec: str | Iterable[str] | None, flag: str = "--import") -> list[str]:
    """Import each module of ``spec`` (names, comma-separated or repeated), with the
    current directory importable as for ``python -m``. Returns the names imported."""
    names = _names(spec)
    for mod in names:
        if not all(p.isidentifier() for p in mod.split(".")):
            raise UsageError(f"{flag}: expected a Python module name such as my_losses or "
                             f"pkg.losses, got {mod!r}")
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        for mod in names:
            try:
                importlib.import_module(mod)
            except ModuleNotFoundError as exc:
                if exc.name and mod.startswith(exc.name):
                    raise UsageError(f"{flag}: no module named {mod!r} (looked on the "
                                     f"Python path and in {cwd})") from None
                raise UserCodeError(f"{flag}: importing module {mod!r} raised "
                                    f"{type(exc).__name__}: {exc}") from exc
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module
                text = str(exc).strip().splitlines()
                raise UserCodeError(f"{flag}: importing module {mod!r} raised "
                                    f"{type(exc).__name__}"
                                    f"{': ' + text[0][:200] if text else ''}") from exc
    finally:
        if added:
            sys.path.remove(cwd)
    return names


def resume_flags(*, policy_loss: str | None = None,
                 advantage_estimator: str | None = None) -> str:
    """`` --import MOD`` for each module outside ppokit that registered the named parts
    (empty when all are ppokit's), for the resume command a run prints."""
    mods: list[str] = []
    for reg, name in ((POLICY_LOSSES, policy_loss), (ADVANTAGES, advantage_estimator)):
        if name is None or name not in reg:
            continue
        mod = getattr(reg.entry(name).fn, "__module__", None) or ""
        if mod and mod != "__main__" and not mod.startswith("ppokit") and mod not in mods:
            mods.append(mod)
    return "".join(f" --import {m}" for m in mods)
