"""Atomic checkpoints that load without unpickling anything, for every kind of run.

Layout: ``RUN_DIR/checkpoints/iter_000000123/`` holding

* ``<group>.safetensors`` for each tensor group (``model``, ``optimizer``, ``rng``, …) and
  ``<group>.npz.safetensors`` for numpy-array groups (normaliser statistics, env buffers);
* ``state.json``: everything else (counters, optimiser hyper-parameters, RNG states that are
  plain numbers, environment state, the resolved config);
* ``manifest.json``, written last: the iteration and, for every other file, its size and
  SHA-256. Nothing in the directory is outside the manifest.

**Writing.** A checkpoint is built in a hidden temporary directory (each file fsync'ed),
renamed into place and the parent directory fsync'ed; only then are older checkpoints
retired (renamed to a hidden name, then deleted), so the newest published checkpoint is
never removed before its successor is complete. A crash at any moment leaves the previous
checkpoints intact and at most a hidden leftover, which the next writer cleans up.

**Reading.** :func:`find_checkpoint` walks the checkpoints newest first and returns the
first whose manifest verifies: its name matches its iteration, it holds exactly the
manifest's files, each a regular file (no links, no FIFOs) of the manifest's size and hash.
Damaged ones are reported (``log``) and skipped. Paths come only from ppokit's own naming
rule, never from a file's content.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load as np_load
from safetensors.numpy import save as np_save
from safetensors.torch import load as t_load
from safetensors.torch import save as t_save

from ppokit.errors import WRITE_FAULTS, UsageError, write_fault

from .atomic import MAX_SMALL_FILE, fsync_dir, read_regular

__all__ = ["save_checkpoint", "latest_checkpoint", "find_checkpoint", "load_checkpoint",
           "no_checkpoint_message", "set_aside_newer", "remove_leftovers",
           "list_checkpoints", "verify_checkpoint", "optimizer_to_flat", "optimizer_from_flat",
           "capture_rng", "restore_rng", "CheckpointError"]

_NAME = re.compile(r"^iter_(\d{9})$")
_FILE = re.compile(r"^[A-Za-z0-9_.-]+\.(safetensors|json)$")
MANIFEST = "manifest.json"
FORMAT = 2


class CheckpointError(ValueError):
    """A checkpoint that does not verify; the message says what is wrong with it."""


def _write(path: Path, data: bytes) -> dict:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                     | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        exc.needed = len(data)  # (for the message of a full disk)
        raise
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _json_default(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    raise TypeError(f"not JSON-serialisable: {type(v).__name__}")


def save_checkpoint(root: str | Path, iteration: int, *,
                    tensors: dict[str, dict[str, torch.Tensor]],
                    arrays: dict[str, dict[str, np.ndarray]],
                    state: dict[str, Any], keep: int = 2) -> Path:
    """Write checkpoint ``iteration`` under ``root`` atomically; keep the newest ``keep``."""
    if iteration < 0:
        raise ValueError(f"iteration: expected an integer >= 0, got {iteration}")
    from .rundir import refuse_link

    root = Path(root)
    refuse_link(root)  # (checkpoints/, best/): never written through a link
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter_{iteration:09d}"
    tmp = root / f".tmp-iter_{iteration:09d}-{os.getpid()}"
    if os.path.lexists(tmp):
        shutil.rmtree(tmp)
    try:
        _write_files(tmp, tensors, arrays, state, iteration)
    except BaseException as exc:  # the partial checkpoint goes; the others stay intact
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in WRITE_FAULTS:
            raise write_fault(exc, final, getattr(exc, "needed", None)) from exc
        raise
    if os.path.lexists(final):  # the same iteration again (after a fallback): replace it
        _retire(root, final)
    os.replace(tmp, final)
    fsync_dir(root)
    for old in list_checkpoints(root)[:-keep]:
        _retire(root, old)
    return final


def _write_files(tmp: Path, tensors: dict, arrays: dict, state: dict, iteration: int) -> None:
    """The files of a checkpoint, each fsync'ed, into the new directory ``tmp``."""
    tmp.mkdir()
    files = {}
    for group, tdict in tensors.items():
        name = f"{group}.safetensors"
        # clone: tensors may be views of one buffer (the fused step's flat parameters and
        # optimiser moments), which safetensors refuses to save as separate entries
        tdict = {k: v.detach().cpu().clone().contiguous() for k, v in tdict.items()}
        files[name] = _write(tmp / name, t_save(tdict))
    for group, adict in arrays.items():
        name = f"{group}.npz.safetensors"
        adict = {k: np.ascontiguousarray(v) for k, v in adict.items()}
        files[name] = _write(tmp / name, np_save(adict))
    files["state.json"] = _write(tmp / "state.json",
                                 json.dumps(state, default=_json_default).encode())
    manifest = {"format": FORMAT, "iteration": iteration, "files": files}
    _write(tmp / MANIFEST, json.dumps(manifest).encode())
    fsync_dir(tmp)


