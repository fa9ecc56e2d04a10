"""Whole training runs as Ray tasks (``ppokit train --seeds … --backend ray``).

A task runs ``ppokit train`` in the Ray worker's own process, into a temporary directory of
the node it was placed on, and returns the exit status, the command's output and the run
directory packed as a tar archive (metrics, configuration, evaluation, plot, checkpoints;
a few hundred KiB for the MLP policies). The driver unpacks it where a local run would
have written it, so the summary and the plot are made exactly as for local runs. The run
directories need no shared file system; what the command line names is read where the task
runs, so a ``--config FILE`` or a ``--env module:Id`` must exist on every node (the same
path, the same module).

A task of a stopped launch continues: the driver sends the seed's run directory along
(:func:`pack_run`) and the task resumes it. The driver stops running tasks through a
:class:`StopFlag` actor that each task watches: the run inside writes a checkpoint at its
next iteration boundary and the task returns as usual, its run directory with it.

Unpacking accepts regular files and directories only, inside the destination (no links,
devices or absolute paths); nothing in an archive is ever imported or executed.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

from ppokit.errors import UsageError

__all__ = ["train_task", "unpack_run", "replace_run", "pack_run", "StopFlag", "MAX_ARCHIVE",
           "watch_stop_flag",
           "RUN_DIR", "CONFIG"]

MAX_ARCHIVE = 1 << 30  # bytes of one returned run directory
# placeholders in a task's arguments: its run directory and configuration file there
RUN_DIR = "{task_run_dir}"
CONFIG = "{task_config}"


class StopFlag:
    """A Ray actor the driver sets when it is stopped; running tasks watch it."""

    def __init__(self):
        self.signum: int | None = None

    def set(self, signum: int) -> None:
        self.signum = int(signum)

    def get(self) -> int | None:
        return self.signum


def watch_stop_flag(flag, done) -> None:
    """In a task: poll ``flag`` until ``done`` is set; a signal number there stops the run
    (:func:`ppokit.io.signals.request_stop`)."""
    import ray

    from ppokit.io.signals import request_stop

    while not done.wait(1.0):
        try:
            signum = ray.get(flag.get.remote())
        except Exception:  # noqa: BLE001 - the driver is gone: Ray ends this task itself
            return
        if signum:
            request_stop(signum)
            return


def train_task(entry: Callable[[list[str]], int], argv: list[str], env_id: str | None,
               config_text: str | None = None, archive: bytes | None = None,
               stop_flag=None) -> tuple[int, str, bytes]:
    """Run ``entry(ARGV)`` — the caller's ``ppokit train`` — here, its run directory a
    temporary one (``RUN_DIR`` in ``argv``; ``archive``: a run to resume unpacked there
    first; without ``RUN_DIR``, ``--run-dir`` is appended), ``config_text`` its
    ``--config`` file (``CONFIG`` in ``argv``). Returns ``(exit status, output, tar of
    the run directory)``."""
    import contextlib
    import tempfile
    import threading

    import torch

    from ppokit.envs.source import import_env_module
    from ppokit.io.signals import clear_stop_request

    torch.set_num_threads(1)
    out = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="ppokit-task-") as tmp:
        run_dir = os.path.join(tmp, "run")
        config = os.path.join(tmp, "config.toml")
        if config_text is not None:
            with open(config, "w", encoding="utf-8") as fh:
                fh.write(config_text)
        if archive:
            unpack_run(archive, run_dir)
        if RUN_DIR in argv:
            argv = [run_dir if a == RUN_DIR else config if a == CONFIG else a for a in argv]
        else:
            argv = [*argv, "--run-dir", run_dir]
        done = threading.Event()
        clear_stop_request()
        if stop_flag is not None:
            threading.Thread(target=watch_stop_flag, args=(stop_flag, done),
                             daemon=True).start()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                if env_id is not None:
                    import_env_module(env_id, "--env")  # named by the user on the driver
                rc = entry(list(argv))
            except SystemExit as exc:  # argparse
                rc = exc.code if isinstance(exc.code, int) else 2
            except Exception as exc:  # noqa: BLE001 - reported as the run's failure
                print(f"{type(exc).__name__}: {exc}")
                rc = 1
            finally:
                done.set()
                clear_stop_request()
        return rc, out.getvalue(), pack_run(run_dir)


def pack_run(run_dir: str | Path) -> bytes:
    """A run directory as a gzip'ed tar archive (empty bytes when there is none); only
    directories and regular files go in (a link or a FIFO is left out)."""
    run_dir = str(run_dir)
    if not os.path.isdir(run_dir) or os.path.islink(run_dir):
        return b""

    def regular(info: tarfile.TarInfo):
        return info if info.isfile() or info.isdir() else None

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(run_dir, arcname=".", filter=regular)
    return buf.getvalue()


def replace_run(data: bytes, dest: str | Path) -> None:
    """Put the run directory archived in ``data`` in place of ``dest`` (an earlier copy of
    the same run, sent to a task that continued it), whole: unpacked beside it first."""
    from ppokit.io.atomic import replace_dir

    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.unpack-{os.getpid()}")
    if os.path.lexists(tmp):
        shutil.rmtree(tmp)
    unpack_run(data, tmp)
    replace_dir(tmp, dest)


def unpack_run(data: bytes, dest: str | Path) -> None:
    """Unpack a :func:`train_task` archive into ``dest`` (regular files and directories
    only, every path inside ``dest``)."""
    dest = Path(dest)
    if len(data) > MAX_ARCHIVE:
        raise UsageError(f"run archive: {len(data)} bytes, more than {MAX_ARCHIVE}")
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = []
        for m in tar.getmembers():
            target = (root / m.name).resolve()
            if not (m.isfile() or m.isdir()) or os.path.isabs(m.name) \
                    or (target != root and root not in target.parents):
                raise UsageError(f"run archive: refusing member {m.name!r}")
            members.append(m)
        unpacked = sum(m.size for m in members if m.isfile())
        if unpacked > MAX_ARCHIVE:  # compressed size alone does not bound this
            raise UsageError(f"run archive: {unpacked} bytes unpacked, more than "
                             f"{MAX_ARCHIVE}")
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12 / 3.11.4 and later
            tar.extractall(root, members=members, filter="data")
        else:  # the members were checked above: regular files and directories inside root
            tar.extractall(root, members=members)
