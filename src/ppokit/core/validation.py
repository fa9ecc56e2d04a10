"""Input validation shared by every public function in :mod:`ppokit.core`.

Every check raises :class:`ValueError` naming the offending argument and what was
expected. Nothing here broadcasts: two arguments that must line up must have exactly
the same shape (a ``[B, 1]`` tensor is *not* accepted where ``[B, L]`` is expected).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

Tensor = torch.Tensor


def as_tensor(x: Any, name: str, *, dtype: torch.dtype | None = None,
              like: Tensor | None = None) -> Tensor:
    """Convert ``x`` (tensor, numpy array, list or scalar) to a tensor.

    Dtypes are kept (numpy float64 stays float64) unless ``dtype`` or ``like`` is given.
    """
    if isinstance(x, Tensor):
        t = x
    else:
        try:
            t = torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"{name}: expected a tensor or array of numbers, got "
                             f"{type(x).__name__}") from exc
    if like is not None:
        t = t.to(device=like.device, dtype=dtype or like.dtype)
    elif dtype is not None:
        t = t.to(dtype)
    return t


def check_nonempty(t: Tensor, name: str) -> None:
    if t.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(t.shape)}")


def check_ndim(t: Tensor, name: str, allowed: Sequence[int], layout: str) -> None:
    if t.ndim not in allowed:
        raise ValueError(f"{name}: expected shape {layout}, got shape {tuple(t.shape)}")


def check_same_shape(ref: Tensor, ref_name: str, **others: Tensor | None) -> None:
    """Every tensor in ``others`` must have exactly ``ref``'s shape (no broadcasting)."""
    for name, t in others.items():
        if t is None:
            continue
        if tuple(t.shape) != tuple(ref.shape):
            raise ValueError(
                f"{name}: expected shape {tuple(ref.shape)} (the shape of {ref_name}), got "
                f"{tuple(t.shape)}; ppokit never broadcasts these inputs")


class NonFiniteError(ValueError):
    """A NaN or inf where finite values are required (a ``ValueError``: bad input; a caller
    that can undo what produced it, such as the token trainer's divergence guard, catches
    this kind alone)."""


def check_finite(t: Tensor, name: str) -> None:
    """A :class:`NonFiniteError` naming ``name`` if ``t`` holds NaN or inf. A finite sum
    proves every entry finite (a NaN or an inf makes the sum NaN or inf), so the
    element-wise test runs only when the sum is not finite (an overflow of large finite
    values included), at a fraction of its cost."""
    if not t.is_floating_point() or t.numel() == 0:
        return
    if bool(torch.isfinite(t.sum())):
        return
    if not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise NonFiniteError(f"{name}: expected finite values, found {bad} NaN or inf "
                             "entries")


def check_binary(t: Tensor, name: str) -> Tensor:
    """Return ``t`` as float after checking every entry is 0 or 1 (bool is accepted)."""
    if t.dtype == torch.bool:
        return t
    if not bool(((t == 0) | (t == 1)).all()):
        bad = t[(t != 0) & (t != 1)].flatten()[:3].tolist()
        raise ValueError(f"{name}: expected binary flags (0 or 1, or bool), found values {bad}")
    return t.bool()


def check_unit_interval(value: float, name: str) -> float:
    v = float(value)
    if not (0.0 <= v <= 1.0) or math.isnan(v):
        raise ValueError(f"{name}: expected a number in [0, 1], got {value!r}")
    return v


def check_positive(value: float, name: str) -> float:
    v = float(value)
    if not v > 0 or math.isnan(v) or math.isinf(v):
        raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")
    return v


def check_nonnegative(value: float, name: str) -> float:
    v = float(value)
    if not v >= 0 or math.isnan(v) or math.isinf(v):
        raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    return v


def check_mask(mask: Any, ref: Tensor, ref_name: str, name: str = "mask") -> Tensor:
    """Validate an action mask against ``ref``'s shape and return it as bool."""
    m = as_tensor(mask, name)
    if m.device != ref.device:
        m = m.to(ref.device)
    check_same_shape(ref, ref_name, **{name: m})
    return check_binary(m, name)


def float_inputs(names_values: dict[str, Any], *, finite: Sequence[str] = ()) -> dict[str, Tensor]:
    """Convert several float inputs to tensors of one dtype/device (the first tensor's)."""
    out: dict[str, Tensor] = {}
    like: Tensor | None = None
    for value in names_values.values():
        if isinstance(value, Tensor) and value.is_floating_point():
            like = value
            break
    for name, value in names_values.items():
        t = as_tensor(value, name)
        if like is not None:
            t = t.to(device=like.device, dtype=like.dtype)
        elif not t.is_floating_point():
            t = t.to(torch.float32)
        out[name] = t
    for name in finite:
        check_finite(out[name], name)
    return out
