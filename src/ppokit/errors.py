"""The errors the command line reports as one line, and the exit status of each.

* :class:`UsageError` (a ``ValueError``): bad input from the user — a bad option value, an
  unknown name, a missing or unreadable file. Exit status 2.
* :class:`UserCodeError` (a :class:`UsageError`): the user's own code — an environment, a
  reward function, a factory, a chat template — raised or returned something it must not.
  The line names the code, the call and what was expected; the user's traceback is the
  exception's ``__cause__``, printed only with ``ppokit --debug`` or ``PPOKIT_DEBUG=1``.
  Exit status 2.
* :class:`Fault`: the machine failed an operation ppokit needed — the disk is full, a
  file-size limit was hit. The line names the path, how much was needed, and what is still
  intact. Exit status 74 (``EX_IOERR`` of sysexits.h), so that a script can tell a fault
  from bad input.

Every other exception is a bug in ppokit and keeps its traceback.
"""

from __future__ import annotations

import errno as _errno
import os

__all__ = ["UsageError", "UserCodeError", "Fault", "FAULT_EXIT", "debug_enabled",
           "with_suffix", "write_fault", "fault_remedy", "WRITE_FAULTS", "extra_hint",
           "require_extra", "require_extras", "JOB_EXTRAS"]

FAULT_EXIT = 74  # EX_IOERR
# the write failures that are the machine's, not the user's input or ppokit's logic
WRITE_FAULTS = frozenset({_errno.ENOSPC, _errno.EDQUOT, _errno.EFBIG})


class UsageError(ValueError):
    """Bad input from the user: a bad option value, an unknown name, a missing file."""


def extra_hint(extra: str) -> str:
    """How to install one of ppokit's extras (from the package index; from a clone,
    ``pip install -e '.[EXTRA]'`` does the same)."""
    return f"pip install 'ppokit[{extra}]'"


# one extra per job that needs several (pyproject.toml defines each as their union)
JOB_EXTRAS = {"smollm2": ("llm", "gguf")}


def require_extra(modules: str | tuple[str, ...], extra: str, what: str) -> None:
    """A :class:`UsageError` naming ``what`` needs and how to install it, unless every
    module of ``modules`` can be imported."""
    require_extras([(extra, (modules,) if isinstance(modules, str) else modules)], what)


def require_extras(needs: list[tuple[str, tuple[str, ...]]], what: str) -> None:
    """One :class:`UsageError` naming every extra of ``needs`` (``(extra, modules)``
    pairs) that is missing, and one install line for them all (the job's extra of
    :data:`JOB_EXTRAS` when they are its parts), unless every module can be imported."""
    import importlib.util

    missing: dict[str, list[str]] = {}
    for extra, modules in needs:
        absent = [m for m in modules if importlib.util.find_spec(m) is None]
        if absent:
            missing[extra] = absent
    if not missing:
        return
    names = list(missing)
    mods = [m for absent in missing.values() for m in absent]
    if len(names) == 1:
        line, which = extra_hint(names[0]), f"the {names[0]} extra"
    else:
        job = next((j for j, parts in JOB_EXTRAS.items() if set(parts) == set(names)),
                   ",".join(names))
        line = extra_hint(job)
        which = f"the {', '.join(names[:-1])} and {names[-1]} extras"
    verb = "is" if len(mods) == 1 else "are"
    raise UsageError(f"{what} needs {which}: {line} ({', '.join(mods)} {verb} not "
                     "installed)")


class UserCodeError(UsageError):
    """The user's own code (environment, reward function, factory, template) failed or
    returned something it must not; ``__cause__`` holds what it raised, if anything."""


class Fault(Exception):
    """An operation failed because of the machine (a full disk, a file-size limit); what
    was saved before is intact. The command line exits with :data:`FAULT_EXIT`."""

    exit_code = FAULT_EXIT


def debug_enabled() -> bool:
    """Whether the user asked for tracebacks of their own code (``PPOKIT_DEBUG=1``; the
    command line's ``--debug`` sets it)."""
    return os.environ.get("PPOKIT_DEBUG", "") not in ("", "0")


def with_suffix(exc: BaseException, suffix: str) -> BaseException:
    """A copy of a one-line error (:class:`UsageError`, :class:`Fault`) with ``suffix``
    appended to its message; the user's traceback (``__cause__``) and attributes stay."""
    new = type(exc)(f"{exc}{suffix}")
    new.__dict__.update(exc.__dict__)
    new.__cause__ = exc.__cause__
    return new


def write_fault(exc: OSError, path, needed: int | None = None) -> Fault:
    """The :class:`Fault` of a write of ``needed`` bytes to ``path`` that failed with
    ``exc`` (one of :data:`WRITE_FAULTS`): which path, what the system said, how much was
    being written and how much is free there."""
    import shutil

    what = {_errno.ENOSPC: "no space left on the device",
            _errno.EDQUOT: "disk quota exceeded",
            _errno.EFBIG: "file too large (a file-size limit, e.g. ulimit -f)"}.get(
        exc.errno, exc.strerror or str(exc))
    parts = []
    if needed is not None:
        parts.append(f"writing {_size(needed)}")
    if exc.errno != _errno.EFBIG:
        try:
            free = shutil.disk_usage(os.path.dirname(os.path.abspath(path)) or ".").free
            parts.append(f"{_size(free)} free there")
        except OSError:
            pass
    detail = f" ({', '.join(parts)})" if parts else ""
    fault = Fault(f"{path}: {what}{detail}")
    fault.errno = exc.errno
    fault.path = str(path)
    return fault


def fault_remedy(exc: BaseException) -> str:
    """What the user does about a :class:`Fault` before running again."""
    if getattr(exc, "errno", None) == _errno.EFBIG:
        return "raise the file-size limit"
    return "free space"


def _size(n: int) -> str:
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} bytes"
