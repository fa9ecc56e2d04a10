"""ppokit's compiled kernels: the C extension ``ppokit.kernels._c`` (``_c.c`` beside this
file), built by ``setup.py`` when ppokit is installed.

Two things are in it. The native minibatch step — the fused PPO step of an MLP
actor-critic, Adam included, as one call (:mod:`ppokit.engine.native` hands it torch's
buffers) — and the environment GAE's recursion ``y_t = x_t + a_t y_{t+1}``
(:func:`reverse_scan`, which :func:`ppokit.core.gae` runs). The extension is optional:
where it is not built (no C compiler at install time) or is turned off (``PPOKIT_NATIVE=0``
in the environment), :func:`available` says why, the fused step runs its TorchScript
kernel and the GAE its NumPy scan.
"""

from __future__ import annotations

import os

import torch

__all__ = ["available", "reverse_scan", "ppo_step", "scratch_floats"]

try:
    from ppokit.kernels import _c
    _WHY_NOT: str | None = None
except ImportError as e:  # pragma: no cover - depends on the install
    _c = None
    _WHY_NOT = (f"the C extension ppokit.kernels._c is not built ({e}); reinstall ppokit "
                "with a C compiler present (`pip install -e .` / `make setup`)")


def available() -> str | None:
    """``None`` when the compiled kernels can run, else why not (``PPOKIT_NATIVE=0`` in the
    environment turns them off)."""
    if os.environ.get("PPOKIT_NATIVE", "1") == "0":
        return "PPOKIT_NATIVE=0"
    return _WHY_NOT


def ppo_step(*args) -> int:
    """The native minibatch step on raw buffer addresses (``_c.c`` documents the 16
    arguments); :class:`ppokit.engine.native.NativeStep` is the way to call it."""
    return _c.step(*args)


def scratch_floats(plan: int, rows: int) -> int:
    """Floats of scratch the native step needs for a minibatch of ``rows`` rows."""
    return _c.scratch_floats(plan, rows)


def reverse_scan(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor | None:
    """``y_t = x_t + a_t y_{t+1}`` along the first axis (``y_T = 0``) of CPU float32 or
    float64 tensors ``[T]`` or ``[T, N]`` of one shape and dtype, computed in C in the
    plain loop's order (the same bits as :func:`ppokit.core.advantage.gae_reference`'s
    loop); ``None`` when the kernels are not available or the inputs do not qualify (the
    caller then scans another way)."""
    if (available() is not None or x.dtype not in (torch.float32, torch.float64)
            or a.dtype != x.dtype or a.shape != x.shape or x.ndim not in (1, 2)
            or x.device.type != "cpu" or a.device.type != "cpu"):
        return None
    x, a = x.contiguous(), a.contiguous()
    y = torch.empty_like(x)
    t = x.shape[0]
    n = x.shape[1] if x.ndim == 2 else 1
    _c.reverse_scan(x.data_ptr(), a.data_ptr(), y.data_ptr(), t, n,
                    x.dtype == torch.float64)
    return y
