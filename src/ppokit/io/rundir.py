"""Run directories: one writer at a time, unique default names, no trace of a failed start.

A run that fails before its first checkpoint leaves nothing behind either: there is
nothing to resume, and a directory holding only its configuration and a few metrics would
block its own name. A run that fails later keeps every checkpoint it wrote, and its error
says which one is the last and how to resume (:func:`fail_run`).

A run directory is data. ppokit reads in it only the files it wrote (regular files, never
through a symbolic link, never a path that a file names) and imports nothing because a file
in it says so. It writes there only through this layer and :mod:`ppokit.io.atomic`: a file
is replaced whole (a link standing at its name is replaced, never written through), a file
appended to (``metrics.jsonl``, ``samples.jsonl``) or a directory written into
(``checkpoints/``, ``tb/``, ``wandb/``) that is a symbolic link is refused in one line
(:func:`run_subdir`, :func:`refuse_link`). Every process that writes a run directory
(training, resuming, an evaluation that writes ``eval.json``) holds :class:`RunLock` for
its whole life: an exclusive ``flock`` on ``RUN_DIR/.lock``, which the kernel releases when
the process ends however it ends, so a killed run never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import time
from pathlib import Path

from ppokit.errors import UsageError

__all__ = ["RunLock", "RunDir", "unique_run_dir", "parent_run_dir", "check_tree",
           "refuse_link", "run_subdir", "LINK_REFUSED",
           "holds_run", "is_llm_run_dir", "fail_run", "fail_start", "check_run_dir",
           "RESUME_HINT"]

LOCK_NAME = ".lock"
RESUME_HINT = {"env": "ppokit train --resume {run_dir}",
               "llm": "ppokit llm train --resume {run_dir}"}


LINK_REFUSED = "is a symbolic link; ppokit does not follow links inside a run directory"


def refuse_link(path: str | os.PathLike, what: str = "run dir") -> None:
    """A one-line :class:`UsageError` ``WHAT: PATH is a symbolic link; ...`` when ``path``
    is one (ppokit neither reads nor writes through a link inside a run directory)."""
    if os.path.islink(path):
        raise UsageError(f"{what}: {path} {LINK_REFUSED}")


def run_subdir(run_dir: str | os.PathLike, name: str, what: str = "run dir") -> Path:
    """``run_dir/name``, a directory ppokit writes into (TensorBoard's ``tb/``, W&B's
    ``wandb/``), created if missing; refused in one line when it is a symbolic link or
    not a directory, so that nothing is written outside the run directory through it."""
    path = Path(run_dir) / name
    refuse_link(path, what)
    if os.path.lexists(path) and not path.is_dir():
        raise UsageError(f"{what}: {path} is not a directory")
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{what}: cannot create {path} ({exc.strerror})") from None
    refuse_link(path, what)
    return path


def _name_ok(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("._") or "run"


class RunLock:
    """Exclusive, non-blocking lock on a run directory for the life of this object (or of
    the process). A second writer gets :class:`UsageError` naming the holder's pid."""

    def __init__(self, run_dir: str | os.PathLike, purpose: str = "train"):
        self.run_dir = Path(run_dir)
        path = self.run_dir / LOCK_NAME
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            raise UsageError(f"run dir: cannot create {path} ({exc.strerror})") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UsageError(f"run dir: {path} is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").split()
            os.close(fd)
            who = f"pid {holder[0]}" if holder else "another process"
            what = f" ({holder[1]})" if len(holder) > 1 else ""
            raise UsageError(f"run dir: {self.run_dir} is in use by {who}{what}; wait for it "
                             "to finish or stop it first") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {purpose}\n".encode(), 0)
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:  # pragma: no cover - the process end releases it too
        try:
            self.release()
        except Exception:  # noqa: BLE001
            pass


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` already holds (part of) a run."""
    return any(os.path.lexists(run_dir / n) for n in ("config.json", "metrics.jsonl",
                                                       "checkpoints"))


def check_run_dir(run_dir: str | os.PathLike, flag: str = "RUN_DIR") -> Path:
    """``run_dir`` if it is a directory that holds a run ppokit wrote; else a one-line
    :class:`UsageError` naming ``flag``: no such directory, not a run directory, or a
    ``config.json`` that is not the run configuration ppokit writes there (a JSON object)."""
    import json

    from .atomic import MAX_SMALL_FILE, read_regular

    path = Path(run_dir)
    if not path.is_dir():
        raise UsageError(f"{flag}: no such run directory {str(path)!r}")
    if not holds_run(path):
        raise UsageError(f"{flag}: {path} is not a run directory (it holds no checkpoints/, "
                         "config.json or metrics.jsonl)")
    cfg = path / "config.json"
    if os.path.lexists(cfg):
        refuse_link(cfg, flag)
        try:
            doc = json.loads(read_regular(cfg, MAX_SMALL_FILE))
        except UsageError as exc:  # not a regular file, too large
            raise UsageError(f"{flag}: {exc}") from None
        except (ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict):
            found = "no valid JSON" if doc is None else f"a JSON {type(doc).__name__}"
            raise UsageError(f"{flag}: {cfg} is not a run configuration (ppokit writes a JSON "
                             f"object there, found {found}); this is not a run directory "
                             "ppokit wrote")
    return path


def is_llm_run_dir(run_dir: str | os.PathLike) -> bool:
    """A language-model run directory keeps its frozen starting policy in ``reference/``."""
    return (Path(run_dir) / "reference").is_dir()


def unique_run_dir(parent: str | os.PathLike, name: str) -> Path:
    """Create and return ``parent/name-<time>`` (``-2``, ``-3``, ... appended when a run
    started in the same second took it): two runs never share a default directory."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    base = f"{_name_ok(name)}-{time.strftime('%Y%m%d-%H%M%S')}"
    for k in range(1, 10_000):
        path = parent / (base if k == 1 else f"{base}-{k}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise UsageError(f"--run-dir: could not find a free name under {parent}")


def parent_run_dir(given: str | None, default_name: str, taken) -> Path:
    """The directory that holds several runs (``--seeds``, ``ppokit tune``): ``given``
    (``--run-dir``), created if missing, refused when it is not a directory or when
    ``taken(root)`` names what it already holds; else a new ``runs/default_name-<time>``."""
    if not given:
        return unique_run_dir("runs", default_name)
    root = Path(given)
    if os.path.lexists(root) and not root.is_dir():
        raise UsageError(f"--run-dir: {root} exists and is not a directory")
    held = taken(root)
    if held:
        raise UsageError(f"--run-dir: {held}; choose another directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--run-dir: cannot create {root} ({exc.strerror})") from None
    return root


class RunDir:
    """The run directory of one writing process: locked on entry; for a new run, checked
    empty of any earlier run; and removed again (what this process created of it) if the
    run fails before :meth:`started` is called (the trainers call it once their first
    checkpoint is written, or at once when they resume)."""

    def __init__(self, path: str | os.PathLike, *, new: bool, purpose: str = "train",
                 kind: str = "env", fresh: bool = False):
        self.path = Path(path)
        self.kind = kind
        if os.path.lexists(self.path) and not self.path.is_dir():
            raise UsageError(f"--run-dir: {self.path} exists and is not a directory")
        if not new and not self.path.is_dir():
            raise UsageError(f"--resume: no such run directory {str(self.path)!r}")
        self.created = fresh  # the caller made it for this run (unique_run_dir)
        if not self.path.exists():
            try:
                self.path.mkdir(parents=True)
            except FileExistsError:
                pass  # another process made it a moment ago: the lock decides
            except OSError as exc:
                raise UsageError(f"--run-dir: cannot create {self.path} ({exc.strerror})") \
                    from None
            else:
                self.created = True
        if new and not os.access(self.path, os.W_OK | os.X_OK):
            raise UsageError(f"--run-dir: {self.path} is not writable")
        self._before = set(os.listdir(self.path)) if not self.created else set()
        self.purpose = purpose
        self.lock = RunLock(self.path, purpose)
        self._live = True
        if new and holds_run(self.path):
            self.lock.release()
            raise UsageError(f"--run-dir: {self.path} already holds a run; resume it with "
                             f"`{RESUME_HINT[kind].format(run_dir=self.path)}` or choose "
                             "another directory")

    def started(self) -> None:
        """The run is under way: a later failure no longer removes anything."""
        self._live = False

    @property
    def live(self) -> bool:
        """Whether a failure now undoes the run (:meth:`abort` removes it)."""
        return self._live

    def abort(self) -> None:
        """Undo a failed start: remove what this process created, release the lock."""
        if self._live:
            self._live = False
            try:
                if self.created:
                    shutil.rmtree(self.path, ignore_errors=True)
                else:
                    for name in set(os.listdir(self.path)) - self._before:
                        p = self.path / name
                        if p.is_dir() and not p.is_symlink():
                            shutil.rmtree(p, ignore_errors=True)
                        else:
                            p.unlink(missing_ok=True)
            except OSError:
                pass
        self.lock.release()

    def reacquire(self) -> None:
        """Take the lock again (a trainer that trains once more after finishing)."""
        if not self.lock.held:
            self.lock = RunLock(self.path, self.purpose)

    def close(self) -> None:
        self.lock.release()


def _raise(new: BaseException, exc: BaseException):
    if new is exc:
        raise exc
    raise new from exc.__cause__  # (the user's traceback stays the cause)


def fail_run(exc: BaseException, rundir: RunDir, last_checkpoint: Path | None,
             resume: str):
    """Raise ``exc`` — training failed with it — saying what becomes of the run directory:
    before the first checkpoint the run is undone (:meth:`RunDir.abort`) and a one-line
    error (:class:`UsageError`, :class:`Fault`) says it was removed; after it the
    checkpoints stay and the line names the last one and ``resume``, the command that
    continues the run."""
    from ppokit.errors import Fault, fault_remedy, with_suffix

    path = getattr(rundir, "path", None)
    if getattr(rundir, "live", False):
        created = rundir.created
        rundir.abort()
        note = (f"; no checkpoint had been written, so {path} was removed" if created else
                f"; no checkpoint had been written, so what this run wrote in {path} was "
                "removed")
    elif last_checkpoint is not None and path is not None:
        then = f"{fault_remedy(exc)}, then resume" if isinstance(exc, Fault) else "resume"
        note = (f"; checkpoint {last_checkpoint.name} in {path} is intact: {then} with "
                f"`{resume}`")
    else:
        note = ""
    _raise(with_suffix(exc, note) if note and isinstance(exc, (UsageError, Fault)) else exc,
           exc)


def fail_start(exc: BaseException, rundir: RunDir, resume: bool):
    """Raise ``exc`` — a trainer's start failed with it — after undoing the start
    (:meth:`RunDir.abort`). A resume that failed on a full disk changed nothing (every file
    is replaced only once complete): the line says so."""
    from ppokit.errors import Fault, fault_remedy, with_suffix

    rundir.abort()
    new = exc
    if resume and isinstance(exc, Fault):
        new = with_suffix(exc, f"; nothing in {getattr(rundir, 'path', 'the run directory')} "
                               "was changed (files are replaced only once complete): "
                               f"{fault_remedy(exc)} and resume again")
    _raise(new, exc)


def check_tree(root: str | os.PathLike, what: str = "run dir") -> None:
    """Refuse a directory tree that holds anything but directories and regular files (a
    symbolic link, a FIFO, a device): ppokit reads only what it wrote."""
    root = Path(root)
    if root.name in ("policy", "reference", "checkpoints"):
        refuse_link(root, what)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            mode = os.lstat(p).st_mode
            if stat.S_ISLNK(mode):
                raise UsageError(f"{what}: {p} {LINK_REFUSED}")
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise UsageError(f"{what}: {p} is not a regular file")