def _retire(root: Path, path: Path) -> None:
    trash = root / f".trash-{path.name}-{os.getpid()}"
    if os.path.lexists(trash):
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    fsync_dir(root)
    shutil.rmtree(trash, ignore_errors=True)


def list_checkpoints(root: str | Path) -> list[Path]:
    """Checkpoint directories under ``root``, oldest first (not verified, links skipped)."""
    root = Path(root)
    if not root.is_dir() or root.is_symlink():
        return []
    out = []
    for p in root.iterdir():
        if _NAME.match(p.name) and stat.S_ISDIR(os.lstat(p).st_mode):
            out.append(p)
    return sorted(out)


def verify_checkpoint(path: str | Path) -> dict:
    """The manifest of a checkpoint directory that verifies; :class:`CheckpointError`
    saying what is wrong otherwise."""
    path = Path(path)
    m = _NAME.match(path.name)
    if m is None or not stat.S_ISDIR(os.lstat(path).st_mode):
        raise CheckpointError("not a checkpoint directory")
    try:
        listing = set(os.listdir(path))
        doc = json.loads(read_regular(path / MANIFEST, MAX_SMALL_FILE))
        files = doc["files"]
        listing.discard(MANIFEST)
        if not isinstance(files, dict) or doc["iteration"] != int(m.group(1)):
            raise CheckpointError("its manifest names another iteration")
        if set(files) != listing:
            extra = sorted(listing - set(files))
            missing = sorted(set(files) - listing)
            raise CheckpointError("files do not match the manifest"
                                  + (f" (missing {missing})" if missing else "")
                                  + (f" (unexpected {extra})" if extra else ""))
        for name, info in files.items():
            if not _FILE.match(name):
                raise CheckpointError(f"the manifest names an invalid file {name!r}")
            size = int(info["size"])
            data = read_regular(path / name, size)
            if len(data) != size:
                raise CheckpointError(f"{name} has {len(data)} bytes, manifest {size}")
            if hashlib.sha256(data).hexdigest() != info["sha256"]:
                raise CheckpointError(f"{name} does not match its hash")
        if "state.json" not in files:
            raise CheckpointError("the manifest does not cover state.json")
        return doc
    except CheckpointError:
        raise
    except UsageError as exc:
        raise CheckpointError(str(exc).split(": ", 1)[-1]) from None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise CheckpointError(f"unreadable manifest ({type(exc).__name__})") from None


def find_checkpoint(root: str | Path, *, log: Callable[[str], None] | None = None
                    ) -> tuple[Path | None, list[tuple[Path, str]]]:
    """``(newest verified checkpoint or None, [(damaged checkpoint, reason), ...])``;
    each damaged one newer than the result is also reported through ``log``. A ``root``
    that is a symbolic link is refused (:func:`ppokit.io.rundir.refuse_link`)."""
    from .rundir import refuse_link

    refuse_link(root)
    damaged: list[tuple[Path, str]] = []
    for path in reversed(list_checkpoints(root)):
        try:
            verify_checkpoint(path)
        except CheckpointError as exc:
            damaged.append((path, str(exc)))
            if log is not None:
                log(f"checkpoint {path.name} is damaged ({exc}); trying an older one")
            continue
        return path, damaged
    return None, damaged


def no_checkpoint_message(run_dir: str | Path, damaged: list[tuple[Path, str]]) -> str:
    """The one-line refusal when a run has no checkpoint that verifies."""
    if damaged:
        what = "; ".join(f"{p.name}: {why}" for p, why in damaged[:3])
        return (f"run dir: {run_dir} has no intact checkpoint ({what}); nothing was "
                "changed")
    return (f"run dir: {run_dir} has no checkpoint yet (a run stopped before its first "
            "checkpoint cannot be continued; start it again in a new directory)")


def set_aside_newer(root: str | Path, used: Path, damaged: list[tuple[Path, str]],
                    log: Callable[[str], None] | None = None) -> None:
    """After resuming from ``used``, rename the damaged checkpoints newer than it to
    ``damaged-iter_…`` (kept for inspection, never loaded) so that they can neither be
    mistaken for checkpoints nor retire the intact one."""
    for path, _ in damaged:
        if path.name > used.name:
            target = Path(root) / f"damaged-{path.name}"
            if not os.path.lexists(target):
                os.replace(path, target)
                if log is not None:
                    log(f"kept the damaged {path.name} as {target.name}")


