"""Turning the compiled kernels off one at a time (``PPOKIT_NATIVE_OFF``) and all at once
(``PPOKIT_NATIVE=0``): each caller takes its torch or NumPy path, with the same results."""

import os

import gymnasium as gym
import numpy as np
import pytest
import torch

from ppokit import kernels
from ppokit.core import gae
from ppokit.engine import native
from ppokit.kernels import lstm as native_lstm
from ppokit.policies import NumpySampler, make_policy

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason=f"kernels unavailable: {kernels.why_not()}")


def _gae_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    r, v, nv = (torch.randn(7, 3, generator=g) for _ in range(3))
    end = torch.rand(7, 3, generator=g) < 0.3
    term = end & (torch.rand(7, 3, generator=g) < 0.5)
    return r, v, nv, term, end


def test_each_kernel_turns_off_alone(monkeypatch):
    lstm = torch.nn.LSTM(3, 4, batch_first=True)
    x, h0 = torch.zeros(2, 5, 3), torch.zeros(1, 2, 4)
    assert native_lstm.supports(lstm, x, h0) is True
    monkeypatch.setenv("PPOKIT_NATIVE_OFF", "gae,lstm")
    assert kernels.available() is True  # the extension as a whole is there
    assert kernels.available("gae") is False and kernels.available("lstm") is False
    assert kernels.why_not("gae") == "PPOKIT_NATIVE_OFF=gae,lstm"
    for name in ("step", "actor", "pixels", "decoder"):
        assert kernels.available(name) is True, name
    assert native.available() is True
    assert kernels.gae(*_gae_inputs(), 0.99, 0.95) is None
    assert kernels.reverse_scan(torch.ones(4), torch.ones(4)) is None
    assert native_lstm.supports(lstm, x, h0) is False


def test_the_results_do_not_change_when_a_kernel_is_off(monkeypatch):
    fast = gae(*_gae_inputs(1), 0.99, 0.95)
    monkeypatch.setenv("PPOKIT_NATIVE_OFF", "gae")
    slow = gae(*_gae_inputs(1), 0.99, 0.95)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_the_actor_and_the_step_follow_their_names(monkeypatch):
    pol = make_policy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3))
    assert NumpySampler(pol).native is True
    monkeypatch.setenv("PPOKIT_NATIVE_OFF", "actor")
    assert NumpySampler(pol).native is False
    with pytest.raises(ValueError, match="PPOKIT_NATIVE_OFF=actor"):
        NumpySampler(pol, native=True)
    monkeypatch.setenv("PPOKIT_NATIVE_OFF", "step")
    assert native.available() is False and native.why_not() == "PPOKIT_NATIVE_OFF=step"
    assert kernels.pixels_last(np.zeros((1, 4, 2, 2), np.uint8)) is not None


def test_an_unknown_name_is_an_error_that_lists_the_names(monkeypatch):
    with pytest.raises(ValueError, match="unknown kernel 'gea'"):
        kernels.available("gea")
    monkeypatch.setenv("PPOKIT_NATIVE_OFF", "gea")
    with pytest.raises(ValueError, match="unknown kernel gea .*step, actor, gae"):
        kernels.available("gae")


def test_build_says_how_the_extension_was_built():
    """(tests/test_kernels_generic.py runs this file on a generic build and says so)"""
    info = kernels.build()
    assert set(info) == {"isa", "avx512f", "avx512bf16"}
    assert isinstance(info["avx512f"], bool) and isinstance(info["avx512bf16"], bool)
    assert info["isa"] == os.environ.get("PPOKIT_EXPECT_ISA", "avx512")


def test_the_wide_kernels_run_only_where_the_cpu_has_avx512(monkeypatch):
    """Without AVX-512 the 16-float-vector kernels (step, actor, lstm, decoder) are slower
    than their torch paths, so they are off there and say why; the others stay on."""
    monkeypatch.setattr(kernels, "_WIDE_OK", None)
    monkeypatch.setattr(kernels, "build",
                        lambda: {"isa": "avx512", "avx512f": False, "avx512bf16": False})
    for name in kernels.WIDE:
        assert kernels.available(name) is False
        assert "needs AVX-512" in kernels.why_not(name)
    assert kernels.available("gae") is True and kernels.available("pixels") is True
    assert native.available() is False
    pol = make_policy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3))
    assert NumpySampler(pol).native is False
    monkeypatch.setenv("PPOKIT_NATIVE_WIDE", "1")
    assert all(kernels.available(name) for name in kernels.WIDE)
    monkeypatch.delenv("PPOKIT_NATIVE_WIDE")
    monkeypatch.setattr(kernels, "_WIDE_OK", None)  # an AVX2 build on an AVX-512 CPU
    monkeypatch.setattr(kernels, "build",
                        lambda: {"isa": "avx2", "avx512f": True, "avx512bf16": True})
    assert kernels.available("step") is False
    monkeypatch.setattr(kernels, "_WIDE_OK", None)  # the portable build the tests use
    monkeypatch.setattr(kernels, "build",
                        lambda: {"isa": "generic", "avx512f": False, "avx512bf16": False})
    assert kernels.available("step") is True
