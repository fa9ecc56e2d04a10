"""Discounted reverse sums, the primitive of every advantage estimate: on the torch side
by chunked matrix products (:func:`discounted_reverse_cumsum`, any device); on the CPU, a
chunked scan of a first-order recurrence in NumPy (:func:`scan_chunks` over the layout of
:func:`to_chunks`), which :func:`ppokit.core.token_gae` and the environment GAE run on —
single-threaded by construction, the same speed at any thread count."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .validation import check_unit_interval

__all__ = ["CHUNK", "BLOCK", "ROWS", "discounted_reverse_cumsum", "power_matrix",
           "rows_per_block", "to_chunks", "from_chunks", "scan_chunks", "scan_np"]


def power_matrix(c: float, n: int, dtype: torch.dtype, device) -> Tensor:
    """``M[i, j] = c^(j − i)`` for ``j ≥ i`` else 0, shape ``[n, n]`` (computed in float64)."""
    idx = torch.arange(n, device=device, dtype=torch.float64)
    expo = idx[None, :] - idx[:, None]
    m = torch.pow(torch.tensor(c, dtype=torch.float64, device=device), expo.clamp(min=0))
    return torch.where(expo >= 0, m, torch.zeros_like(m)).to(dtype)


def discounted_reverse_cumsum(x: Tensor, coef: float, chunk_size: int = 32) -> Tensor:
    """``y_t = Σ_{k ≥ t} coef^(k−t) x_k`` along the last axis of ``x`` (``[..., L]``).

    A two-level chunked scan: a ``[C, C]`` matrix of powers inside each chunk of C
    positions, then the same over the chunk heads. No Python loop over L and no division
    by ``coef^t`` (which would overflow for long sequences). ``coef`` in [0, 1].
    """
    coef = check_unit_interval(coef, "coef")
    if chunk_size < 1:
        raise ValueError(f"chunk_size: expected an integer >= 1, got {chunk_size}")
    *lead, length = x.shape
    if length == 0:
        return x.clone()
    c = min(chunk_size, length)
    n_chunks = -(-length // c)
    pad = n_chunks * c - length
    xs = torch.nn.functional.pad(x.reshape(-1, length), (0, pad)).reshape(-1, n_chunks, c)
    local = xs @ power_matrix(coef, c, x.dtype, x.device).T  # [M, n, C]
    if n_chunks > 1:
        heads = local[..., 0] @ power_matrix(coef**c, n_chunks, x.dtype, x.device).T  # [M, n]
        nxt = torch.nn.functional.pad(heads[:, 1:], (0, 1))  # carry from the chunk after
        i = torch.arange(c, device=x.device, dtype=torch.float64)
        tail = torch.pow(torch.tensor(coef, dtype=torch.float64), c - i).to(x.dtype)  # c^(C−i)
        local = local + nxt[..., None] * tail
    return local.reshape(-1, n_chunks * c)[:, :length].reshape(*lead, length)



CHUNK = 8  # positions per chunk (the layout changes cost more for longer chunks)
BLOCK = 1 << 17  # elements per row block of the layout changes (they stay in cache)
ROWS = 1 << 16  # elements per block of rows computed at once (the working set stays in
# a core's cache)


def rows_per_block(row: int) -> int:
    return max(1, BLOCK // max(1, row))


def to_chunks(x: np.ndarray, c: int) -> np.ndarray:
    """``[K, R, n·C]`` → ``[C, K, R, n]`` (position in chunk first), copied by row blocks."""
    k, r, total = x.shape
    n = total // c
    out = np.empty((c, k, r, n), x.dtype)
    dst, src = out.transpose(1, 2, 3, 0), x.reshape(k, r, n, c)
    step = rows_per_block(total)
    for i in range(0, r, step):
        dst[:, i:i + step] = src[:, i:i + step]
    return out


def from_chunks(xt: np.ndarray) -> np.ndarray:
    """``[C, K, R, n]`` → ``[K, R, n·C]``."""
    c, k, r, n = xt.shape
    out = np.empty((k, r, n, c), xt.dtype)
    src = xt.transpose(1, 2, 3, 0)
    step = rows_per_block(n * c)
    for i in range(0, r, step):
        out[:, i:i + step] = src[:, i:i + step]
    return out.reshape(k, r, n * c)


def scan_chunks(yt: np.ndarray, at: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """In place: ``yt`` ``[C, K, R, n]`` (inputs, chunk layout) becomes the scan
    ``y_t = x_t + a_t y_{t+1}`` with ``at`` ``[C, R, n]`` and ``carry`` ``[K, R]`` after the
    last chunk. Returns ``[K, R, n]``: the value just after each chunk (its carry-in)."""
    c = yt.shape[0]
    q = np.empty_like(at)  # q[i] = a[i] · … · a[C−1]: how a carry-in reaches position i
    q[c - 1] = at[c - 1]
    tmp = np.empty_like(yt[0])
    for i in range(c - 2, -1, -1):  # each chunk's own scan, zero carry-in
        np.multiply(yt[i + 1], at[i], out=tmp)
        yt[i] += tmp
        np.multiply(q[i + 1], at[i], out=q[i])
    # the value at each chunk's first position: one level up, chunks as positions
    first = scan_np(yt[0], q[0], carry)
    after = np.empty_like(first)
    after[..., :-1] = first[..., 1:]
    after[..., -1] = carry
    if tmp.size <= BLOCK:  # small: one broadcast operation
        yt += q[:, None] * after
    else:  # large: slice by slice, no temporary of the whole size
        for i in range(c):
            np.multiply(q[i], after, out=tmp)
            yt[i] += tmp
    return after


def scan_np(x: np.ndarray, a: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """``y_t = x_t + a_t y_{t+1}`` along the last axis, ``y_N = carry``. ``x``: ``[K, R, N]``
    (K inputs sharing the coefficients), ``a``: ``[R, N]``, ``carry``: ``[K, R]``.

    For the rows one level up (one value per chunk): recursive doubling, ⌈log₂ N⌉ rounds of
    ``y_t += A_t y_{t+s}``, ``A_t *= A_{t+s}`` over contiguous slices (``A_t``: the product
    of the coefficients the span from t covers), then the carry-in times the full products.
    """
    y = x.copy()
    prod = a.copy()
    s = 1
    total = x.shape[-1]
    while s < total:
        y[..., :-s] += prod[:, :-s] * y[..., s:]
        prod[:, :-s] *= prod[:, s:].copy()
        s *= 2
    y += prod * carry[..., None]
    return y
