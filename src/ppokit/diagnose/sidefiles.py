"""What a run directory holds besides its metrics, for the report: ``eval.json``, two
strings of ``config.json`` and whether ``best/`` exists (:func:`read_side_files`). Only
JSON is read, each file a regular file of at most 1 MiB and no link; nothing is imported
or executed."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["read_side_files"]


def _json_object(path: Path) -> dict | None:
    from ppokit.errors import UsageError
    from ppokit.io.atomic import read_regular

    try:
        obj = json.loads(read_regular(path, max_size=1 << 20).decode("utf-8"))
    except (OSError, UsageError, ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def read_side_files(run_dir: str | Path) -> dict:
    """``{"eval": dict | None, "config": dict, "best": bool}`` of a run directory:
    ``eval.json``, the ``env_id`` / ``algo`` strings of ``config.json`` and whether
    ``best/`` exists. A missing, linked, oversized or unreadable file is simply absent:
    the report still reads the metrics."""
    d = Path(run_dir)
    cfg = _json_object(d / "config.json") or {}
    best = d / "best"
    return {"eval": _json_object(d / "eval.json"),
            "config": {k: cfg[k] for k in ("env_id", "algo", "env") if isinstance(
                cfg.get(k), str)},
            "best": best.is_dir() and not os.path.islink(best)}
