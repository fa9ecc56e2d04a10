"""Masked statistics, whitening and explained variance.

A ``mask`` is always optional and, when given, must have exactly the shape of the data
(no broadcasting). Variances state their ``ddof``; a single valid element never yields
NaN: its variance is reported as 0 and its whitened value as 0.

Zero spread is exact: the variance and the whitened values are computed from the data
minus one of its valid values (a shift that changes neither, mathematically), so a batch
whose valid values are all equal has variance exactly 0 and whitens to exactly 0 at any
dtype and scale — never to the rounding error of its mean divided by a std of the same
size. float16 and bfloat16 data are reduced in float32 and returned in their own dtype.
"""

from __future__ import annotations

import torch

from .validation import Tensor, as_tensor, check_finite, check_mask, check_nonempty

__all__ = ["masked_sum", "masked_mean", "masked_var", "masked_whiten", "explained_variance",
           "wilson_interval", "mean_interval"]

_HALF = (torch.float16, torch.bfloat16)


def _prep(x, mask, name="x"):
    x = as_tensor(x, name)
    if not x.is_floating_point():
        x = x.to(torch.float32)
    check_nonempty(x, name)
    m = None if mask is None else check_mask(mask, x, name)
    return x, m


def _shift(x: Tensor, m: Tensor | None) -> Tensor:
    """One valid value of ``x`` (the first), as a 0-d tensor; 0 when nothing is valid."""
    flat = x.reshape(-1)
    if m is None:
        return flat[0]
    mf = m.reshape(-1)
    i = mf.to(torch.uint8).argmax()  # the first valid position (0 when there is none)
    return torch.where(mf[i], flat[i], torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x, mask=None, dim=None) -> Tensor:
    """Sum of ``x`` over positions where ``mask`` is 1. Shapes: ``x``, ``mask`` alike."""
    x, m = _prep(x, mask)
    if m is None:
        return x.sum() if dim is None else x.sum(dim)
    xm = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return xm.sum() if dim is None else xm.sum(dim)


def masked_mean(x, mask=None, dim=None) -> Tensor:
    """Mean over valid positions (all of them without a mask). Shapes: ``x``, ``mask``
    alike, any ``[...]``; ``dim=None``: a scalar ``[]``, else ``x`` reduced along ``dim``.

    An all-masked reduction returns 0 (not NaN), so a row with no action contributes
    nothing rather than poisoning a loss.
    """
    x, m = _prep(x, mask)
    if m is None:
        return x.mean() if dim is None else x.mean(dim)
    count = m.sum() if dim is None else m.sum(dim)
    return masked_sum(x, m, dim) / count.clamp(min=1).to(x.dtype)


def _std_mean(d: Tensor, m: Tensor | None, ddof: int) -> tuple[Tensor, Tensor]:
    """``(std, mean)`` of the valid values of ``d`` (``torch.std_mean``, so exactly what a
    caller without a mask gets); ``std`` is 0 with ``n ≤ ddof`` valid values, both are 0
    with none."""
    valid = d.reshape(-1) if m is None else d[m]
    n = valid.numel()
    zero = torch.zeros((), dtype=d.dtype, device=d.device)
    if n > ddof:
        return torch.std_mean(valid, correction=ddof)
    return zero, (valid.mean() if n else zero)


def masked_var(x, mask=None, ddof: int = 1) -> Tensor:
    """Variance over valid positions with ``ddof`` (1: unbiased, as ``torch.var``). Shapes:
    ``x``, ``mask`` alike, any ``[...]``; returns a scalar ``[]``.

    With ``n ≤ ddof`` valid elements the variance is 0 (one sample has no spread), never
    NaN; equal valid values give exactly 0 (module doc).
    """
    if ddof not in (0, 1):
        raise ValueError(f"ddof: expected 0 or 1, got {ddof!r}")
    x, m = _prep(x, mask)
    dtype = x.dtype
    if dtype in _HALF:
        x = x.float()
    d = x - _shift(x, m)
    valid = d.reshape(-1) if m is None else d[m]
    if valid.numel() <= ddof:
        return torch.zeros((), dtype=dtype, device=x.device)
    return torch.var(valid, correction=ddof).to(dtype)


def masked_whiten(x, mask=None, *, shift_mean: bool = True, ddof: int = 1,
                  eps: float = 1e-8) -> Tensor:
    """``(x − mean) / (std + eps)`` over valid positions; masked positions become 0.

    Shapes: ``x`` any, ``mask`` the same shape or None. ``ddof`` as in :func:`masked_var`
    (default 1, the unbiased std that Stable-Baselines3 and CleanRL use). With
    ``shift_mean=False`` only the scale is changed (the mean is added back). A single valid
    element whitens to 0 (centred) and never to NaN; so does a batch whose valid values are
    all equal, exactly, whatever the dtype and scale. The result has ``x``'s dtype.

    The statistics are ``torch.std_mean`` of the valid values after the shift (module doc):
    the same numbers the fused minibatch step computes.
    """
    if ddof not in (0, 1):
        raise ValueError(f"ddof: expected 0 or 1, got {ddof!r}")
    x, m = _prep(x, mask)
    check_finite(x if m is None else x[m], "x")
    dtype = x.dtype
    if dtype in _HALF:
        x = x.float()
    ref = _shift(x, m)
    d = x - ref
    std, mean = _std_mean(d, m, ddof)
    out = (d - mean) / (std + eps)
    if not shift_mean:
        out = out + (mean + ref)
    if m is not None:
        out = torch.where(m, out, torch.zeros_like(out))
    return out.to(dtype)


def explained_variance(y_pred, y_true, mask=None) -> float:
    """``1 − Var[y − ŷ] / Var[y]`` over valid positions.

    1: perfect prediction; 0: no better than predicting the mean; < 0: worse. Returns NaN
    when ``Var[y] = 0`` (undefined), as Stable-Baselines3 does. Shapes alike.
    """
    y_pred, m = _prep(y_pred, mask, "y_pred")
    y_true = as_tensor(y_true, "y_true", like=y_pred)
    if tuple(y_true.shape) != tuple(y_pred.shape):
        raise ValueError(f"y_true: expected shape {tuple(y_pred.shape)} (the shape of y_pred), "
                         f"got {tuple(y_true.shape)}")
    var_y = masked_var(y_true, m, ddof=0)
    if float(var_y) == 0.0:
        return float("nan")
    return float(1.0 - masked_var(y_true - y_pred, m, ddof=0) / var_y)


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``k / n`` (95 % with ``z`` = 1.96): unlike
    the normal approximation it stays inside [0, 1] and is sensible near 0 and 1;
    ``(0, 1)`` when ``n`` is 0."""
    import math

    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def mean_interval(values, z: float = 1.96, *, binary: bool | None = None
                  ) -> tuple[float, float]:
    """A 95 % interval of the mean of ``values`` (a list of numbers): Wilson's for 0/1
    values (an accuracy), else the normal approximation ``mean ± z·s/√n``. ``binary``
    False: the normal approximation whatever the values (a count, such as turns, that
    happens to be 0 or 1 everywhere is not a proportion)."""
    import math

    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        return (math.nan, math.nan)
    if binary is not False and all(x in (0.0, 1.0) for x in xs):
        return wilson_interval(int(sum(xs)), n, z)
    m = sum(xs) / n
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    return (m - z * s / math.sqrt(n), m + z * s / math.sqrt(n))
