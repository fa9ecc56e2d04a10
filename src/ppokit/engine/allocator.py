"""Keep freed tensor memory inside the process (glibc ``malloc`` settings for training).

On the CPU, torch allocates every tensor with the C library's ``malloc``. glibc serves a
block larger than its *mmap threshold* (128 KiB at start, raised automatically up to a few
MiB as such blocks are freed) with a fresh ``mmap`` and returns it to the kernel with
``munmap`` when the tensor is freed; it also gives the free top of the heap back once it
exceeds the *trim threshold*. A training step allocates and frees the same activation
tensors (megabytes each for a 10M-parameter language model or a CNN on 84×84 frames) every
time, so each step pays the kernel to map, zero and fault in those pages again: about
2,000 page faults per training minibatch of the 10M-parameter benchmark model
(``ppokit llm bench --model-size 10m``), none with these settings. The time saved is small
on the machines ppokit is measured on (user CPU time per minibatch 0.53 → 0.47 s in one
side-by-side measurement) and larger where page faults are expensive (virtual machines).

:func:`keep_freed_memory` raises both thresholds (``mallopt``), so freed blocks stay in the
heap and the next step reuses pages that are already mapped. The cost: memory a run has
once used is not handed back to the system until the process exits — the peak is the same,
the resident size no longer falls after it. ``PPOKIT_KEEP_FREED_MEMORY=0`` turns it off;
on a C library other than glibc (or another OS) it does nothing and says so by its return
value. Both trainers call it when they start; the setting is process-wide.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["keep_freed_memory", "ENV_VAR"]

ENV_VAR = "PPOKIT_KEEP_FREED_MEMORY"
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc caps the mmap threshold at 32 MiB on 64-bit systems (larger values are refused);
# blocks above it (rare: whole-batch logits of a large vocabulary) are still mapped.
_MMAP_THRESHOLD = 32 * 1024 * 1024
_TRIM_THRESHOLD = 1024 * 1024 * 1024

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Apply the settings once per process; ``True`` when they are in effect."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get(ENV_VAR, "1").strip() == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 — present in glibc only (not musl)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
    return _applied