def latest_checkpoint(root: str | Path, *, cleanup: bool = False) -> Path | None:
    """The newest checkpoint under ``root`` whose files all match its manifest
    (``cleanup``: also remove leftovers of interrupted writes)."""
    root = Path(root)
    if cleanup:
        remove_leftovers(root)
    return find_checkpoint(root)[0]


def remove_leftovers(root: str | Path) -> None:
    """Remove the hidden leftovers of interrupted checkpoint writes under ``root``."""
    root = Path(root)
    if root.is_dir() and not root.is_symlink():
        for p in root.iterdir():
            if p.name.startswith((".tmp-", ".trash-")):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)


def load_checkpoint(path: str | Path) -> tuple[dict, dict, dict]:
    """``(tensors, arrays, state)`` of a checkpoint directory that verifies; the state's
    ``iteration`` is the manifest's. :class:`CheckpointError` if it does not verify."""
    path = Path(path)
    doc = verify_checkpoint(path)
    tensors, arrays = {}, {}
    state: dict = {}
    files = doc["files"]
    try:
        for name, info in files.items():
            data = read_regular(path / name, int(info["size"]))
            if name == "state.json":
                state = json.loads(data)
            elif name.endswith(".npz.safetensors"):
                arrays[name[: -len(".npz.safetensors")]] = np_load(data)
            else:
                tensors[name[: -len(".safetensors")]] = t_load(data)
    except (ValueError, RecursionError, UsageError) as exc:
        raise CheckpointError(f"{path.name}: unreadable ({exc})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path.name}: state.json is not an object")
    state["iteration"] = doc["iteration"]
    return tensors, arrays, state


# ---------------------------------------------------------------- random number generators

def capture_rng(generators: dict[str, torch.Generator] | None = None,
                py_rngs: dict[str, random.Random] | None = None) -> tuple[dict, dict]:
    """``(tensors, json_state)`` of torch's, NumPy's and Python's global generators plus
    the named ``generators`` / ``py_rngs``: the same capture for every kind of run."""
    tensors = {"torch": torch.get_rng_state()}
    for k, g in (generators or {}).items():
        tensors[f"gen/{k}"] = g.get_state()
    np_state = np.random.get_state()  # noqa: NPY002 (legacy global state)
    tensors["numpy_keys"] = torch.from_numpy(np.asarray(np_state[1], dtype=np.uint32)
                                             .view(np.int32).copy())
    py = {"python": _py_to_json(random.getstate())}
    for k, r in (py_rngs or {}).items():
        py[f"py/{k}"] = _py_to_json(r.getstate())
    meta = {"numpy": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])],
            **py}
    return tensors, meta


def restore_rng(tensors: dict, meta: dict, generators: dict[str, torch.Generator] | None = None,
                py_rngs: dict[str, random.Random] | None = None) -> None:
    """Inverse of :func:`capture_rng`."""
    torch.set_rng_state(tensors["torch"])
    for k, g in (generators or {}).items():
        g.set_state(tensors[f"gen/{k}"])
    keys = tensors["numpy_keys"].numpy().view(np.uint32)
    nr = meta["numpy"]
    np.random.set_state((nr[0], keys, int(nr[1]), int(nr[2]), float(nr[3])))  # noqa: NPY002
    random.setstate(_py_from_json(meta["python"]))
    for k, r in (py_rngs or {}).items():
        r.setstate(_py_from_json(meta[f"py/{k}"]))


def _py_to_json(state) -> list:
    return [state[0], list(state[1]), state[2]]


def _py_from_json(obj) -> tuple:
    return (int(obj[0]), tuple(int(x) for x in obj[1]), obj[2])


# ---------------------------------------------------------------- optimiser without pickle

def optimizer_to_flat(sd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """Split ``optimizer.state_dict()`` into tensors (safetensors) and JSON metadata."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            key = f"{pid}/{k}"
            if torch.is_tensor(v):
                tensors[key] = v
            else:
                scalars[key] = v
    groups = []
    for g in sd["param_groups"]:
        g2 = {}
        for k, v in g.items():
            g2[k] = list(v) if isinstance(v, tuple) else v
            if isinstance(v, tuple):
                g2.setdefault("__tuples__", []).append(k)
        groups.append(g2)
    return tensors, {"param_groups": groups, "scalars": scalars}


def optimizer_from_flat(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for key, v in tensors.items():
        pid, k = key.split("/", 1)
        state.setdefault(int(pid), {})[k] = v
    for key, v in meta["scalars"].items():
        pid, k = key.split("/", 1)
        state.setdefault(int(pid), {})[k] = v
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        for k in g.pop("__tuples__", []):
            g[k] = tuple(g[k])
        groups.append(g)
    return {"state": state, "param_groups": groups}
