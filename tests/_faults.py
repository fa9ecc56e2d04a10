"""Test helpers shared by the run-directory tests: snapshots of a tree and a stand-in
for the process dying at the k-th file-system step of a checkpoint write."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import ppokit.io.checkpoint as ckmod


def _snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links as links) with a digest of its content; the lock
    file's content (the last holder's pid) is bookkeeping and left out."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if name == ".lock":
                continue
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


class _Crash(BaseException):
    """Stands for the process dying at this point (nothing after it runs)."""


class _FaultyOS:
    """``os`` for :mod:`ppokit.io.checkpoint` whose mutating calls crash at call ``k``."""

    def __init__(self, k: int | None):
        self.k, self.calls = k, 0

    def _step(self):
        self.calls += 1
        if self.k is not None and self.calls == self.k:
            raise _Crash

    def __getattr__(self, name):
        real = getattr(os, name)
        if name in ("replace", "mkdir", "open", "fsync", "rename"):
            def wrapped(*a, **kw):
                self._step()
                return real(*a, **kw)
            return wrapped
        return real


def _count_and_crash(monkeypatch, k):
    fake = _FaultyOS(k)
    monkeypatch.setattr(ckmod, "os", fake)
    real_rmtree = ckmod.shutil.rmtree

    class _Shutil:
        @staticmethod
        def rmtree(*a, **kw):
            fake._step()
            return real_rmtree(*a, **kw)

    monkeypatch.setattr(ckmod, "shutil", _Shutil)
    return fake


def count_write_steps(monkeypatch, write) -> int:
    """How many file-system steps one checkpoint write (``write()``) takes."""
    fake = _count_and_crash(monkeypatch, None)
    write()
    monkeypatch.undo()
    return fake.calls
