"""Launchers and the processes they start: no process outlives its launcher.

ppokit's launchers (``ppokit train --seeds``, ``ppokit llm train --nproc``) start ppokit
processes that write run directories. Two rules hold between them:

* **A signal to the launcher reaches every child once.** The children run in process
  groups of their own (a Ctrl-C at the terminal reaches only the launcher), and the
  launcher forwards the SIGINT or SIGTERM it receives to each of them: each finishes its
  iteration, writes a checkpoint and ends with 130 / 143; the launcher waits for them and
  ends with the same status and the command that resumes. A second signal is forwarded
  too, and stops the children at once (their last checkpoint stays intact).
* **A child ends when its launcher ends**, however the launcher ends (``kill -9``
  included). The launcher hands its children ``PPOKIT_SUPERVISOR=<pid>:<start time>``; a
  ppokit process that finds it (:func:`follow_supervisor`, called by the ``ppokit``
  command before anything else) asks Linux to send it :data:`PARENT_GONE` when its parent
  dies (``prctl(PR_SET_PDEATHSIG)``) when the launcher is its parent, and otherwise (or
  where ``prctl`` is missing) watches the launcher's pid from a thread. Either way the
  child then stops as at a first SIGTERM: while training, it writes a checkpoint at its
  next iteration boundary and ends with 143; before training has started, at once (a start
  not finished is undone). A signal of its own is used, not SIGTERM itself, because Linux
  sends the parent-death signal again each time a thread of a multi-threaded parent ends
  (torchrun's launcher has several): those repeats must not count as the "second signal"
  that stops a run at once, without its checkpoint. The start time guards against a pid
  the system has reused; a child whose launcher is already gone when it starts stops at
  once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

__all__ = ["ENV", "PARENT_GONE", "supervisor_token", "follow_supervisor", "ChildGroup",
           "SignalForwarder"]

ENV = "PPOKIT_SUPERVISOR"
PR_SET_PDEATHSIG = 1
PARENT_GONE = signal.SIGUSR2  # what a follower gets when its launcher has ended
_POLL_S = 0.5


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks after boot, from /proc), or None when
    there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data.rsplit(b")", 1)[-1].split()
    return fields[19].decode() if len(fields) > 19 else None


def _alive(pid: int, start: str | None) -> bool:
    if start is not None and os.path.isdir("/proc"):
        return _start_time(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def supervisor_token() -> str:
    """This process as a supervisor: ``"<pid>:<start time>"`` (the value of :data:`ENV`)."""
    pid = os.getpid()
    return f"{pid}:{_start_time(pid) or ''}"


def set_parent_death_signal(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent thread ends."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stop_self() -> None:
    os.kill(os.getpid(), PARENT_GONE)


ENDING = threading.Event()  # main() has returned: the interpreter's exit is under way


def stop_by_signal(signum: int) -> None:
    """End the process for ``signum`` (status 128 + signum): by ``SystemExit`` while a
    command runs, so that the cleanup that undoes a start not finished runs; at once and
    quietly once :func:`main` has returned, when the exit's own finalizers (``atexit``,
    torch.distributed's) run — an exception raised in one of those is only printed, as a
    traceback of an ignored exception, and the finalizer goes on."""
    if not ENDING.is_set():
        raise SystemExit(128 + signum)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(128 + signum)


def _parent_gone(signum, frame) -> None:
    """The launcher has ended: stop as at a first SIGTERM (later repeats are ignored)."""
    from ppokit.io.signals import request_stop, training

    signal.signal(PARENT_GONE, signal.SIG_IGN)
    if training():
        request_stop(signal.SIGTERM)  # a checkpoint at the iteration boundary, then 143
        return
    stop_by_signal(signal.SIGTERM)  # not training yet: nothing to keep


def _watch(pid: int, start: str | None) -> None:
    """Block until process ``pid`` has ended, then send this process :data:`PARENT_GONE`."""
    fd = None
    try:
        fd = os.pidfd_open(pid)  # Linux 5.3+: readable once the process has ended
    except (AttributeError, OSError):
        fd = None
    if fd is not None and _alive(pid, start):  # (the pid was not reused meanwhile)
        import select

        try:
            select.select([fd], [], [])
        finally:
            os.close(fd)
    else:
        if fd is not None:
            os.close(fd)
        import time

        while _alive(pid, start):
            time.sleep(_POLL_S)
    _stop_self()


def follow_supervisor() -> None:
    """Stop this process when the launcher named by :data:`ENV` ends. The variable
    is removed, so that processes this one starts (environment workers) do not follow the
    launcher themselves: they end with this process."""
    token = os.environ.pop(ENV, None)
    if not token:
        return
    pid_text, _, start = token.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return
    start = start or None
    if threading.current_thread() is threading.main_thread():
        signal.signal(PARENT_GONE, _parent_gone)
    if os.getppid() == pid and set_parent_death_signal(PARENT_GONE):
        if os.getppid() != pid:  # the launcher died before prctl: nothing would tell us
            _stop_self()
        return
    if not _alive(pid, start):
        _stop_self()
        return
    threading.Thread(target=_watch, args=(pid, start), name="ppokit-supervisor-watch",
                     daemon=True).start()


class SignalForwarder:
    """While entered (main thread), SIGINT and SIGTERM are recorded in :attr:`signum` and
    passed to ``forward(signum)``; a second one is passed on too (children treat it as
    "stop at once"). The launcher's loop checks :attr:`signum` to stop starting work."""

    def __init__(self, forward):
        self.forward = forward
        self.signum: int | None = None
        self.count = 0
        self._old: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        self.signum = self.signum or signum
        self.count += 1
        self.forward(signum)

    def __enter__(self) -> SignalForwarder:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()


class ChildGroup:
    """The ppokit processes one launcher started: each in its own process group, told to
    follow this process (:func:`follow_supervisor`); :meth:`signal` sends all that still
    run a signal."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def start(self, cmd: list[str], **popen_kwargs) -> subprocess.Popen:
        env = dict(popen_kwargs.pop("env", None) or os.environ)
        env[ENV] = supervisor_token()
        kw = {"process_group": 0} if sys.version_info >= (3, 11) else \
            {"preexec_fn": os.setpgrp}
        proc = subprocess.Popen(cmd, env=env, **kw, **popen_kwargs)
        self.procs.append(proc)
        return proc

    def running(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p.poll() is None]

    def signal(self, signum: int) -> None:
        for p in self.running():
            try:
                p.send_signal(signum)
            except ProcessLookupError:
                pass
