"""The one compiled part of ppokit: the extension ppokit.kernels._c, built from the C files
in src/ppokit/kernels/ (one per subject; kernels.h says which holds what): the native PPO
minibatch step, the rollout's actor, the GAE scans, the LSTM, the pixel interleave and the
decoder's elementwise steps.

Everything else is in pyproject.toml. The extension is optional: where it does not build
(no C compiler, a compiler without GCC's vector extensions), ppokit installs without it
and each caller runs its torch or NumPy path (``ppokit.kernels.why_not()`` says why).
``PPOKIT_GENERIC=1`` in the environment at build time compiles every kernel in its
portable form only (no AVX-512/AVX2 clones, no AVX-512 paths).
"""

import glob
import os
import sys

from setuptools import Extension, setup

flags = [] if sys.platform == "win32" else ["-O3", "-fno-math-errno", "-Wno-psabi",
                                            "-fvisibility=hidden"]
if os.environ.get("PPOKIT_GENERIC") == "1":
    flags.append("-DPPOKIT_GENERIC")
sources = sorted(glob.glob("src/ppokit/kernels/*.c"))

setup(ext_modules=[Extension("ppokit.kernels._c", sources, depends=["src/ppokit/kernels/kernels.h"],
                             extra_compile_args=flags, optional=True)])
