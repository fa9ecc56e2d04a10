"""ppokit's compiled kernels: the C extension ``ppokit.kernels._c`` (``_c.c`` beside this
file), built by ``setup.py`` when ppokit is installed.

What is in it: the native minibatch step — the fused PPO step of an MLP actor-critic,
Adam included, as one call (:mod:`ppokit.engine.native` hands it torch's buffers), its
critic on a worker thread while that keeps up (:func:`auto_state`); the rollout's actor
(:func:`sample`, which :class:`ppokit.policies.NumpySampler` calls) and its storage of
channel-first pixels in pixel order (:func:`pixels_last`); the recurrent
update's LSTM (:mod:`ppokit.kernels.lstm`); the environment GAE (:func:`gae`, its checks
and recursion in one pass, which :func:`ppokit.core.gae` runs; :func:`reverse_scan`, the
recursion alone) and the token GAE of the language-model trainer (:func:`token_gae`,
which :func:`ppokit.core.token_gae` runs); and the language-model decoder's elementwise
steps — RMS norm, the rotary embedding, the SiLU-gated product, forward and backward —
for the fused forward on the CPU (:mod:`ppokit.kernels.decoder`). The extension is
optional: where it is not built (no C compiler at install time) or is turned off
(``PPOKIT_NATIVE=0`` in the environment), :func:`available` is False, :func:`why_not` says
why, and each caller runs its torch or NumPy path.
"""

from __future__ import annotations

import os

import numpy as np
import torch

__all__ = ["auto_state", "available", "why_not", "decoder_op", "has_decoder", "gae",
           "token_gae", "reverse_scan", "ppo_step", "sample", "sample_scratch", "pixels_last",
           "scratch_floats", "tanh_", "lstm_forward", "lstm_backward", "lstm_scratch"]

try:
    from ppokit.kernels import _c
    _WHY_NOT: str | None = None
except ImportError as e:  # pragma: no cover - depends on the install
    _c = None
    _WHY_NOT = (f"the C extension ppokit.kernels._c is not built ({e}); reinstall ppokit "
                "with a C compiler present (`pip install -e .` / `make setup`)")


def available() -> bool:
    """Whether the compiled kernels can run here (:func:`why_not` says why not)."""
    return why_not() is None


def why_not() -> str | None:
    """``None`` when the compiled kernels can run, else why not: the extension is not built,
    or ``PPOKIT_NATIVE=0`` in the environment turns them off."""
    if os.environ.get("PPOKIT_NATIVE", "1") == "0":
        return "PPOKIT_NATIVE=0"
    return _WHY_NOT


def ppo_step(*args) -> int:
    """The native minibatch step on raw buffer addresses (``_c.c`` documents the 16
    arguments); :class:`ppokit.engine.native.NativeStep` is the way to call it."""
    return _c.step(*args)


def auto_state() -> dict[str, int]:
    """The native step's automatic choice of where its critic runs (``parallel="auto"``,
    :class:`ppokit.engine.native.NativeStep`), counted in this process since it started:
    ``steps`` taken that way, ``beside`` of them with the critic posted to the worker,
    ``missed`` of those the worker did not keep up with, ``serial_left`` steps before the
    worker is tried again, ``backoff`` the length of the next pause."""
    if not available():
        raise RuntimeError(why_not())
    keys = ("steps", "beside", "missed", "serial_left", "backoff")
    return dict(zip(keys, _c.auto_state()))


def sample(plan: int, base: int, x, noise, out, scratch: int, rows: int) -> None:
    """The rollout's actions in C (:class:`ppokit.policies.NumpySampler` builds the plan;
    ``_c.c`` documents it): ``x``, ``noise`` and ``out`` are arrays whose sizes and dtypes
    the call checks, the rest addresses."""
    _c.sample(plan, base, x, noise, out, scratch, rows)


def decoder_op(*args) -> None:
    """One of the decoder's compiled steps on raw buffer addresses (``_c.c``, ``decoder``,
    documents the operations and their arguments); :mod:`ppokit.kernels.decoder` is the way
    to call them."""
    _c.decoder(*args)


def has_decoder() -> bool:
    """Whether the decoder's compiled steps can run (an extension built before they existed
    lacks them)."""
    return available() and hasattr(_c, "decoder")


def lstm_forward(*args) -> None:
    """The LSTM's forward pass on raw buffer addresses (``_c.c``, ``lstm_fwd``, documents
    the 14 arguments); :func:`ppokit.kernels.lstm.lstm` is the way to call it."""
    _c.lstm_fwd(*args)


def lstm_backward(*args) -> None:
    """Its backward pass (``_c.c``, ``lstm_bwd``: 20 arguments)."""
    _c.lstm_bwd(*args)


def lstm_scratch(seqs: int, steps: int, features: int, hidden: int) -> int:
    """Floats of scratch :func:`lstm_forward` and :func:`lstm_backward` need."""
    return _c.lstm_scratch(seqs, steps, features, hidden)


def sample_scratch(plan: int, rows: int) -> int:
    """Floats of scratch :func:`sample` needs for ``rows`` rows."""
    return _c.sample_scratch(plan, rows)


def scratch_floats(plan: int, rows: int) -> int:
    """Floats of scratch the native step needs for a minibatch of ``rows`` rows."""
    return _c.scratch_floats(plan, rows)


