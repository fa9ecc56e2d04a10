"""Whole training runs as Ray tasks (``ppokit train --seeds … --backend ray``).

A task runs ``ppokit train`` in the Ray worker's own process, into a temporary directory of
the node it was placed on, and returns the exit status, the command's output and the run
directory packed as a tar archive (metrics, configuration, evaluation, plot, checkpoints;
a few hundred KiB for the MLP policies). The driver unpacks it where a local run would
have written it, so the summary and the plot are made exactly as for local runs. The run
directories need no shared file system; what the command line names is read where the task
runs, so a ``--config FILE`` or a ``--env module:Id`` must exist on every node (the same
path, the same module).

Unpacking accepts regular files and directories only, inside the destination (no links,
devices or absolute paths); nothing in an archive is ever imported or executed.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from ppokit.errors import UsageError

__all__ = ["train_task", "unpack_run", "MAX_ARCHIVE"]

MAX_ARCHIVE = 1 << 30  # bytes of one returned run directory


def train_task(argv: list[str], env_id: str | None) -> tuple[int, str, bytes]:
    """Run ``ppokit train ARGV --run-dir TMP`` here; ``(exit status, output, tar of TMP)``."""
    import contextlib
    import tempfile

    import torch

    from ppokit.cli import main
    from ppokit.envs.source import import_env_module

    torch.set_num_threads(1)
    out = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="ppokit-task-") as tmp:
        run_dir = os.path.join(tmp, "run")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                if env_id is not None:
                    import_env_module(env_id, "--env")  # named by the user on the driver
                rc = main(["train", *argv, "--run-dir", run_dir])
            except SystemExit as exc:  # argparse
                rc = exc.code if isinstance(exc.code, int) else 2
            except Exception as exc:  # noqa: BLE001 - reported as the run's failure
                print(f"{type(exc).__name__}: {exc}")
                rc = 1
        buf = io.BytesIO()
        if os.path.isdir(run_dir):
            with tarfile.open(fileobj=buf, mode="w:gz") as tar:
                tar.add(run_dir, arcname=".")
        return rc, out.getvalue(), buf.getvalue()


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
