"""The extension built with every wider path compiled out (``PPOKIT_ISA=generic``: no
AVX-512/AVX2 clones, no AVX-512 code paths) passes the same reference tests as the build
this machine runs. The installed build (the dispatching one, where the compiler has
GCC's target clones) is what every other test already exercises."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ppokit import kernels

ROOT = Path(__file__).resolve().parents[1]
# every kernel's reference tests (kernels/__init__.py names them, one file per subject)
REFERENCE_TESTS = ["tests/test_native_step.py",
                   "tests/test_lstm_native.py", "tests/test_llm_kernels.py",
                   "tests/test_kernels_switches.py",
                   "tests/test_train_policies.py::test_numpy_sampler_matches_the_torch_policy"]


@pytest.mark.skipif(not kernels.available() or sys.platform == "win32"
                    or not (shutil.which("cc") or shutil.which("gcc")),
                    reason="needs the compiled kernels and a C compiler")
def test_the_generic_build_passes_every_kernels_reference_tests(tmp_path):
    env = {**os.environ, "PPOKIT_ISA": "generic"}
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "tmp")], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    built = list((tmp_path / "lib" / "ppokit" / "kernels").glob("_c.*"))
    assert len(built) == 1, build.stderr[-2000:]  # (optional=True would hide a failure)
    # a copy of the package with the generic extension in place of the installed one
    pkg = tmp_path / "src" / "ppokit"
    shutil.copytree(ROOT / "src" / "ppokit", pkg,
                    ignore=shutil.ignore_patterns("_c.*.so", "_c.*.pyd", "__pycache__"))
    shutil.copy(built[0], pkg / "kernels")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src"), "OMP_NUM_THREADS": "1",
           "PPOKIT_EXPECT_ISA": "generic"}
    env.pop("PPOKIT_NATIVE", None)
    env.pop("PPOKIT_NATIVE_OFF", None)
    probe = subprocess.run(
        [sys.executable, "-c", "import ppokit.kernels as k; print(k.__file__, "
         "k.build()['isa'], k.available())"],
        env=env, capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()
    assert probe == [str(pkg / "kernels" / "__init__.py"), "generic", "True"]
    assert kernels.build()["isa"] == "avx512"  # the installed one dispatches
    tests = [str(ROOT / t) for t in REFERENCE_TESTS]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          "-n", "0", "--rootdir", str(ROOT), *tests],
                         env=env, capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1], \
        run.stdout[-500:]
