"""Atomic checkpoints that load without unpickling anything.

Layout: ``RUN_DIR/checkpoints/iter_000123/`` holding

* ``<group>.safetensors`` for each tensor group (``model``, ``optimizer``, ``rng``, …) and
  ``<group>.npz.safetensors`` for numpy-array groups (normaliser statistics, env buffers);
* ``state.json``: everything else (counters, optimiser hyper-parameters, RNG states that are
  plain numbers, environment state, the resolved config) and a manifest with the SHA-256
  of every other file. It is written last.

A checkpoint is built in a hidden temporary directory (each file fsync'ed), which is then
renamed into place and the parent directory fsync'ed: a crash at any moment leaves either
no new checkpoint or a complete one. :func:`latest_checkpoint` returns the newest directory
whose manifest verifies; leftovers of an interrupted write are ignored and cleaned up.
Old checkpoints are retired by renaming them to a hidden name before deletion, so a
half-deleted directory never looks like a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load as np_load
from safetensors.numpy import save as np_save
from safetensors.torch import load as t_load
from safetensors.torch import save as t_save

from .atomic import fsync_dir

__all__ = ["save_checkpoint", "latest_checkpoint", "load_checkpoint", "optimizer_to_flat",
           "optimizer_from_flat", "list_checkpoints"]

_NAME = re.compile(r"^iter_(\d{9})$")


def _write(path: Path, data: bytes) -> str:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return hashlib.sha256(data).hexdigest()


def save_checkpoint(root: str | Path, iteration: int, *,
                    tensors: dict[str, dict[str, torch.Tensor]],
                    arrays: dict[str, dict[str, np.ndarray]],
                    state: dict[str, Any], keep: int = 2) -> Path:
    """Write checkpoint ``iteration`` under ``root`` atomically; keep the newest ``keep``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter_{iteration:09d}"
    tmp = root / f".tmp-iter_{iteration:09d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    manifest = {}
    for group, tdict in tensors.items():
        name = f"{group}.safetensors"
        # clone: tensors may be views of one buffer (the fused step's flat parameters and
        # optimiser moments), which safetensors refuses to save as separate entries
        tdict = {k: v.detach().clone() for k, v in tdict.items()}
        manifest[name] = _write(tmp / name, t_save(tdict))
    for group, adict in arrays.items():
        name = f"{group}.npz.safetensors"
        adict = {k: np.ascontiguousarray(v) for k, v in adict.items()}
        manifest[name] = _write(tmp / name, np_save(adict))
    doc = {"iteration": iteration, "manifest": manifest, "state": state}
    _write(tmp / "state.json", json.dumps(doc).encode())
    fsync_dir(tmp)
    if final.exists():  # re-writing the same iteration (e.g. after a resume)
        _retire(root, final)
    os.replace(tmp, final)
    fsync_dir(root)
    for old in list_checkpoints(root)[:-keep]:
        _retire(root, old)
    return final


def _retire(root: Path, path: Path) -> None:
    trash = root / f".trash-{path.name}-{os.getpid()}"
    if trash.exists():
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    fsync_dir(root)
    shutil.rmtree(trash, ignore_errors=True)


def list_checkpoints(root: str | Path) -> list[Path]:
    """Checkpoint directories under ``root``, oldest first (not verified)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name))


def _verify(path: Path) -> dict | None:
    try:
        doc = json.loads((path / "state.json").read_text())
        for name, digest in doc["manifest"].items():
            if hashlib.sha256((path / name).read_bytes()).hexdigest() != digest:
                return None
        return doc
    except (OSError, ValueError, KeyError, TypeError):
        return None


def latest_checkpoint(root: str | Path, *, cleanup: bool = False) -> Path | None:
    """The newest checkpoint under ``root`` whose files all match its manifest."""
    root = Path(root)
    if cleanup and root.is_dir():
        for p in root.iterdir():
            if p.name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(p, ignore_errors=True)
    for path in reversed(list_checkpoints(root)):
        if _verify(path) is not None:
            return path
    return None


def load_checkpoint(path: str | Path) -> tuple[dict, dict, dict]:
    """``(tensors, arrays, state)`` of a checkpoint directory; raises ValueError if corrupt."""
    path = Path(path)
    doc = _verify(path)
    if doc is None:
        raise ValueError(f"checkpoint {path} is incomplete or corrupt")
    tensors, arrays = {}, {}
    for name in doc["manifest"]:
        data = (path / name).read_bytes()
        if name.endswith(".npz.safetensors"):
            arrays[name[: -len(".npz.safetensors")]] = np_load(data)
        else:
            tensors[name[: -len(".safetensors")]] = t_load(data)
    state = doc["state"]
    state["iteration"] = doc["iteration"]
    return tensors, arrays, state


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
