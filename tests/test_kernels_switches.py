"""Turning the compiled kernels off one at a time (``PPOKIT_NATIVE_OFF``) and all at once
(``PPOKIT_NATIVE=0``): each caller takes its torch or NumPy path, with the same results."""

import os
import warnings

import gymnasium as gym
import pytest
import torch

from ppokit import kernels
from ppokit.engine import native
from ppokit.kernels import lstm as native_lstm
from ppokit.policies import NumpySampler, make_policy

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason=f"kernels unavailable: {kernels.why_not()}")


def test_each_kernel_turns_off_alone(monkeypatch):
    lstm = torch.nn.LSTM(3, 4, batch_first=True)
    x, h0 = torch.zeros(2, 5, 3), torch.zeros(1, 2, 4)
    assert native_lstm.supports(lstm, x, h0) is True
    monkeypatch.setenv("PPOKIT_NATIVE_OFF", "lstm,decoder")
    assert kernels.available() is True  # the extension as a whole is there
    assert kernels.available("lstm") is False and kernels.available("decoder") is False
    assert kernels.why_not("lstm") == "PPOKIT_NATIVE_OFF=lstm,decoder"
    for name in ("step", "actor"):
        assert kernels.available(name) is True, name
    assert native.available() is True
    assert native_lstm.supports(lstm, x, h0) is False
    assert kernels.has_decoder() is False


def test_the_results_do_not_change_when_a_kernel_is_off(monkeypatch):
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(3, 4, batch_first=True)
    x, h0 = torch.randn(2, 5, 3), torch.randn(1, 2, 4)
    c0 = torch.randn(1, 2, 4)
    fast = native_lstm.lstm(lstm, x, h0, c0)
    monkeypatch.setenv("PPOKIT_NATIVE_OFF", "lstm")
    assert native_lstm.supports(lstm, x, h0) is False  # the caller then runs the module
    torch.testing.assert_close(fast, lstm(x, (h0, c0))[0], rtol=1e-5, atol=1e-6)


def test_the_actor_and_the_step_follow_their_names(monkeypatch):
    pol = make_policy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3))
    assert NumpySampler(pol).native is True
    monkeypatch.setenv("PPOKIT_NATIVE_OFF", "actor")
    assert NumpySampler(pol).native is False
    with pytest.raises(ValueError, match="PPOKIT_NATIVE_OFF=actor"):
        NumpySampler(pol, native=True)
    monkeypatch.setenv("PPOKIT_NATIVE_OFF", "step")
    assert native.available() is False and native.why_not() == "PPOKIT_NATIVE_OFF=step"
    assert kernels.available("lstm") is True


def test_an_unknown_name_is_an_error_that_lists_the_names(monkeypatch):
    with pytest.raises(ValueError, match="unknown kernel 'gea'"):
        kernels.available("gea")
    monkeypatch.setenv("PPOKIT_NATIVE_OFF", "gea")
    with pytest.raises(ValueError, match="unknown kernel gea .*step, actor, lstm"):
        kernels.available("lstm")


@pytest.mark.parametrize("name", sorted(kernels.REMOVED))
def test_a_removed_kernel_is_named_once_with_a_warning_and_ignored(monkeypatch, name):
    """A script that turned off a kernel since removed keeps running (that kernel runs no
    more, as it asked), and is told once that the name can go; asking whether it is
    available is an error that says it was removed."""
    monkeypatch.setattr(kernels, "_WARNED", set())
    monkeypatch.setenv("PPOKIT_NATIVE_OFF", f"{name},lstm")
    with pytest.warns(FutureWarning, match=f"the {name} kernel was removed .*ignored"):
        assert kernels.available("lstm") is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once a process, not on every call
        assert kernels.available("step") is True
    with pytest.raises(ValueError, match=f"the {name} kernel was removed"):
        kernels.available(name)
    assert name not in kernels.KERNELS and not hasattr(kernels, f"{name}_last")


def test_build_says_how_the_extension_was_built():
    """(tests/test_kernels_generic.py runs this file on a generic build and says so)"""
    info = kernels.build()
    assert set(info) == {"isa", "avx512f", "avx512bf16"}
    assert isinstance(info["avx512f"], bool) and isinstance(info["avx512bf16"], bool)
    assert info["isa"] == os.environ.get("PPOKIT_EXPECT_ISA", "avx512")


def test_the_wide_kernels_run_only_where_the_cpu_has_avx512(monkeypatch):
    """Without AVX-512 the 16-float-vector kernels (step, actor, lstm, decoder) are slower
    than their torch paths, so they are off there and say why; the others stay on."""
    monkeypatch.delenv("PPOKIT_NATIVE_WIDE", raising=False)  # (conftest sets it)
    monkeypatch.setattr(kernels, "_WIDE_OK", None)
    monkeypatch.setattr(kernels, "build",
                        lambda: {"isa": "avx512", "avx512f": False, "avx512bf16": False})
    for name in kernels.WIDE:
        assert kernels.available(name) is False
        assert "needs AVX-512" in kernels.why_not(name)
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
