"""Atomic checkpoints without pickle: tensors in safetensors files, everything else JSON.

A checkpoint is a directory ``ckpt-<iteration>/`` written under a temporary name, flushed,
then renamed; the file ``latest`` (replaced atomically) names the newest complete one. A
crash mid-write leaves the previous checkpoint and ``latest`` untouched.
"""

from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

from ppokit.io.checkpoint import optimizer_from_flat, optimizer_to_flat

__all__ = ["flatten_optimizer", "restore_optimizer", "write_checkpoint", "latest_checkpoint",
           "save_tensors", "load_tensors", "atomic_write_text"]


def atomic_write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_tensors(tensors: dict[str, torch.Tensor], path: str) -> None:
    save_file({k: v.detach().cpu().clone().contiguous() for k, v in tensors.items()}, path)


def load_tensors(path: str) -> dict[str, torch.Tensor]:
    return load_file(path)


def flatten_optimizer(opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """``(tensors, meta)``: the optimizer state as named tensors plus JSON metadata (the same
    layout as environment-training checkpoints, :func:`ppokit.io.checkpoint.optimizer_to_flat`)."""
    return optimizer_to_flat(opt.state_dict())


def restore_optimizer(opt: torch.optim.Optimizer, tensors: dict, meta: dict) -> None:
    """Load what :func:`flatten_optimizer` produced into ``opt``."""
    opt.load_state_dict(optimizer_from_flat(tensors, meta))


def write_checkpoint(run_dir: str, iteration: int, write_fn, keep: int = 2) -> str:
    """Call ``write_fn(tmp_dir)`` then publish it as ``ckpt-<iteration>`` atomically."""
    final = os.path.join(run_dir, f"ckpt-{iteration:06d}")
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    write_fn(tmp)
    for name in os.listdir(tmp):
        p = os.path.join(tmp, name)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    atomic_write_text(os.path.join(run_dir, "latest"), os.path.basename(final) + "\n")
    ckpts = sorted(d for d in os.listdir(run_dir)
                   if d.startswith("ckpt-") and not d.endswith(".tmp"))
    for old in ckpts[:-keep]:
        shutil.rmtree(os.path.join(run_dir, old), ignore_errors=True)
    return final


def latest_checkpoint(run_dir: str) -> str | None:
    p = os.path.join(run_dir, "latest")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        name = f.read().strip()
    path = os.path.join(run_dir, name)
    return path if os.path.isdir(path) else None


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)
