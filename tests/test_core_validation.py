"""Every validation error of ppokit.core is raised at the boundary with a message that
names the argument and what was expected."""

import math

import numpy as np
import pytest
import torch

from ppokit import core

R = [0.0, 1.0, 0.5]
V = [0.1, 0.2, 0.3]
NV = [0.2, 0.3, 0.0]
Z = [0, 0, 1]


def test_mismatched_shapes_are_not_broadcast():
    with pytest.raises(ValueError, match=r"values: expected shape \(3,\).*got \(3, 1\)"):
        core.gae(R, np.array(V)[:, None], NV, Z, Z, 0.9, 0.9)
    with pytest.raises(ValueError, match=r"advantages: expected shape \(2, 5\).*got \(2, 1\)"):
        core.clipped_surrogate_loss(torch.zeros(2, 5), torch.zeros(2, 5), torch.zeros(2, 1))
    with pytest.raises(ValueError, match=r"mask.*expected shape \(2, 5\)"):
        core.token_gae(torch.zeros(2, 5), torch.zeros(2, 5), torch.ones(2, 1), 1.0, 1.0)
    with pytest.raises(ValueError, match=r"values: expected shape \(2, 5\)"):
        core.token_gae(torch.zeros(2, 5), torch.zeros(2, 4), torch.ones(2, 5), 1.0, 1.0)


def test_wrong_rank():
    with pytest.raises(ValueError, match=r"rewards: expected shape \[T\] or \[T, N\]"):
        core.gae(np.zeros((2, 2, 2)), np.zeros((2, 2, 2)), np.zeros((2, 2, 2)),
                 np.zeros((2, 2, 2)), np.zeros((2, 2, 2)), 0.9, 0.9)
    with pytest.raises(ValueError, match=r"rewards: expected shape \[B, L\]"):
        core.token_gae([1.0, 2.0], [1.0, 2.0], [1, 1], 1.0, 1.0)


def test_empty_input():
    with pytest.raises(ValueError, match="rewards: expected a non-empty tensor"):
        core.gae([], [], [], [], [], 0.9, 0.9)
    with pytest.raises(ValueError, match="logp: expected a non-empty tensor"):
        core.clipped_surrogate_loss(torch.zeros(0), torch.zeros(0), torch.zeros(0))


def test_non_binary_flags():
    with pytest.raises(ValueError, match=r"terminated: expected binary flags.*\[2\]"):
        core.gae(R, V, NV, [0, 0, 2], Z, 0.9, 0.9)
    with pytest.raises(ValueError, match="episode_end: expected binary flags"):
        core.gae(R, V, NV, Z, [0, 0.5, 1], 0.9, 0.9)
    with pytest.raises(ValueError, match="mask: expected binary flags"):
        core.token_gae(torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([[0, 3, 1]]), 1, 1)


def test_terminated_without_episode_end():
    with pytest.raises(ValueError, match=r"terminated: set at index \[1\] where episode_end "
                                         r"is not"):
        core.gae(R, V, NV, [0, 1, 0], [0, 0, 0], 0.9, 0.9)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_or_inf_inputs(bad):
    with pytest.raises(ValueError, match="rewards: expected finite values"):
        core.gae([0.0, bad], [0.0, 0.0], [0.0, 0.0], [0, 0], [0, 0], 0.9, 0.9)
    with pytest.raises(ValueError, match="values: expected finite values"):
        core.gae([0.0, 0.0], [bad, 0.0], [0.0, 0.0], [0, 0], [0, 0], 0.9, 0.9)
    with pytest.raises(ValueError, match="next_values: expected finite values"):
        core.gae([0.0, 0.0], [0.0, 0.0], [0.0, bad], [0, 0], [0, 0], 0.9, 0.9)
    with pytest.raises(ValueError, match="logp_old: expected finite values"):
        core.clipped_surrogate_loss(torch.zeros(2), torch.tensor([0.0, bad]), torch.zeros(2))
    with pytest.raises(ValueError, match="logp: expected finite values"):
        core.clipped_surrogate_loss(torch.tensor([bad, 0.0]), torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match="advantages: expected finite values"):
        core.vanilla_pg_loss(torch.zeros(2), torch.zeros(2), torch.tensor([bad, 0.0]))
    with pytest.raises(ValueError, match="rewards: expected finite values at action"):
        core.token_gae(torch.tensor([[bad, 0.0]]), torch.zeros(1, 2), torch.ones(1, 2), 1, 1)
    with pytest.raises(ValueError, match="logp: expected finite values"):
        core.kl_k3(torch.tensor([bad]), torch.zeros(1))


def test_nan_at_masked_positions_is_allowed():
    lp = torch.tensor([[0.0, math.nan]])
    m = torch.tensor([[True, False]])
    out = core.clipped_surrogate_loss(lp, torch.zeros(1, 2), torch.ones(1, 2), m)
    assert math.isfinite(float(out.loss))


@pytest.mark.parametrize("name,kwargs", [("gamma", dict(gamma=1.5, lam=0.9)),
                                         ("gamma", dict(gamma=-0.1, lam=0.9)),
                                         ("lam", dict(gamma=0.9, lam=1.01)),
                                         ("lam", dict(gamma=0.9, lam=math.nan))])
def test_gamma_lambda_range(name, kwargs):
    with pytest.raises(ValueError, match=rf"{name}: expected a number in \[0, 1\]"):
        core.gae(R, V, NV, Z, Z, **kwargs)
    with pytest.raises(ValueError, match=rf"{name}: expected a number in \[0, 1\]"):
        core.token_gae(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), **kwargs)


@pytest.mark.parametrize("eps", [0.0, -0.1, math.nan])
def test_clip_epsilon_must_be_positive(eps):
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="clip_eps: expected a finite number > 0"):
        core.clipped_surrogate_loss(x, x, x, clip_eps=eps)
    with pytest.raises(ValueError, match="clip_eps_high: expected a finite number > 0"):
        core.clipped_surrogate_loss(x, x, x, clip_eps_high=eps)
    with pytest.raises(ValueError, match="clip_range_vf: expected a finite number > 0"):
        core.value_loss(x, x, values_old=x, clip_range_vf=eps)


def test_dual_clip_must_exceed_one():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="dual_clip: expected a number > 1"):
        core.clipped_surrogate_loss(x, x, x, dual_clip=1.0)


def test_bad_types():
    with pytest.raises(ValueError, match="rewards: expected a tensor or array of numbers"):
        core.gae("abc", V, NV, Z, Z, 0.9, 0.9)


def test_every_public_core_function_documents_its_shapes():
    import inspect

    for name in core.__all__:
        obj = getattr(core, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            doc = inspect.getdoc(obj) or ""
            assert doc, f"{name} has no docstring"
            assert "[" in doc or "shape" in doc.lower(), f"{name}'s docstring gives no shapes"
