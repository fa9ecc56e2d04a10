"""The one compiled part of ppokit: the extension ppokit.kernels._c, built from the C files
in src/ppokit/kernels/ (one per subject; kernels.h says which holds what): the native PPO
minibatch step, the rollout's actor, the LSTM and the decoder's elementwise steps.

Everything else is in pyproject.toml. The extension is optional: where it does not build
(no C compiler, a compiler without GCC's vector extensions), ppokit installs without it
and each caller runs its torch or NumPy path (``ppokit.kernels.why_not()`` says why).
``PPOKIT_ISA`` in the environment at build time chooses the vector paths compiled in:
``avx512`` (the default: AVX-512, AVX2 and the baseline, chosen at load time), ``avx2``
(no AVX-512) or ``generic`` (every kernel's portable loop alone; for tests).
"""

import glob
import os
import sys

from setuptools import Extension, setup

flags = [] if sys.platform == "win32" else ["-O3", "-fno-math-errno", "-Wno-psabi",
                                            "-fvisibility=hidden"]
isa = os.environ.get("PPOKIT_ISA", "avx512")
if isa not in ("avx512", "avx2", "generic"):
    sys.exit(f"PPOKIT_ISA: expected avx512, avx2 or generic, got {isa!r}")
flags += {"avx512": [], "avx2": ["-DPPOKIT_NO_AVX512"], "generic": ["-DPPOKIT_GENERIC"]}[isa]
sources = sorted(glob.glob("src/ppokit/kernels/*.c"))

setup(ext_modules=[Extension("ppokit.kernels._c", sources, depends=["src/ppokit/kernels/kernels.h"],
                             extra_compile_args=flags, optional=True)])