def pixels_last(frames: np.ndarray) -> np.ndarray | None:
    """uint8 frames ``[N, C, H, W]`` (C-contiguous) as an array of the same shape whose
    memory is ``N, H, W, C`` (each pixel's channels side by side: the layout the CNN
    computes in), or None where the extension is not available or ``frames`` is not such
    an array (the caller then uses torch's copy, the same bytes)."""
    if (not available() or not isinstance(frames, np.ndarray)
            or frames.dtype != np.uint8 or frames.ndim != 4 or not frames.flags.c_contiguous
            or not hasattr(_c, "interleave")):  # (an extension built before it existed)
        return None
    n, c, h, w = frames.shape
    out = np.empty((n, h, w, c), np.uint8)
    if frames.size:
        _c.interleave(frames.ctypes.data, out.ctypes.data, n, c, h * w)
    return out.transpose(0, 3, 1, 2)


def tanh_(x: torch.Tensor) -> torch.Tensor:
    """The native step's tanh, in place on a contiguous float32 CPU tensor (``x`` is
    returned): ``1 - 2 / (1 + e^{2u})``, absolute error about 1e-7."""
    if not available():
        raise RuntimeError(why_not())
    if x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous():
        raise ValueError("tanh_: expected a contiguous float32 CPU tensor")
    _c.tanh(x.data_ptr(), x.numel())
    return x


def reverse_scan(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor | None:
    """``y_t = x_t + a_t y_{t+1}`` along the first axis (``y_T = 0``) of CPU float32 or
    float64 tensors ``[T]`` or ``[T, N]`` of one shape and dtype, computed in C in the
    plain loop's order (the same bits as :func:`ppokit.core.advantage.gae_reference`'s
    loop); ``None`` when the kernels are not available or the inputs do not qualify (the
    caller then scans another way)."""
    if (not available() or x.dtype not in (torch.float32, torch.float64)
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


def gae(rewards, values, next_values, terminated, episode_end, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`ppokit.core.gae` in one compiled pass, for the inputs the trainers give it:
    float32 or float64 CPU tensors ``[T]`` or ``[T, N]`` of one shape and dtype, bool masks
    of that shape, ``gamma`` and ``lam`` already checked. The checks of the core function
    run inside the pass (finite rewards and values, no termination outside an episode end);
    ``None`` when the inputs do not qualify or fail a check — the caller's checked path then
    computes, or raises the error that names the argument. The results are the same bits
    as :func:`ppokit.core.gae_reference`'s loop."""
    if not available():
        return None
    r, v, nv, term, end = rewards, values, next_values, terminated, episode_end
    if not all(isinstance(t, torch.Tensor) for t in (r, v, nv, term, end)):
        return None
    if (r.dtype not in (torch.float32, torch.float64) or r.ndim not in (1, 2)
            or r.numel() == 0 or r.device.type != "cpu"):
        return None
    for t in (v, nv):
        if t.dtype != r.dtype or t.shape != r.shape or t.device.type != "cpu":
            return None
    for t in (term, end):
        if t.dtype != torch.bool or t.shape != r.shape or t.device.type != "cpu":
            return None
    r, v, nv = (t.detach().contiguous() for t in (r, v, nv))
    term, end = term.contiguous(), end.contiguous()
    adv, ret = torch.empty_like(r), torch.empty_like(r)
    n = r.shape[1] if r.ndim == 2 else 1
    rc = _c.gae(r.data_ptr(), v.data_ptr(), nv.data_ptr(), term.data_ptr(), end.data_ptr(),
                adv.data_ptr(), ret.data_ptr(), r.shape[0], n, float(gamma),
                float(gamma) * float(lam), r.dtype == torch.float64)
    return (adv, ret) if rc == 0 else None


def token_gae(r: torch.Tensor, v: torch.Tensor, m: torch.Tensor, boot: torch.Tensor | None,
              gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`ppokit.core.token_gae` in C, for inputs its checks have passed: float32 or
    float64 CPU tensors ``[B, L]``, a bool mask of that shape, ``boot`` ``None`` or ``[B]``
    of the same dtype. The position loop's operations in its order (the bits of
    :func:`ppokit.core.token_gae_reference`), row by row. ``None`` when the
    inputs do not qualify or a reward or value at an action is not finite (the caller's
    path then raises the error naming it)."""
    if (not available() or r.dtype not in (torch.float32, torch.float64)
            or r.ndim != 2 or v.dtype != r.dtype or v.shape != r.shape
            or m.dtype != torch.bool or m.shape != r.shape
            or any(t.device.type != "cpu" for t in (r, v, m))):
        return None
    if boot is not None and (boot.dtype != r.dtype or boot.shape != (r.shape[0],)
                             or boot.device.type != "cpu"):
        return None
    r, v, m = r.detach().contiguous(), v.detach().contiguous(), m.contiguous()
    boot = None if boot is None else boot.detach().contiguous()
    adv, ret = torch.empty_like(r), torch.empty_like(r)
    rc = _c.token_gae(r.data_ptr(), v.data_ptr(), m.data_ptr(),
                      0 if boot is None else boot.data_ptr(), adv.data_ptr(),
                      ret.data_ptr(), r.shape[0], r.shape[1], float(gamma),
                      float(gamma) * float(lam), r.dtype == torch.float64)
    return (adv, ret) if rc == 0 else None
