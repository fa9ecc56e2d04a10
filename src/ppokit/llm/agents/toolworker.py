"""Where a user's tool runs: worker processes the trainer can stop.

A tool the user gives (a ``module:function``, or a function passed in Python) runs in a
worker process forked from the trainer, so that it holds the very function the trainer
has; a small pool of them (:data:`WORKERS`) answers the calls of a turn, one call at a
time each. What bounds a call:

* **time** — a call not answered within the time limit is stopped: its worker is killed
  with its process group (whatever the tool started) and the next call forks a new one;
* **memory** — a worker's address space may grow by :data:`WORKER_MEMORY` bytes past what
  it inherited (``RLIMIT_AS``); past that the tool's allocation fails, which its reply
  names;
* **the reply** — the worker turns the result into text and sends back at most the
  caller's limit of characters and the length of the whole (:func:`reply_parts`);
* **its state** — what the tool changes in Python's objects stays in its worker (a call
  may be answered by either worker; a new worker starts from the trainer's state);
* **its life** — a worker ends when the trainer does: :meth:`ToolWorkers.close` (the
  trainer's close, and the interpreter's exit) kills it, Linux kills it when the thread
  that forked it ends however it ends (``prctl(PR_SET_PDEATHSIG)``), and while idle it
  checks its parent every second.

A tool that raises (``SystemExit`` and ``KeyboardInterrupt`` included), returns ``None``
or a value whose ``str()`` raises, ends its process (``os._exit``) or is killed gives an
error reply; the trainer goes on.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import warnings
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, Pipe, wait

__all__ = ["WORKERS", "WORKER_MEMORY", "ToolWorkers", "reply_parts", "describe",
           "call_tool"]

WORKERS = 2  # calls of one turn answered at once
WORKER_MEMORY = 2 << 30  # bytes a worker may add to the address space it inherits
_IDLE_POLL_S = 1.0


def describe(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` of ``exc`` (the message cut to ``limit`` characters)."""
    try:
        msg = str(exc)
    except BaseException:  # noqa: BLE001 - a message that cannot be shown
        msg = "(its message cannot be shown)"
    msg = msg if len(msg) <= limit else msg[:limit] + "…"
    name = type(exc).__name__[:100]
    return f"{name}: {msg}" if msg else name


def reply_parts(value, limit: int) -> tuple[str, str, int, str]:
    """``(status, body, rest, unit)`` of a tool's result: a string's first ``limit``
    characters; bytes' first ``limit`` bytes decoded as UTF-8 (a byte that is not,
    replaced by U+FFFD); any other value's ``str()`` cut the same way; ``rest`` how many
    characters (bytes) were left out. ``None``, or a ``str()`` that raises, is an error."""
    if value is None:
        return ("error", "returned None (a tool returns its reply: a string, a number or "
                "bytes)", 0, "chars")
    if isinstance(value, (bytes, bytearray)):
        data = bytes(value[:limit])
        return "ok", data.decode("utf-8", "replace"), len(value) - len(data), "bytes"
    try:
        text = value if type(value) is str else str(value)
        body = str.__getitem__(text, slice(0, limit))
        return "ok", body, str.__len__(text) - len(body), "chars"
    except BaseException as exc:  # noqa: BLE001 - the model reads what went wrong
        return "error", f"returned a {type(value).__name__[:100]} whose text cannot be " \
            f"made: {describe(exc)}", 0, "chars"


def call_tool(fn: Callable, args: tuple, kwargs: dict, limit: int,
              catch: type[BaseException] = BaseException) -> tuple[str, str, int, str]:
    """:func:`reply_parts` of ``fn(*args, **kwargs)``, or the error it raised (of the
    kind ``catch``: in a worker everything, SystemExit too; in the trainer's process an
    Exception, so that a second Ctrl-C still stops the run)."""
    try:
        value = fn(*args, **kwargs)
    except catch as exc:  # noqa: BLE001 - the model reads what went wrong
        return "error", f"raised {describe(exc)}", 0, "chars"
    return reply_parts(value, limit)


def _limit_memory(extra: int) -> None:
    import resource

    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            size = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = size + extra
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)
        if soft == resource.RLIM_INFINITY or want < soft:
            resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (OSError, ValueError):
        pass  # no /proc: the time limit still bounds the call


def _serve(conn: Connection, parent: int, tools: dict[str, Callable]) -> None:
    """The worker's loop: answer each ``(name, args, kwargs, limit)`` with
    :func:`call_tool`'s tuple until the pipe closes or the parent is gone."""
    from ppokit.supervise import set_parent_death_signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer decides what a Ctrl-C does
    for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, signal.SIG_DFL)
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:  # the trainer ended before prctl
        return
    _limit_memory(WORKER_MEMORY)
    while True:
        try:
            if not conn.poll(_IDLE_POLL_S):
                if os.getppid() != parent:
                    return
                continue
            name, args, kwargs, limit = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(call_tool(tools[name], args, kwargs, limit))


