"""The one compiled part of ppokit: ppokit.kernels._c (src/ppokit/kernels/_c.c), the native
minibatch step and the environment GAE's scan.

Everything else is in pyproject.toml. The extension is optional: where it does not build
(no C compiler, a compiler without GCC's vector extensions), ppokit installs without it
and the fused step runs its TorchScript kernel, the GAE its NumPy scan
(``ppokit.kernels.available()`` says why).
"""

import sys

from setuptools import Extension, setup

flags = [] if sys.platform == "win32" else ["-O3", "-fno-math-errno", "-Wno-psabi"]

setup(ext_modules=[Extension("ppokit.kernels._c", ["src/ppokit/kernels/_c.c"],
                             extra_compile_args=flags, optional=True)])
