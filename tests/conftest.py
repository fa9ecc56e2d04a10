"""Shared test setup: one torch thread (deterministic, and fastest for small nets on CI's
2 cores), Python's own Ctrl-C handling, ppokit's every kernel on whatever the CPU, and a
hypothesis profile sized for the default suite."""

import os
import signal

import torch
from hypothesis import HealthCheck, settings

torch.set_num_threads(1)
# a suite started in the background (`make test &`, nohup) inherits SIGINT ignored; the
# signal tests check what ppokit restores, so they start from Python's default handler
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
os.environ.setdefault("MPLBACKEND", "Agg")
# the kernels written on 16-float vectors (ppokit.kernels.WIDE) are off by default on a CPU
# without AVX-512, where torch's path is faster; the suite holds their numerics to the
# references on every CPU, so it runs them anyway (their switch is tested by
# test_kernels_switches.py with this variable removed)
os.environ.setdefault("PPOKIT_NATIVE_WIDE", "1")

settings.register_profile(
    "default", max_examples=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
