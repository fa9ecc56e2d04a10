"""The user's own code: the one place that imports it, and the modules named with
``--import`` that register policy losses or advantage estimators
(:func:`ppokit.register_policy_loss`, :func:`ppokit.register_advantage_estimator`) before
the configuration is checked.

Every module of the user's that ppokit imports — ``--env module:Id`` for both trainers,
``--reward module:function``, ``tools=module:function``, ``--import MODULE``, the module of
``--env verifiers:NAME`` — is imported by :func:`import_user_module` (or, for a verifiers
environment, loaded inside :func:`user_code`), by the same rules:

* the current directory is searched first, as ``python -m`` does, so a module beside the
  command works without ``PYTHONPATH``;
* a module is imported only because the user named it on the command line (or in
  Python); a run directory never names code that ppokit imports, so resuming a run
  trained with a part of the user's names the module again — :func:`resume_flags` gives
  the flags for the resume command ppokit prints;
* whatever the module raises while it is imported or its object is made — ``SystemExit``
  included (a module that calls ``sys.exit()`` would otherwise end ppokit silently), Ctrl-C
  aside — is a one-line :class:`UserCodeError` naming the flag, the module and what it
  raised; a module that is not there is a :class:`UsageError` saying where ppokit looked.
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

__all__ = ["import_modules", "import_user_module", "user_code", "search_cwd", "raised",
           "resume_flags", "reading_run", "names_checked", "require"]

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


def search_cwd() -> str:
    """Put the current directory first on the module search path (unless it is on it
    already), as ``python -m`` does; it stays there, so that a module imported from it
    can import its neighbours later. Returns the directory."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return cwd


def raised(exc: BaseException) -> str:
    """What the user's code raised, in a few words: ``Type: first line``."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


@contextlib.contextmanager
def user_code(where: str, what: str) -> Iterator[None]:
    """Run the user's code (importing a module, making its environment): anything it
    raises — ``SystemExit`` included, Ctrl-C aside — becomes a one-line
    :class:`UserCodeError` ``WHERE: WHAT raised TYPE: MESSAGE``; ppokit's own errors pass."""
    search_cwd()
    try:
        yield
    except UsageError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code, said once
        raise UserCodeError(f"{where}: {what} raised {raised(exc)}") from exc


def import_user_module(module: str, where: str, of: str | None = None):
    """Import the user's ``module`` (named with the flag ``where``; ``of`` is the whole
    value it came in, e.g. ``mymod:MyEnv-v0``) by the rules of this module's doc, and
    return it."""
    of_text = f" of {of!r}" if of and of != module else ""
    if not module or not all(p.isidentifier() for p in module.split(".")):
        raise UsageError(f"{where}: expected a Python module name such as my_module or "
                         f"pkg.module{of_text}, got {module!r}")
    cwd = search_cwd()
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise UsageError(f"{where}: cannot import module {module!r}{of_text}: there is "
                             f"no such module on the Python path or in {cwd}") from None
        raise UserCodeError(f"{where}: cannot import module {module!r}{of_text} (it raised "
                            f"{raised(exc)})") from exc
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module, said once
        raise UserCodeError(f"{where}: cannot import module {module!r}{of_text} (it raised "
                            f"{raised(exc)})") from exc


def _names(spec: str | Iterable[str] | None) -> list[str]:
    if spec is None:
        return []
    items = [spec] if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for item in items:
        out += [p.strip() for p in str(item).split(",") if p.strip()]
    return out


def import_modules(spec: str | Iterable[str] | None, flag: str = "--import") -> list[str]:
    """Import each module of ``spec`` (names, comma-separated or repeated) with
    :func:`import_user_module`. Returns the names imported."""
    names = _names(spec)
    for mod in names:
        if not all(p.isidentifier() for p in mod.split(".")):
            raise UsageError(f"{flag}: expected a Python module name such as my_losses or "
                             f"pkg.losses, got {mod!r}")
    for mod in names:
        import_user_module(mod, flag)
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
