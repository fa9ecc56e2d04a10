"""ppokit's compiled kernels: the C extension ``ppokit.kernels._c``, built by ``setup.py``
from the C files beside this module, one per subject (``kernels.h`` lists them; the map of
which Python seam calls which kernel is in docs/architecture.md, "The native layer").

Each kernel is reached through one function here, whose docstring names the C file, the
plain reference it must equal and the test that holds it to that reference:

========  ===============  ===========================================================
name      C file           function(s) here
========  ===============  ===========================================================
step      ppo_step.c       :func:`ppo_step`, :func:`scratch_floats`, :func:`auto_state`,
          mlp.c,           :func:`tanh_`
          step_worker.c
actor     actor.c          :func:`sample`, :func:`sample_scratch`
gae       gae.c            :func:`gae`, :func:`reverse_scan`, :func:`token_gae`
lstm      lstm.c           :func:`lstm_forward`, :func:`lstm_backward`, :func:`lstm_scratch`
pixels    pixels.c         :func:`pixels_last`
decoder   decoder.c        :func:`decoder_op` (through :mod:`ppokit.kernels.decoder`)
========  ===============  ===========================================================

The extension is optional: where it is not built (no C compiler at install time) or is
turned off, :func:`available` is False, :func:`why_not` says why, and each caller runs its
torch or NumPy path. ``PPOKIT_NATIVE=0`` in the environment turns every kernel off;
``PPOKIT_NATIVE_OFF=gae,lstm`` (names from the table) turns off those only.
"""

from __future__ import annotations

import os

import numpy as np
import torch

__all__ = ["KERNELS", "WIDE", "auto_state", "available", "build", "why_not", "decoder_op",
           "has_decoder", "gae", "token_gae", "reverse_scan", "ppo_step", "sample",
           "sample_scratch", "pixels_last",
           "scratch_floats", "tanh_", "lstm_forward", "lstm_backward", "lstm_scratch"]

try:
    from ppokit.kernels import _c
    _WHY_NOT: str | None = None
except ImportError as e:  # pragma: no cover - depends on the install
    _c = None
    _WHY_NOT = (f"the C extension ppokit.kernels._c is not built ({e}); reinstall ppokit "
                "with a C compiler present (`pip install -e .` / `make setup`)")


#: the kernels by name (module doc), as ``PPOKIT_NATIVE_OFF`` names them
KERNELS = ("step", "actor", "gae", "lstm", "pixels", "decoder")
#: the kernels written on 16-float vectors: fast where the CPU has AVX-512, and several
#: times slower than their torch path where it does not (GCC then keeps the vectors in
#: memory, in 16-byte pieces: the native step took 1.2 ms per minibatch in its AVX2 form
#: against 58 µs in its AVX-512 form and about 250 µs for the TorchScript kernel;
#: ``python -m bench.kernel_gains --no-avx512``), so they run only where it has it
#: (``PPOKIT_NATIVE_WIDE=1`` runs them anyway)
WIDE = ("step", "actor", "lstm", "decoder")


def available(kernel: str | None = None) -> bool:
    """Whether the compiled kernels can run here — all of them, or the one named (a name of
    :data:`KERNELS`); :func:`why_not` says why not."""
    return why_not(kernel) is None


def why_not(kernel: str | None = None) -> str | None:
    """``None`` when the compiled kernels (or the one named) can run, else why not: the
    extension is not built, ``PPOKIT_NATIVE=0`` in the environment turns them all off, or
    ``PPOKIT_NATIVE_OFF`` names this one, or it is one of the :data:`WIDE` kernels and
    the CPU lacks AVX-512. An unknown name is a ValueError."""
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"ppokit.kernels: unknown kernel {kernel!r}")
    if os.environ.get("PPOKIT_NATIVE", "1") == "0":
        return "PPOKIT_NATIVE=0"
    if _WHY_NOT is not None:
        return _WHY_NOT
    off = os.environ.get("PPOKIT_NATIVE_OFF", "")
    if off:
        names = {n.strip() for n in off.split(",") if n.strip()}
        unknown = sorted(names - set(KERNELS))
        if unknown:
            raise ValueError(f"PPOKIT_NATIVE_OFF: unknown kernel {', '.join(unknown)} "
                             f"(expected names from {', '.join(KERNELS)})")
        if kernel in names:
            return f"PPOKIT_NATIVE_OFF={off}"
    if kernel in WIDE and not _wide_ok():
        return (f"the {kernel} kernel needs AVX-512, which this CPU (or this build of the "
                "extension) lacks; torch's path is faster there (PPOKIT_NATIVE_WIDE=1 "
                "runs it anyway)")
    return None


def _wide_ok() -> bool:
    """Whether the 16-float-vector kernels (:data:`WIDE`) should run: the build has its
    AVX-512 forms and the CPU runs them, or the build is the portable one the reference
    tests use, or ``PPOKIT_NATIVE_WIDE=1``."""
    global _WIDE_OK
    if os.environ.get("PPOKIT_NATIVE_WIDE") == "1":
        return True
    if _WIDE_OK is None:  # (the build and the CPU do not change while the process runs)
        if not hasattr(_c, "build"):  # an extension built before build() existed: as then
            _WIDE_OK = True
            return True
        info = build()
        _WIDE_OK = info["isa"] == "generic" or (info["isa"] == "avx512" and info["avx512f"])
    return _WIDE_OK


