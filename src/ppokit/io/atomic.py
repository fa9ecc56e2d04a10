"""Crash-safe file writes and link-proof file reads inside run directories.

Writes go to a fresh temporary file in the same directory (created exclusively, never
through a link), are fsync'ed, renamed over the target and the directory fsync'ed: readers
see the old file or the new one, and a symbolic link at the target is replaced, never
written through. Reads open the path without following a final symbolic link and accept
only regular files (a FIFO or a device would hang or never end), with a size bound.

Files the user names on the command line or in Python (a ``--config`` or ``--search`` file,
prompts, preference pairs, demonstrations) are read by :func:`read_named_file` with the
same rules but one: a link the user named is followed (it is their path, not a run
directory's content). Each is refused in one line naming the flag when it is not a regular
file or larger than its bound.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from ppokit.errors import WRITE_FAULTS, UsageError, write_fault

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_write_lines", "fsync_dir",
           "read_regular", "read_named_file", "read_named_text", "check_named_file", "open_append",
           "replace_dir", "MAX_SMALL_FILE", "MAX_DATA_FILE", "MAX_NESTING", "check_nesting"]

# JSON side files (config.json, state.json, manifest.json, eval.json) are far below this
MAX_SMALL_FILE = 16 * 2**20
# prompts, preference pairs, demonstrations: read whole and kept as Python objects
MAX_DATA_FILE = 1 * 2**30
# tables and lists inside one another in a configuration file or a data row
MAX_NESTING = 64

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory's entries (the rename) to disk. Some filesystems refuse to open
    or fsync a directory; there the rename's durability is the filesystem's own, and the
    write stays atomic either way."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # not supported for directories here: see the docstring
        return
    finally:
        os.close(fd)


def _exclusive(path: Path) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    try:
        return os.open(path, flags, 0o644)
    except FileExistsError:  # a leftover of a killed writer (or a planted link): replace it
        path.unlink()
        return os.open(path, flags, 0o644)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` by ``data`` so that readers see either the old or the new file."""
    atomic_write_lines(path, (data,))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_lines(path: str | os.PathLike, chunks: Iterable[bytes | str]) -> None:
    """Replace ``path`` by the concatenation of ``chunks`` (text is UTF-8 encoded), written
    as they come: readers see either the old or the whole new file. A full disk or a
    file-size limit is a :class:`ppokit.errors.Fault` naming the path and how much was
    being written; the old file is then unchanged."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    written = 0
    try:
        fd = _exclusive(tmp)
        with os.fdopen(fd, "wb") as fh:
            for c in chunks:
                c = c.encode() if isinstance(c, str) else c
                written += len(c)
                fh.write(c)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno in WRITE_FAULTS:
            raise write_fault(exc, path, written) from exc
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def open_regular(path: Path, flags: int) -> int:
    """``os.open`` that refuses a final symbolic link and anything but a regular file."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if os.path.islink(path):
            raise UsageError(f"{path}: is a symbolic link; ppokit does not follow links "
                             "inside a run directory") from None
        raise UsageError(f"{path}: cannot open ({exc.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UsageError(f"{path}: not a regular file")
    os.set_blocking(fd, True)
    return fd


def read_regular(path: str | os.PathLike, max_size: int = MAX_SMALL_FILE) -> bytes:
    """The bytes of a regular file (no link, no FIFO or device) of at most ``max_size``."""
    path = Path(path)
    fd = open_regular(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_size:
            raise UsageError(f"{path}: {size} bytes, more than the {max_size} expected")
        data = fh.read(size + 1)  # fstat's size (a growing file is cut below)
    if len(data) > max_size:
        raise UsageError(f"{path}: more than the {max_size} bytes expected")
    return data


def _open_named(path: str | os.PathLike, flag: str, max_size: int, what: str) -> int:
    """A read-only descriptor of the regular file ``path`` of at most ``max_size`` bytes
    (a link to one is followed); else a one-line :class:`UsageError` naming ``flag``."""
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | _CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise UsageError(f"{flag}: no such file {name!r}") from None
    except IsADirectoryError:
        raise UsageError(f"{flag}: {name!r} is a directory, expected a {what}") from None
    except OSError as exc:
        raise UsageError(f"{flag}: cannot open {name!r} ({exc.strerror})") from None
    st = os.fstat(fd)
    problem = None
    if stat.S_ISDIR(st.st_mode):
        problem = f"{flag}: {name!r} is a directory, expected a {what}"
    elif not stat.S_ISREG(st.st_mode):
        problem = (f"{flag}: {name!r} is not a regular file (a FIFO, a device or a socket "
                   f"is never read), expected a {what}")
    elif st.st_size > max_size:
        problem = (f"{flag}: {name!r} has {st.st_size} bytes, more than the {max_size} a "
                   f"{what} may have")
    if problem is not None:
        os.close(fd)
        raise UsageError(problem)
    os.set_blocking(fd, True)
    return fd


def check_named_file(path: str | os.PathLike, flag: str, max_size: int = MAX_DATA_FILE,
                     what: str = "file") -> None:
    """Refuse, as :func:`read_named_file` would, a file another library is to read."""
    os.close(_open_named(path, flag, max_size, what))


def read_named_file(path: str | os.PathLike, flag: str, max_size: int = MAX_SMALL_FILE,
                    what: str = "file") -> bytes:
    """The bytes of a file the user named with ``flag``: a regular file (a link to one is
    followed; a FIFO, a device or a directory is refused at once, never read) of at most
    ``max_size`` bytes. Every refusal is a one-line :class:`UsageError` naming ``flag``."""
    name = os.fspath(path)
    with os.fdopen(_open_named(path, flag, max_size, what), "rb") as fh:
        try:
            data = fh.read(max_size + 1)
        except OSError as exc:
            raise UsageError(f"{flag}: cannot read {name!r} ({exc.strerror})") from None
    if len(data) > max_size:
        raise UsageError(f"{flag}: {name!r} has more than the {max_size} bytes a {what} may "
                         "have")
    return data


def read_named_text(path: str | os.PathLike, flag: str, max_size: int = MAX_DATA_FILE,
                    what: str = "file") -> str:
    """:func:`read_named_file` decoded as UTF-8 (a file that is not: one line naming
    ``flag`` and where the first bad byte is)."""
    data = read_named_file(path, flag, max_size, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise UsageError(f"{flag}: {os.fspath(path)} is not UTF-8 text (line {line}, byte "
                         f"{exc.start})") from None


def check_nesting(value, where: str, limit: int = MAX_NESTING) -> None:
    """Refuse (one line naming ``where``) lists and tables nested more than ``limit``
    deep; walked without recursion."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            items = v.values()
        elif isinstance(v, (list, tuple)):
            items = v
        else:
            continue
        if depth > limit:
            raise UsageError(f"{where}: lists and tables nested more than {limit} deep")
        stack.extend((x, depth + 1) for x in items)


def open_append(path: str | os.PathLike, encoding: str = "utf-8"):
    """A text file opened for appending, created if missing; never through a link."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_APPEND
    if not os.path.lexists(path):
        flags |= os.O_CREAT
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC, 0o644)
    else:
        fd = open_regular(path, flags)
    return os.fdopen(fd, "a", encoding=encoding)


def replace_dir(tmp: str | os.PathLike, final: str | os.PathLike) -> None:
    """Put the complete directory ``tmp`` in place of ``final``. Whatever stood at
    ``final`` (a directory, a file, a link) is moved aside first and removed after; a link
    is removed as a link, never followed."""
    tmp, final = Path(tmp), Path(final)
    trash = None
    if os.path.lexists(final):
        if final.is_symlink() or not final.is_dir():
            final.unlink()
        else:
            trash = final.with_name(f".trash-{final.name}-{os.getpid()}")
            if os.path.lexists(trash):
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(final, trash)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