class _Worker:
    """One forked worker and the trainer's end of its pipe."""

    def __init__(self, tools: dict[str, Callable], others: list[_Worker]):
        mine, theirs = Pipe()
        parent = os.getpid()
        for stream in (sys.stdout, sys.stderr):  # nothing buffered is written twice
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads about
            pid = os.fork()
        if pid == 0:  # the worker: never returns into the trainer's code
            try:
                mine.close()
                for w in others:
                    w.conn.close()
                _serve(theirs, parent, tools)
            finally:
                os._exit(0)
        theirs.close()
        try:
            os.setpgid(pid, pid)  # (also done by the worker: whichever runs first)
        except OSError:
            pass
        self.pid, self.conn, self.status, self.limit = pid, mine, None, 0

    def reap(self, block: bool) -> bool:
        """Whether the worker has ended (its status then in :attr:`status`)."""
        if self.status is None:
            try:
                pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid == 0:
                return False
            self.status = status
            self.conn.close()
        return True

    def kill(self) -> None:
        """Kill the worker and its process group, and reap it (once: a pid reaped may
        already be another process's)."""
        if self.status is not None:
            return
        for kill in (os.killpg, os.kill):
            try:
                kill(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.reap(block=True)

    def ended(self) -> str:
        """What became of the worker, for the reply (it closed its end of the pipe: it
        has ended, or is killed here after a second)."""
        for _ in range(100):
            if self.reap(block=False):
                break
            time.sleep(0.01)
        else:
            self.kill()
            return "closed its connection to the trainer"
        if os.WIFSIGNALED(self.status):
            sig = os.WTERMSIG(self.status)
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = str(sig)
            return f"was killed by {name}"
        return f"ended its process (exit status {os.waitstatus_to_exitcode(self.status)})"


def _kill_all(workers: list[_Worker]) -> None:
    for w in workers:
        w.kill()
    workers.clear()


class ToolWorkers:
    """The worker processes of a run's tools (module doc)."""

    def __init__(self, tools: dict[str, Callable], size: int = WORKERS):
        if not hasattr(os, "fork"):
            from ppokit.errors import UsageError

            raise UsageError("tools: a tool runs in a worker process, which needs os.fork "
                             "(Linux or macOS)")
        self.tools, self.size = dict(tools), max(1, int(size))
        self.idle: list[_Worker] = []
        self.all: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _kill_all, self.all)

    def _worker(self) -> _Worker:
        while self.idle:
            w = self.idle.pop()
            if not w.reap(block=False):
                return w
            self.all.remove(w)
        w = _Worker(self.tools, self.all)
        self.all.append(w)
        return w

    def _drop(self, w: _Worker) -> None:
        w.kill()
        if w in self.all:
            self.all.remove(w)

    def run(self, jobs: list[tuple[str, tuple, dict, int]], time_limit: float
            ) -> list[tuple[str, str, int, str]]:
        """Each job ``(name, args, kwargs, limit)`` answered as :func:`reply_parts` does,
        or ``("timeout", ...)`` / ``("error", ...)`` when the call overran or its worker
        ended; at most :attr:`size` calls at a time."""
        out: list = [None] * len(jobs)
        queue = list(range(len(jobs)))
        busy: dict[Connection, tuple[_Worker, int, float]] = {}
        try:
            while queue or busy:
                self._start(jobs, queue, busy, out, time_limit)
                if busy:
                    self._collect(busy, out, time_limit)
        finally:  # (an exception out of here: no call is left running)
            for w, _, _ in busy.values():
                self._drop(w)
        return out

    def _start(self, jobs, queue, busy, out, time_limit) -> None:
        while queue and len(busy) < self.size:
            k = queue.pop(0)
            w = self._worker()
            w.limit = jobs[k][3]
            try:
                w.conn.send(jobs[k])
            except OSError:
                out[k] = ("error", w.ended(), 0, "chars")
                self._drop(w)
                continue
            busy[w.conn] = (w, k, time.monotonic() + time_limit)

    def _collect(self, busy, out, time_limit) -> None:
        """Wait for the first answer or deadline; take the answers, stop the overruns."""
        left = min(d for _, _, d in busy.values()) - time.monotonic()
        for conn in wait(list(busy), max(0.0, left)):
            w, k, _ = busy.pop(conn)
            try:
                # at most what a reply of the job's limit can take (4 bytes a character)
                out[k] = pickle.loads(conn.recv_bytes(8 * w.limit + 4096))
                self.idle.append(w)
            except (EOFError, OSError, pickle.UnpicklingError):
                out[k] = ("error", w.ended(), 0, "chars")
                self._drop(w)
        now = time.monotonic()
        for conn, (w, k, deadline) in list(busy.items()):
            if now >= deadline:
                del busy[conn]
                self._drop(w)
                out[k] = ("timeout", f"took longer than {time_limit:g} s", 0, "chars")

    def close(self) -> None:
        """Kill every worker (idle or busy) and reap it."""
        self.idle.clear()
        _kill_all(self.all)
