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
lstm      lstm.c           :func:`lstm_forward`, :func:`lstm_backward`, :func:`lstm_scratch`
decoder   decoder.c        :func:`decoder_op` (through :mod:`ppokit.kernels.decoder`)
========  ===============  ===========================================================

The extension is optional: where it is not built (no C compiler at install time) or is
turned off, :func:`available` is False, :func:`why_not` says why, and each caller runs its
torch or NumPy path. ``PPOKIT_NATIVE=0`` in the environment turns every kernel off;
``PPOKIT_NATIVE_OFF=lstm,actor`` (names from the table) turns off those only.

A kernel stays here only while it makes the whole run it serves at least 1.10× faster
(docs/performance.md, "What each compiled kernel buys"). The kernels removed for falling
short are listed in :data:`REMOVED`: their plain paths are now the only ones, and
``PPOKIT_NATIVE_OFF`` still accepts their names, with a warning that they are gone.
"""

from __future__ import annotations

import os
import warnings

import torch

__all__ = ["KERNELS", "REMOVED", "WIDE", "auto_state", "available", "build", "why_not",
           "decoder_op", "has_decoder", "ppo_step", "sample", "sample_scratch",
           "scratch_floats", "tanh_", "lstm_forward", "lstm_backward", "lstm_scratch"]

try:
    from ppokit.kernels import _c
    _WHY_NOT: str | None = None
except ImportError as e:  # pragma: no cover - depends on the install
    _c = None
    _WHY_NOT = (f"the C extension ppokit.kernels._c is not built ({e}); reinstall ppokit "
                "with a C compiler present (`pip install -e .` / `make setup`)")


#: the kernels by name (module doc), as ``PPOKIT_NATIVE_OFF`` names them
KERNELS = ("step", "actor", "lstm", "decoder")
#: kernels removed because the whole run they served gained less than 1.10× from them
#: (``python -m bench.kernel_gains``); ``PPOKIT_NATIVE_OFF`` accepts these names with a
#: warning, since each is off for good
REMOVED = {"gae": "1.02× on CartPole's whole run; ppokit.core.gae's NumPy scan is the path",
           "pixels": "1.02× on Breakout's whole run; torch's channels-last copy is the path"}
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
    the CPU lacks AVX-512. An unknown name is a ValueError (one of :data:`REMOVED` too,
    saying so)."""
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"ppokit.kernels: {_unknown(kernel)}")
    if os.environ.get("PPOKIT_NATIVE", "1") == "0":
        return "PPOKIT_NATIVE=0"
    if _WHY_NOT is not None:
        return _WHY_NOT
    off = os.environ.get("PPOKIT_NATIVE_OFF", "")
    if off and kernel in _turned_off(off):
        return f"PPOKIT_NATIVE_OFF={off}"
    if kernel in WIDE and not _wide_ok():
        return (f"the {kernel} kernel needs AVX-512, which this CPU (or this build of the "
                "extension) lacks; torch's path is faster there (PPOKIT_NATIVE_WIDE=1 "
                "runs it anyway)")
    return None


def _unknown(name: str) -> str:
    if name in REMOVED:
        return (f"the {name} kernel was removed ({REMOVED[name]}); the kernels are "
                f"{', '.join(KERNELS)}")
    return f"unknown kernel {name!r} (expected one of {', '.join(KERNELS)})"


def _turned_off(off: str) -> set[str]:
    """The kernels ``PPOKIT_NATIVE_OFF`` names. A name of :data:`REMOVED` is dropped with a
    warning (what it asked for, that kernel not running, holds for good); any other
    unknown name is a ValueError listing the kernels."""
    names = {n.strip() for n in off.split(",") if n.strip()}
    unknown = sorted(names - set(KERNELS) - set(REMOVED))
    if unknown:
        raise ValueError(f"PPOKIT_NATIVE_OFF: unknown kernel {', '.join(unknown)} "
                         f"(expected names from {', '.join(KERNELS)})")
    gone = sorted(names & set(REMOVED))
    if gone and off not in _WARNED:  # (once a process: this runs on every kernel call)
        _WARNED.add(off)
        warnings.warn(f"PPOKIT_NATIVE_OFF: {'; '.join(_unknown(n) for n in gone)}; the name "
                      "is ignored and can be dropped", FutureWarning, stacklevel=3)
    return names - set(REMOVED)


_WARNED: set[str] = set()


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