_WIDE_OK: bool | None = None


def build() -> dict:
    """How the extension was built and what this CPU offers it: ``isa`` — the vector paths
    compiled in (``"avx512"``: AVX-512, AVX2 and the baseline, chosen at load time, the
    default; ``"avx2"``: no AVX-512; ``"generic"``: the portable loops alone; setup.py's
    ``PPOKIT_ISA``) — and ``avx512f`` / ``avx512bf16``, whether this CPU has them."""
    if _c is None:
        raise RuntimeError(_WHY_NOT)
    return dict(zip(("isa", "avx512f", "avx512bf16"), _c.build()))


def ppo_step(*args) -> int:
    """The native minibatch step on raw buffer addresses (``ppo_step.c`` documents the 16
    arguments); :class:`ppokit.engine.native.NativeStep` is the way to call it. Reference:
    the eager step of :mod:`ppokit.engine.update` (losses of :mod:`ppokit.core`, torch's
    Adam); held to it by tests/test_native_step.py::test_native_step_equals_eager_step."""
    return _c.step(*args)


def auto_state() -> dict[str, int]:
    """The native step's automatic choice of where its critic runs (``parallel="auto"``,
    :class:`ppokit.engine.native.NativeStep`), counted in this process since it started:
    ``steps`` taken that way, ``beside`` of them with the critic posted to the worker,
    ``missed`` of those the worker did not keep up with, ``serial_left`` steps before the
    worker is tried again, ``backoff`` the length of the next pause (``step_worker.c``;
    tests/test_native_step.py::test_auto_state_counts_only_the_automatic_choice)."""
    if not available("step"):
        raise RuntimeError(why_not())
    keys = ("steps", "beside", "missed", "serial_left", "backoff")
    return dict(zip(keys, _c.auto_state()))


def sample(plan: int, base: int, x, noise, out, scratch: int, rows: int) -> None:
    """The rollout's actions in C (``actor.c``; :class:`ppokit.policies.NumpySampler`
    builds the plan): ``x``, ``noise`` and ``out`` are arrays whose sizes and dtypes the
    call checks, the rest addresses. Reference: the torch policy's forward and its
    inverse-CDF / Gaussian sampling rule; held to it by
    tests/test_train_policies.py::test_numpy_sampler_matches_the_torch_policy."""
    _c.sample(plan, base, x, noise, out, scratch, rows)


def decoder_op(*args) -> None:
    """One of the decoder's compiled steps on raw buffer addresses (``decoder.c``, above
    ``py_decoder``, documents the operations and their arguments);
    :mod:`ppokit.kernels.decoder` is the way to call them. References: the torch formulas
    of that module (RMS norm, the rotary split, the SiLU-gated product) and torch's
    ``scaled_dot_product_attention``; held to them, values and gradients, float32 and
    bfloat16, by tests/test_llm_kernels.py."""
    _c.decoder(*args)


def has_decoder() -> bool:
    """Whether the decoder's compiled steps can run (an extension built before they existed
    lacks them)."""
    return available("decoder") and hasattr(_c, "decoder")


def lstm_forward(*args) -> None:
    """The LSTM's forward pass on raw buffer addresses (``lstm.c``, above ``py_lstm_fwd``,
    documents the 14 arguments); :func:`ppokit.kernels.lstm.lstm` is the way to call it.
    Reference: torch's ``nn.LSTM`` (one layer, batch first), outputs and gradients; held to
    it by tests/test_lstm_native.py."""
    _c.lstm_fwd(*args)


def lstm_backward(*args) -> None:
    """Its backward pass (``lstm.c``, ``py_lstm_bwd``: 20 arguments)."""
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
    an array (the caller then uses torch's copy, the same bytes). In ``pixels.c``;
    reference: torch's ``channels_last`` copy, held to it by
    tests/test_cnn_fast_path.py::test_pixels_last_is_torchs_channels_last_copy."""
    if (not available("pixels") or not isinstance(frames, np.ndarray)
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
    returned): ``1 - 2 / (1 + e^{2u})``, absolute error about 1e-7. In ``mlp.c``;
    reference: ``torch.tanh``, held to it by
    tests/test_native_step.py::test_native_tanh_is_torchs."""
    if not available("step"):
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
    caller then scans another way). In ``gae.c``; held to the loop by
    tests/test_native_step.py::test_native_reverse_scan_is_the_loop_bit_for_bit."""
    if (not available("gae") or x.dtype not in (torch.float32, torch.float64)
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
    as :func:`ppokit.core.gae_reference`'s loop (``gae.c``; held to it by
    tests/test_core_gae_fast.py and
    tests/test_native_step.py::test_native_gae_checks_its_inputs_as_the_core_function_does)."""
    if not available("gae"):
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
    path then raises the error naming it). In ``gae.c``; held to the reference by
    tests/test_native_step.py::test_native_token_gae_is_the_position_loop_bit_for_bit."""
    if (not available("gae") or r.dtype not in (torch.float32, torch.float64)
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
